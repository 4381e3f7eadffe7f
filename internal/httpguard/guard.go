// Package httpguard keeps two kinds of browser-borne requests away from the
// bridge's HTTP listeners (http.listen of `bridge run`, serve.listen of
// `bridge serve`):
//
//   - DNS rebinding. A page on attacker.example whose name the attacker
//     re-points at 127.0.0.1 is, for the browser, same-origin with the
//     bridge: it reads the answers and sets any header. What it cannot
//     change is the Host header, which names attacker.example. So on a
//     loopback listener a request is served only when its Host is
//     localhost, a loopback address or a name of the configured
//     allow-list. Beyond loopback, the listener's authentication stands
//     against rebinding (a browser holds no token for it); an allow-list,
//     when configured, is enforced there too, IP addresses always
//     passing (a rebinding needs a name).
//   - Cross-site requests. A state-changing request (any method but GET,
//     HEAD, OPTIONS and TRACE) must show it comes from the server's own
//     pages: Sec-Fetch-Site same-origin (or none: typed by the user), or
//     an Origin equal to the request's Host. A request with neither is
//     refused: browsers send them, other clients must set Origin.
//
// A refusal is a 403 with a JSON body whose detail says why in one line,
// and a log line saying the same (at most a burst of them, then a count).
package httpguard

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bridgecdc/bridge/config"
)

// Options configure a Guard.
type Options struct {
	// Listen is the listener's address (host:port). On a loopback address
	// (127.0.0.0/8, ::1, localhost) a request's Host must name this
	// machine or one of Hosts.
	Listen string
	// Hosts are more names a request's Host may carry, with any port: a
	// name ("bridge.internal") or a domain and every name below it
	// (".example.com"). Beyond loopback, when set, a request's Host must be
	// one of them, a loopback name or an IP address; empty there accepts
	// every Host.
	Hosts []string
	// Key is the YAML key of Hosts, named in refusals
	// ("http.allowed_hosts").
	Key string
	// Log receives a line per refusal. Default slog.Default().
	Log *slog.Logger
}

// Guard checks requests before a listener's handler sees them. Build it
// with New.
type Guard struct {
	listen   string
	loopback bool
	hosts    []string // lower case, without a trailing dot
	key      string
	log      *slog.Logger
	limit    limiter
}

// New returns the guard of o.
func New(o Options) *Guard {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	g := &Guard{listen: o.Listen, loopback: config.IsLoopback(o.Listen), key: o.Key, log: o.Log,
		limit: limiter{burst: 10, every: 10 * time.Second}}
	for _, h := range o.Hosts {
		g.hosts = append(g.hosts, strings.TrimSuffix(strings.ToLower(h), "."))
	}
	return g
}

// Handler returns next behind the guard.
func (g *Guard) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if reason := g.Check(r); reason != "" {
			g.Refuse(w, r, reason)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Check returns why r is refused, in one line, or "" when it passes.
func (g *Guard) Check(r *http.Request) string {
	if reason := g.checkHost(r.Host); reason != "" {
		return reason
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return ""
	}
	return checkOrigin(r)
}

// checkHost returns why a request naming host is refused, or "".
func (g *Guard) checkHost(host string) string {
	if !g.loopback && len(g.hosts) == 0 {
		return ""
	}
	if host == "" {
		return "" // HTTP/1.0 without Host: not a browser
	}
	name := hostname(host)
	if name == "localhost" {
		return ""
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		if ip.IsLoopback() || !g.loopback {
			return ""
		}
	}
	for _, h := range g.hosts {
		if name == h || (strings.HasPrefix(h, ".") && (name == h[1:] || strings.HasSuffix(name, h))) {
			return ""
		}
	}
	if g.loopback {
		return fmt.Sprintf("Host %q is not a name of this server: a listener on loopback (%s) answers only to localhost, loopback addresses and the names in %s (DNS rebinding protection)", host, g.listen, g.key)
	}
	return fmt.Sprintf("Host %q is not a name of this server: this listener answers only to the names in %s (%s), localhost and IP addresses (DNS rebinding protection)", host, g.key, strings.Join(g.hosts, ", "))
}

// hostname returns the host of a Host header without its port and
// brackets, in lower case, without a trailing dot.
func hostname(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// checkOrigin returns why a state-changing request is refused, or "".
func checkOrigin(r *http.Request) string {
	site := r.Header.Get("Sec-Fetch-Site")
	origin := r.Header.Get("Origin")
	if site != "" && site != "same-origin" && site != "none" {
		return fmt.Sprintf("cross-site request refused: Sec-Fetch-Site is %q; state-changing requests are accepted only from this server's own pages", site)
	}
	if origin != "" {
		u, err := url.Parse(origin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Sprintf("cross-origin request refused: Origin %q is not this server (%s); state-changing requests are accepted only from its own pages", origin, r.Host)
		}
		return ""
	}
	if site != "" {
		return ""
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return fmt.Sprintf("request refused: a %s needs an Origin header naming this server (Origin: %s://%s) or Sec-Fetch-Site: same-origin; browsers send them, other clients must set Origin", r.Method, scheme, r.Host)
}

// Refuse answers r with 403 and reason, and logs it.
func (g *Guard) Refuse(w http.ResponseWriter, r *http.Request, reason string) {
	if ok, left := g.limit.allow(time.Now()); ok {
		args := []any{"reason", reason, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "listen", g.listen}
		if left > 0 {
			args = append(args, "refusals_not_logged", left)
		}
		g.log.Warn("http request refused", args...)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
	}{"forbidden", reason})
}

// limiter lets burst log lines through per every, and counts the others.
type limiter struct {
	burst int
	every time.Duration

	mu      sync.Mutex
	start   time.Time
	n, left int
}

// allow reports whether a line may be logged now, and how many were left
// out since the last one logged.
func (l *limiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= l.every {
		l.start, l.n = now, 0
	}
	if l.n >= l.burst {
		l.left++
		return false, 0
	}
	l.n++
	left := l.left
	l.left = 0
	return true, left
}
