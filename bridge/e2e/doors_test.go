package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

// The doors of issue 35: the attacks each test makes against the real
// binary over real HTTP (DNS rebinding, a forged proxy header, another
// role's token, a hostile value), and the one-line reason each refusal
// gives in its body and in the log.

// binary is a bridge process started from the built binary; its output
// (text logs) is kept.
type binary struct {
	cmd *exec.Cmd
	out *syncBuffer
}

// startBinary runs the bridge binary with args and the extra environment
// until the test ends (SIGTERM, then the exit is awaited).
func startBinary(t *testing.T, env []string, args ...string) *binary {
	t.Helper()
	b := &binary{out: &syncBuffer{}}
	b.cmd = exec.Command(bridgeBinary(t), args...)
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	b.cmd.Env = append(append(os.Environ(), "BRIDGE_LOG__FORMAT=text"), env...)
	require.NoError(t, b.cmd.Start())
	t.Cleanup(func() {
		b.stop(t)
		if t.Failed() {
			t.Logf("bridge %s:\n%s", strings.Join(args, " "), b.out.String())
		}
	})
	return b
}

func (b *binary) stop(t *testing.T) {
	if b.cmd.ProcessState != nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-done
		t.Errorf("bridge did not stop within 30s of SIGTERM")
	}
}

// waitHTTP waits until GET base+path answers 200.
func waitHTTP(t *testing.T, b *binary, base, path string) {
	t.Helper()
	require.Eventually(t, func() bool {
		if b.cmd.ProcessState != nil {
			t.Fatalf("the bridge exited: %s", b.out.String())
		}
		code, _ := httpStatus(t, base+path)
		return code == http.StatusOK
	}, 90*time.Second, 50*time.Millisecond, "%s%s never answered 200", base, path)
}

// call sends method u with Host host ("" for u's), the headers and body,
// and returns the status and the body (at most 64 KiB, or what arrived
// within ctx for a stream).
func call(t *testing.T, ctx context.Context, method, u, host string, header map[string]string, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b := make([]byte, 64<<10)
	n, _ := io.ReadAtLeast(resp.Body, b, 1)
	return resp.StatusCode, string(b[:n])
}

// detail returns the "detail" of a JSON error body.
func detail(t *testing.T, body string) string {
	t.Helper()
	var e struct{ Error, Detail string }
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.NotEmpty(t, e.Detail, body)
	require.NotContains(t, e.Detail, "\n", "one line")
	return e.Detail
}

// runConfig writes the bridge.yaml of e.config for the binary: http.listen
// at listen with httpExtra under http, and extra appended.
func runConfig(t *testing.T, e *env, name, listen, httpExtra, extra string) string {
	t.Helper()
	p := e.config(name, "")
	y, err := os.ReadFile(p)
	require.NoError(t, err)
	s := strings.Replace(string(y), `  listen: "127.0.0.1:0"`, fmt.Sprintf("  listen: %q\n%s", listen, httpExtra), 1)
	require.NoError(t, os.WriteFile(p, []byte(s+extra), 0o644))
	return p
}

