package httpguard

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serve sends a request through g to a handler answering 200 and returns
// the status and the refusal's detail.
func serve(g *Guard, method, host string, header map[string]string) (int, string) {
	r := httptest.NewRequest(method, "/console/api/overview", nil)
	r.Host = host
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	g.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })).ServeHTTP(w, r)
	var body struct{ Error, Detail string }
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	return w.Code, body.Detail
}

// TestHostOnLoopback: a loopback listener answers to localhost and
// loopback addresses with any port, and to the allow-list; a rebinding
// page's name, another IP address, or a name that only ends like an
// allowed one is refused with the reason.
func TestHostOnLoopback(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:8080", "localhost:8080", "[::1]:8080"} {
		g := New(Options{Listen: listen, Hosts: []string{"Bridge.Internal", ".corp.example"}, Key: "http.allowed_hosts", Log: slog.New(slog.DiscardHandler)})
		for _, host := range []string{"127.0.0.1:8080", "localhost:8080", "LOCALHOST", "localhost.:9", "[::1]:8080", "[::1]", "127.0.0.2:1",
			"bridge.internal:8080", "BRIDGE.INTERNAL", "corp.example", "ops.corp.example:443", ""} {
			code, detail := serve(g, "GET", host, nil)
			assert.Equal(t, http.StatusOK, code, "%s: Host %q: %s", listen, host, detail)
		}
		for _, host := range []string{"attacker.example:8080", "attacker.example", "10.0.0.5:8080", "[fe80::1]:8080",
			"localhost.attacker.example", "evilbridge.internal", "evilcorp.example", "127.0.0.1.nip.io:8080"} {
			code, detail := serve(g, "GET", host, nil)
			assert.Equal(t, http.StatusForbidden, code, "%s: Host %q", listen, host)
			assert.Contains(t, detail, "is not a name of this server", host)
			assert.Contains(t, detail, "http.allowed_hosts", host)
			assert.NotContains(t, detail, "\n")
		}
	}
	code, detail := serve(New(Options{Listen: "127.0.0.1:8080", Key: "http.allowed_hosts"}), "POST", "attacker.example:8080",
		map[string]string{"Origin": "http://attacker.example:8080", "Sec-Fetch-Site": "same-origin"})
	assert.Equal(t, http.StatusForbidden, code, "a rebinding page's POST: same-origin for the browser")
	assert.Equal(t, `Host "attacker.example:8080" is not a name of this server: a listener on loopback (127.0.0.1:8080) answers only to localhost, loopback addresses and the names in http.allowed_hosts (DNS rebinding protection)`, detail)
}

// TestHostBeyondLoopback: beyond loopback every Host passes unless an
// allow-list is set; then IP addresses and loopback names pass too.
func TestHostBeyondLoopback(t *testing.T) {
	open := New(Options{Listen: "0.0.0.0:8090", Key: "serve.allowed_hosts"})
	for _, host := range []string{"anything.example", "10.0.0.5:8090", "feeds.example.com"} {
		code, _ := serve(open, "GET", host, nil)
		assert.Equal(t, http.StatusOK, code, host)
	}
	g := New(Options{Listen: ":8090", Hosts: []string{"feeds.example.com"}, Key: "serve.allowed_hosts"})
	for _, host := range []string{"feeds.example.com:8090", "10.0.0.5:8090", "[2001:db8::1]:8090", "localhost:8090", "127.0.0.1"} {
		code, detail := serve(g, "GET", host, nil)
		assert.Equal(t, http.StatusOK, code, "%s: %s", host, detail)
	}
	code, detail := serve(g, "GET", "attacker.example", nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, `Host "attacker.example" is not a name of this server: this listener answers only to the names in serve.allowed_hosts (feeds.example.com), localhost and IP addresses (DNS rebinding protection)`, detail)
}

// TestStateChanging: a POST passes with Sec-Fetch-Site same-origin or
// none, or with an Origin equal to its Host; another site's, a null or
// foreign Origin, or neither header is refused, each with its reason.
// GET needs neither.
func TestStateChanging(t *testing.T) {
	g := New(Options{Listen: "127.0.0.1:8080", Key: "http.allowed_hosts"})
	const host = "127.0.0.1:8080"
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "same-origin"},
		{"Sec-Fetch-Site": "none"},
		{"Origin": "http://127.0.0.1:8080"},
		{"Origin": "https://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"},
	} {
		code, detail := serve(g, "POST", host, h)
		assert.Equal(t, http.StatusOK, code, "%v: %s", h, detail)
	}
	for _, tc := range []struct {
		h    map[string]string
		want string
	}{
		{map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, `cross-site request refused: Sec-Fetch-Site is "cross-site"`},
		{map[string]string{"Sec-Fetch-Site": "same-site"}, `Sec-Fetch-Site is "same-site"`},
		{map[string]string{"Origin": "https://evil.example"}, `cross-origin request refused: Origin "https://evil.example" is not this server (127.0.0.1:8080)`},
		{map[string]string{"Origin": "http://localhost:8080"}, `Origin "http://localhost:8080" is not this server`},
		{map[string]string{"Origin": "null"}, `Origin "null" is not this server`},
		{map[string]string{"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "cross-site"}, `Sec-Fetch-Site is "cross-site"`},
		{nil, "request refused: a POST needs an Origin header naming this server (Origin: http://127.0.0.1:8080) or Sec-Fetch-Site: same-origin"},
	} {
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
			code, detail := serve(g, m, host, tc.h)
			assert.Equal(t, http.StatusForbidden, code, "%s %v", m, tc.h)
			if m == "POST" {
				assert.Contains(t, detail, tc.want)
			}
		}
	}
	for _, m := range []string{"GET", "HEAD", "OPTIONS"} {
		code, _ := serve(g, m, host, map[string]string{"Sec-Fetch-Site": "cross-site"})
		assert.Equal(t, http.StatusOK, code, m)
	}
}

// TestRefusalsLogged: each refusal is logged in one line with its reason,
// up to a burst; the lines left out are counted in the next one logged.
func TestRefusalsLogged(t *testing.T) {
	var buf bytes.Buffer
	g := New(Options{Listen: "127.0.0.1:8080", Key: "http.allowed_hosts", Log: slog.New(slog.NewTextHandler(&buf, nil))})
	code, _ := serve(g, "GET", "attacker.example:8080", nil)
	require.Equal(t, http.StatusForbidden, code)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], `msg="http request refused" reason="Host \"attacker.example:8080\" is not a name of this server`)
	assert.Contains(t, lines[0], "path=/console/api/overview")

	l := limiter{burst: 2, every: time.Second}
	t0 := time.Unix(100, 0)
	ok1, _ := l.allow(t0)
	ok2, _ := l.allow(t0)
	ok3, _ := l.allow(t0)
	ok4, _ := l.allow(t0.Add(500 * time.Millisecond))
	ok5, left := l.allow(t0.Add(time.Second))
	assert.Equal(t, []bool{true, true, false, false, true}, []bool{ok1, ok2, ok3, ok4, ok5})
	assert.Equal(t, 2, left, "the two left out are counted")
}
