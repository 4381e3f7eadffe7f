package config

import (
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Modes of serve.auth.mode.
const (
	AuthJWT   = "jwt"
	AuthProxy = "proxy"
	AuthNone  = "none"
)

var authModeValues = []string{AuthJWT, AuthProxy, AuthNone}

// minHS256Secret is the shortest HS256 secret accepted: RFC 7518 §3.2
// asks for a key at least as long as the hash output (256 bits).
const minHS256Secret = 32

// IsLoopback reports whether a listen address (host:port) accepts only
// connections from this machine: its host is a loopback IP or "localhost".
// An empty host (":8090") or 0.0.0.0 listens on every interface; any other
// name is taken as reachable from other machines.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Enabled reports whether t configures TLS (cert_file or key_file set).
func (t ServerTLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// EffectiveMode returns the authentication `bridge serve` applies: Mode
// when set, else jwt when a verification key is set, else proxy when
// client_header is set, else none.
func (s *Serve) EffectiveMode() string {
	a := &s.Auth
	switch {
	case a.Mode != "":
		return a.Mode
	case a.HS256Secret != "" || a.JWKSFile != "" || a.JWKSURL != "":
		return AuthJWT
	case s.ClientHeader != "":
		return AuthProxy
	}
	return AuthNone
}

// checkServerTLS adds the problems of the shape of a TLS section at p;
// whether the files load is checked by the runtime (Validate of
// bridge/serve and bridge/app), which reads them.
func checkServerTLS(add func(p, format string, args ...any), p string, t ServerTLS) {
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		add(p+".key_file", "must be set with cert_file: the private key of the certificate")
	case t.KeyFile != "" && t.CertFile == "":
		add(p+".cert_file", "must be set with key_file: the certificate of the private key")
	}
	if t.ClientCAFile != "" && !t.Enabled() {
		add(p+".client_ca_file", "needs cert_file and key_file: mutual TLS is served over TLS")
	}
}

// hostNameRE is a host name of allowed_hosts: dot-separated labels of
// letters, digits, '-' and '_', optionally led by a dot (a domain and the
// names below it).
var hostNameRE = regexp.MustCompile(`^\.?[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?$`)

// checkAllowedHosts adds the problems of an allowed_hosts list at p.
func checkAllowedHosts(add func(p, format string, args ...any), p string, hosts []string) {
	for i, h := range hosts {
		if _, err := netip.ParseAddr(h); err == nil {
			continue
		}
		if !hostNameRE.MatchString(h) || len(h) > 253 {
			add(indexPath(p, i), "must be a host name such as bridge.internal, .example.com for a domain and the names below it, or an IP address, without scheme, port or path; got %q", h)
		}
	}
}

// validate adds the problems of the http section.
func (h *HTTP) validate(add func(p, format string, args ...any)) {
	if h.Listen == "" {
		return // the server is off
	}
	if _, _, err := net.SplitHostPort(h.Listen); err != nil {
		add("http.listen", "must be host:port such as 127.0.0.1:8080, or \"\" to turn the server off, got %q", h.Listen)
		return
	}
	checkServerTLS(add, "http.tls", h.TLS)
	checkAllowedHosts(add, "http.allowed_hosts", h.AllowedHosts)
	if !IsLoopback(h.Listen) && h.Token == "" && h.TLS.ClientCAFile == "" && !h.AllowPublic {
		add("http.listen", "%q serves /metrics to every machine that can reach it: set http.token (a bearer token Prometheus sends) or http.tls.client_ca_file (mutual TLS), listen on 127.0.0.1, or set http.allow_public: true to serve it openly", h.Listen)
	}
}

// validateAuth adds the problems of serve.auth and of a listen address
// other than loopback without authentication.
func (s *Serve) validateAuth(add func(p, format string, args ...any)) {
	a := &s.Auth
	if a.Mode != "" {
		checkOneOf(add, "serve.auth.mode", a.Mode, authModeValues)
	}
	mode := s.EffectiveMode()
	keys := 0
	for _, k := range []struct{ key, val string }{{"hs256_secret", a.HS256Secret}, {"jwks_file", a.JWKSFile}, {"jwks_url", a.JWKSURL}} {
		if k.val == "" {
			continue
		}
		keys++
		if mode != AuthJWT {
			add("serve.auth."+k.key, "is used only with serve.auth.mode: jwt, got mode %q", mode)
		}
	}
	switch {
	case mode == AuthJWT && keys == 0:
		add("serve.auth.mode", "jwt needs a key to verify tokens: set serve.auth.hs256_secret, jwks_file or jwks_url")
	case keys > 1:
		add("serve.auth", "set one of hs256_secret, jwks_file and jwks_url, got %d", keys)
	}
	if a.HS256Secret != "" && len(a.HS256Secret) < minHS256Secret {
		// Never the value: it is a secret.
		add("serve.auth.hs256_secret", "must be at least %d bytes (256 bits) for HS256, got %d; generate one with `openssl rand -base64 48`", minHS256Secret, len(a.HS256Secret))
	}
	if a.JWKSURL != "" {
		u, err := url.Parse(a.JWKSURL)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
			add("serve.auth.jwks_url", "must be an https URL such as https://idp.example.com/.well-known/jwks.json, got %q", a.JWKSURL)
		case u.Scheme == "http" && !IsLoopback(hostPort(u)):
			add("serve.auth.jwks_url", "must be https: keys fetched over plain http could be replaced on the way (http is accepted only on loopback), got %q", a.JWKSURL)
		}
	}
	if a.Leeway < 0 || a.Leeway > maxLeeway {
		add("serve.auth.leeway", "must be between 0s and %s, got %s", maxLeeway, a.Leeway)
	}
	if mode == AuthProxy && s.ClientHeader == "" {
		add("serve.client_header", "must be set with serve.auth.mode: proxy: the header the authenticating proxy sets")
	}
	switch {
	case a.ScopeHeader == "":
	case mode != AuthProxy:
		add("serve.auth.scope_header", "needs serve.auth.mode: proxy (serve.client_header): with JWTs the scopes come from serve.auth.scope_claim")
	case !headerRE.MatchString(a.ScopeHeader):
		add("serve.auth.scope_header", "must be an HTTP header name such as X-Auth-Request-Groups, got %q", a.ScopeHeader)
	case strings.EqualFold(a.ScopeHeader, s.ClientHeader):
		add("serve.auth.scope_header", "must differ from serve.client_header (%q): one names the caller, the other its scopes", s.ClientHeader)
	}
	if mode != AuthJWT {
		if a.TablesClaim != "" {
			add("serve.auth.tables_claim", "needs JWT authentication (serve.auth.hs256_secret, jwks_file or jwks_url)")
		}
		if len(a.Where) > 0 {
			add("serve.auth.where", "needs JWT authentication (serve.auth.hs256_secret, jwks_file or jwks_url); use serve.where for a condition without claims")
		}
		if a.QueryToken {
			add("serve.auth.query_token", "needs JWT authentication (serve.auth.hs256_secret, jwks_file or jwks_url)")
		}
	}
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		return // reported by validate
	}
	loopback := IsLoopback(s.Listen)
	if a.QueryToken && !s.TLS.Enabled() && !loopback {
		add("serve.auth.query_token", "needs serve.tls, or serve.listen on loopback behind a TLS-terminating proxy: a token in the URL would cross the network in clear")
	}
	if mode == AuthProxy && s.ClientHeader != "" && !loopback && s.TLS.ClientCAFile == "" {
		add("serve.client_header", "%q would be trusted from every client that reaches serve.listen %q, and any of them can send it: listen on 127.0.0.1 behind the proxy on the same host (a sidecar), or require the proxy's certificate with serve.tls.client_ca_file (mutual TLS)", s.ClientHeader, s.Listen)
	}
	if mode == AuthNone && a.Mode == "" && !loopback {
		add("serve.listen", "%q can be reached from other machines and serve.auth is not set: anyone who reaches it reads every row. Set serve.auth.hs256_secret or jwks_url (JWT), serve.client_header behind an authenticating proxy, listen on 127.0.0.1, or set serve.auth.mode: none to serve without authentication", s.Listen)
	}
}

// maxLeeway bounds serve.auth.leeway: a larger skew would let expired
// tokens in for long.
const maxLeeway = 5 * time.Minute

// hostPort returns u's host with a port, for IsLoopback.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), "0")
}