// sourceState reads the console's overview (with the headers given) and
// returns source app's state and paused_by.
func sourceState(t *testing.T, base, host string, header map[string]string) (state string, pausedBy string) {
	t.Helper()
	code, body := call(t, t.Context(), "GET", base+"/console/api/overview", host, header, "")
	require.Equal(t, http.StatusOK, code, body)
	var o struct {
		Sources []struct {
			Name     string `json:"name"`
			State    string `json:"state"`
			Paused   bool   `json:"paused"`
			PausedBy string `json:"paused_by"`
		} `json:"sources"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &o))
	require.Len(t, o.Sources, 1)
	return o.Sources[0].State, o.Sources[0].PausedBy
}

// TestConsoleDNSRebinding attacks `bridge run`'s console on a loopback
// http.listen as a DNS-rebinding page does: its requests carry the
// attacker's name in Host (and, being same-origin for the browser, in
// Origin, with Sec-Fetch-Site: same-origin). The overview, the tail, the
// metrics and the pause button all refuse them with the reason, in the
// body and the log; the source is not paused. localhost, 127.0.0.1 and a
// name of http.allowed_hosts are served. A page of another site (Origin,
// Sec-Fetch-Site: cross-site) cannot press a button either, and a POST
// without Origin or Sec-Fetch-Site is refused with what to send.
func TestConsoleDNSRebinding(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY)`)
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := runConfig(t, e, "rebind", addr, "  allowed_hosts: [bridge.test]\n", "")
	b := startBinary(t, nil, "run", "-c", p)
	base := "http://" + addr
	waitHTTP(t, b, base, "/readyz")
	waitSlotActive(t, e, "slot_rebind")
	ctx := t.Context()

	evil := fmt.Sprintf("attacker.example:%d", port)
	rebound := map[string]string{"Origin": "http://" + evil, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}
	want := fmt.Sprintf(`Host %q is not a name of this server: a listener on loopback (%s) answers only to localhost, loopback addresses and the names in http.allowed_hosts (DNS rebinding protection)`, evil, addr)
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/console/api/overview", ""},
		{"POST", "/console/api/sources/app/pause", `{"reason":"rebound"}`},
		{"POST", "/console/api/sources/app/snapshot", `{}`},
		{"GET", "/console/api/v1/feed?sse=1&token=now", ""},
		{"GET", "/metrics", ""},
		{"GET", "/readyz", ""},
	} {
		code, body := call(t, ctx, tc.method, base+tc.path, evil, rebound, tc.body)
		require.Equal(t, http.StatusForbidden, code, "%s %s: %s", tc.method, tc.path, body)
		require.Equal(t, want, detail(t, body), tc.path)
	}
	require.Contains(t, b.out.String(), `msg="http request refused" reason="Host \"`+evil+`\" is not a name of this server`)

	for _, host := range []string{addr, fmt.Sprintf("localhost:%d", port), fmt.Sprintf("bridge.test:%d", port)} {
		state, _ := sourceState(t, base, host, nil)
		require.Equal(t, "streaming", state, "Host %s is served, and nothing was paused", host)
	}

	// Cross-site requests from a page elsewhere, to the right Host.
	pause := base + "/console/api/sources/app/pause"
	for _, tc := range []struct {
		header map[string]string
		want   string
	}{
		{map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, `cross-site request refused: Sec-Fetch-Site is "cross-site"; state-changing requests are accepted only from this server's own pages`},
		{map[string]string{"Origin": "https://evil.example"}, `cross-origin request refused: Origin "https://evil.example" is not this server (` + addr + `); state-changing requests are accepted only from its own pages`},
		{map[string]string{}, `request refused: a POST needs an Origin header naming this server (Origin: http://` + addr + `) or Sec-Fetch-Site: same-origin; browsers send them, other clients must set Origin`},
	} {
		tc.header["Content-Type"] = "application/json"
		code, body := call(t, ctx, "POST", pause, "", tc.header, `{"reason":"csrf"}`)
		require.Equal(t, http.StatusForbidden, code, body)
		require.Equal(t, tc.want, detail(t, body))
	}
	state, _ := sourceState(t, base, "", nil)
	require.Equal(t, "streaming", state)

	// The console's own page: Origin is this server.
	code, body := call(t, ctx, "POST", pause, "", map[string]string{"Origin": base, "Content-Type": "application/json"}, `{"reason":"ok"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"state":"paused"`)
	code, body = call(t, ctx, "POST", base+"/console/api/sources/app/resume", "", map[string]string{"Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"}, `{}`)
	require.Equal(t, http.StatusOK, code, body)
}

// TestServeDoors attacks `bridge serve` over real HTTP: a DNS-rebinding
// Host on a loopback serve.listen without authentication (refused with
// the reason, body and log), a request for a table outside serve.tables
// (the refusal lists none of them), a JWT caller changing
// serve.client_header to dodge max_per_client (it is counted by its sub),
// and `bridge validate` refusing serve.client_header trusted on a listener
// every client reaches.
func TestServeDoors(t *testing.T) {
	defer parallel(t)()
	natsURL, _ := cdcStream(t)

	t.Run("DNS rebinding and serve.tables", func(t *testing.T) {
		port := freePort(t)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cfg := serveYAML(t, natsURL, fmt.Sprintf("  listen: %q\n  tables: [public.orders, secret.payroll]\n", addr))
		b := startBinary(t, nil, "serve", "-c", cfg)
		base := "http://" + addr
		waitHTTP(t, b, base, "/readyz")

		evil := fmt.Sprintf("attacker.example:%d", port)
		for _, path := range []string{"/v1/feed?timeout=1ms", "/v1/feed?sse=1", "/v1/position", "/metrics"} {
			code, body := call(t, t.Context(), "GET", base+path, evil, nil, "")
			require.Equal(t, http.StatusForbidden, code, "%s: %s", path, body)
			require.Equal(t, fmt.Sprintf(`Host %q is not a name of this server: a listener on loopback (%s) answers only to localhost, loopback addresses and the names in serve.allowed_hosts (DNS rebinding protection)`, evil, addr), detail(t, body))
		}
		require.Contains(t, b.out.String(), `msg="http request refused" reason="Host \"`+evil+`\"`)
		code, body := call(t, t.Context(), "GET", base+"/v1/position", fmt.Sprintf("localhost:%d", port), nil, "")
		require.Equal(t, http.StatusOK, code, body)

		code, body = call(t, t.Context(), "GET", base+"/v1/feed?timeout=1ms&tables=public.items", "", nil, "")
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Equal(t, `tables: "public.items" is not served here (serve.tables)`, detail(t, body))
		require.NotContains(t, body, "payroll", "the served tables are not revealed")
	})

	t.Run("max_per_client by the token's subject", func(t *testing.T) {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		cfg := serveYAML(t, natsURL, fmt.Sprintf("  listen: %q\n  max_per_client: 1\n  client_header: X-Client-Id\n  auth: {hs256_secret: %q}\n", addr, testSecret))
		b := startBinary(t, nil, "serve", "-c", cfg)
		base := "http://" + addr
		waitHTTP(t, b, base, "/readyz")
		tok := func(sub string) string {
			return mint(t, testSecret, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()})
		}
		u1 := tok("u1")
		// u1 parks a long-poll, then comes back under other client ids.
		pctx, cancel := context.WithCancel(t.Context())
		parked := make(chan struct{})
		go func() {
			defer close(parked)
			req, _ := http.NewRequestWithContext(pctx, "GET", base+"/v1/feed?token=now&timeout=60s", nil)
			req.Header.Set("Authorization", "Bearer "+u1)
			req.Header.Set("X-Client-Id", "a")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		defer func() { cancel(); <-parked }()
		require.Eventually(t, func() bool { return counter(t, base, "bridge_feeds_requests_in_progress") == 1 }, 30*time.Second, 20*time.Millisecond)
		for _, id := range []string{"b", "c", ""} {
			code, body := call(t, t.Context(), "GET", base+"/v1/feed?token=now&timeout=1ms", "", map[string]string{"Authorization": "Bearer " + u1, "X-Client-Id": id}, "")
			require.Equal(t, http.StatusTooManyRequests, code, "X-Client-Id %q: %s", id, body)
		}
		code, body := call(t, t.Context(), "GET", base+"/v1/feed?token=now&timeout=1ms", "", map[string]string{"Authorization": "Bearer " + tok("u2"), "X-Client-Id": "a"}, "")
		require.Equal(t, http.StatusOK, code, "another subject is another client, whatever its header: %s", body)
	})

	t.Run("a proxy header every client can send", func(t *testing.T) {
		cfg := serveYAML(t, natsURL, "  listen: 0.0.0.0:8090\n  client_header: X-Auth-Request-User\n")
		out, err := exec.Command(bridgeBinary(t), "validate", "-c", cfg).CombinedOutput()
		require.Error(t, err, "%s", out)
		require.Contains(t, string(out), `serve.client_header: "X-Auth-Request-User" would be trusted from every client that reaches serve.listen "0.0.0.0:8090", and any of them can send it: listen on 127.0.0.1 behind the proxy on the same host (a sidecar), or require the proxy's certificate with serve.tls.client_ca_file (mutual TLS)`)
	})
}

// TestConsoleProxyHeader attacks the console of `bridge run` configured as
// the image and deploy/k8s run it (http.listen 0.0.0.0, allow_public)
// with serve.client_header set for a `bridge serve` behind a proxy: a
// client sending the header itself gets no overview, no tail and no
// button, and the body and the log say why. Behind a proxy on the same
// host (a loopback http.listen) the header is trusted, the proxy's scope
// header decides what its user may do, and the pause is recorded under
// the proxy's user.
func TestConsoleProxyHeader(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY)`)
	const serveSection = "serve:\n  client_header: X-Auth-Request-User\n  auth: {scope_header: X-Auth-Request-Scopes}\n"
	ctx := t.Context()

	port := freePort(t)
	p := runConfig(t, e, "proxypub", "127.0.0.1:0", "", serveSection)
	b := startBinary(t, []string{fmt.Sprintf("BRIDGE_HTTP__LISTEN=0.0.0.0:%d", port), "BRIDGE_HTTP__ALLOW_PUBLIC=true"}, "run", "-c", p)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP(t, b, base, "/readyz")
	waitSlotActive(t, e, "slot_proxypub")
	forged := map[string]string{"X-Auth-Request-User": "admin", "X-Auth-Request-Scopes": "bridge:control", "Origin": base, "Content-Type": "application/json"}
	want := fmt.Sprintf(`the web console is off: http.listen "0.0.0.0:%d" can be reached without the authenticating proxy, so anyone could send serve.client_header "X-Auth-Request-User"; listen on 127.0.0.1 behind a proxy on the same host, require the proxy's certificate with http.tls.client_ca_file, use JWTs (serve.auth), or set http.console: false to silence this`, port)
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/console/api/overview", ""},
		{"POST", "/console/api/sources/app/pause", `{"reason":"forged"}`},
		{"GET", "/console/api/v1/feed?sse=1&token=now", ""},
	} {
		code, body := call(t, ctx, tc.method, base+tc.path, "", forged, tc.body)
		require.Equal(t, http.StatusNotFound, code, "%s %s: %s", tc.method, tc.path, body)
		require.Equal(t, want, detail(t, body))
	}
	require.Contains(t, b.out.String(), `msg="`+strings.ReplaceAll(want, `"`, `\"`)+`"`)
	code, _ := httpStatus(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code, "allow_public opens /metrics, nothing else")
	require.False(t, e.ckpt("proxypub").Paused)
	b.stop(t)

	// A proxy on the same host: http.listen on loopback.
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p = runConfig(t, e, "proxyloop", addr, "", serveSection)
	b = startBinary(t, nil, "run", "-c", p)
	base = "http://" + addr
	waitHTTP(t, b, base, "/readyz")
	waitSlotActive(t, e, "slot_proxyloop")
	user := map[string]string{"X-Auth-Request-User": "alice", "Origin": base, "Content-Type": "application/json"}
	code, body := call(t, ctx, "GET", base+"/console/api/overview", "", user, "")
	require.Equal(t, http.StatusForbidden, code, body)
	require.Equal(t, `reading the console's overview needs bridge:status or bridge:control, which the proxy does not grant "alice" (header X-Auth-Request-Scopes)`, detail(t, body))
	user["X-Auth-Request-Scopes"] = "bridge:control"
	code, body = call(t, ctx, "POST", base+"/console/api/sources/app/pause", "", user, `{"reason":"maintenance","by":"mallory"}`)
	require.Equal(t, http.StatusOK, code, body)
	_, by := sourceState(t, base, "", user)
	require.True(t, strings.HasPrefix(by, `console, proxy user "alice"`), by)
	require.Contains(t, b.out.String(), `msg="console: action taken" action=pause source=app by="console, proxy user \"alice\""`)
}

// TestConsoleScopes attacks the console with other roles' tokens: a
// tenant's read token (tables claim, no scope) may follow its own tail but
// neither read the overview nor pause, resume or snapshot; a token with
// bridge:status reads the overview without buttons; one with
// bridge:control acts, and what it did is recorded under its sub, never
// the "by" it sends. The console's listener here is beyond loopback
// without TLS: a token in the URL (query_token) is refused there, with the
// reason, although serve.listen (loopback) accepts it.
func TestConsoleScopes(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant_id int)`)
	port := freePort(t)
	p := runConfig(t, e, "scopes", fmt.Sprintf("0.0.0.0:%d", port), "  allow_public: true\n",
		fmt.Sprintf("serve:\n  auth:\n    hs256_secret: %s\n    tables_claim: tables\n    query_token: true\n", testSecret))
	b := startBinary(t, nil, "run", "-c", p)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP(t, b, base, "/readyz")
	waitSlotActive(t, e, "slot_scopes")
	ctx := t.Context()
	token := func(sub string, extra jwt.MapClaims) map[string]string {
		c := jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}
		for k, v := range extra {
			c[k] = v
		}
		return map[string]string{"Authorization": "Bearer " + mint(t, testSecret, c), "Origin": base, "Content-Type": "application/json"}
	}
	tenant := token("tenant-1", jwt.MapClaims{"tables": []string{"public.orders"}})
	reader := token("viewer", jwt.MapClaims{"scope": "bridge:status"})
	ops := token("ops-alice", jwt.MapClaims{"scope": "openid bridge:control"})

	code, body := call(t, ctx, "GET", base+"/console/api/overview", "", tenant, "")
	require.Equal(t, http.StatusForbidden, code, body)
	require.Equal(t, `reading the console's overview needs bridge:status or bridge:control, which the token does not grant (claim "scope")`, detail(t, body))
	for _, a := range []string{"pause", "resume", "snapshot"} {
		for _, who := range []map[string]string{tenant, reader} {
			code, body = call(t, ctx, "POST", base+"/console/api/sources/app/"+a, "", who, `{"by":"ops-alice"}`)
			require.Equal(t, http.StatusForbidden, code, "%s: %s", a, body)
			require.Equal(t, `pausing, resuming and snapshotting sources needs bridge:control, which the token does not grant (claim "scope")`, detail(t, body))
		}
	}
	require.Contains(t, b.out.String(), `msg="console: request refused" reason="pausing, resuming and snapshotting sources needs bridge:control`)
	require.False(t, e.ckpt("scopes").Paused, "no read token paused the source")

	// The tenant follows its tail, with the token in the header.
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	code, body = call(t, tctx, "GET", base+"/console/api/v1/feed?sse=1&token=now", "", tenant, "")
	cancel()
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, ": feed")
	// Not in the URL: this listener is served without TLS.
	q := url.QueryEscape(strings.TrimPrefix(tenant["Authorization"], "Bearer "))
	code, body = call(t, ctx, "GET", base+"/console/api/v1/feed?sse=1&token=now&access_token="+q, "", nil, "")
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Equal(t, fmt.Sprintf(`a token in the access_token query parameter is not accepted on http.listen "0.0.0.0:%d", which is served without TLS: send it in the Authorization header`, port), detail(t, body))

	code, body = call(t, ctx, "GET", base+"/console/api/overview", "", reader, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"actions":false`, "no buttons for a status token")

	code, body = call(t, ctx, "POST", base+"/console/api/sources/app/pause", "", ops, `{"reason":"maintenance","by":"mallory"}`)
	require.Equal(t, http.StatusOK, code, body)
	state, by := sourceState(t, base, "", ops)
	require.Equal(t, "paused", state)
	require.True(t, strings.HasPrefix(by, `console, token sub "ops-alice"`), by)
	require.NotContains(t, by, "mallory")
	require.Contains(t, b.out.String(), `msg="console: action taken" action=pause source=app by="console, token sub \"ops-alice\""`)
	require.Contains(t, b.out.String(), `msg="source paused" source=app`)
	code, body = call(t, ctx, "POST", base+"/console/api/sources/app/resume", "", ops, `{}`)
	require.Equal(t, http.StatusOK, code, body)
}
