package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/testpki"
)

// testSecret is the HS256 secret of the tests' serve.auth.
const testSecret = "e2e-hs256-secret-0123456789abcdef-0123"

// mint signs claims with HS256 and key.
func mint(t testing.TB, key string, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(key))
	require.NoError(t, err)
	return s
}

// noneToken is an unsigned token (alg none).
func noneToken(t testing.TB, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	return s
}

// startFeeds serves stream with `bridge serve`'s server configured by cs
// (a serve section written in code: zero keys take their defaults) on
// 127.0.0.1, and returns its base URL.
func startFeeds(t *testing.T, e *env, stream string, cs config.Serve) string {
	t.Helper()
	nc, err := nats.Connect(e.natsURL(), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fs, err := feeds.New(ctx, js, feeds.Config{Stream: stream})
	require.NoError(t, err)
	t.Cleanup(fs.Close)
	sc, _, err := serve.FromConfig(ctx, cs, testLogger(t))
	require.NoError(t, err)
	srv := serve.New(fs, sc, testLogger(t))
	hs := srv.HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String()
}

// bearerGet sends GET u with c and the bearer token ("" for none); the
// caller closes the body.
func bearerGet(t *testing.T, c *http.Client, u, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	return resp
}

// mustPosition returns GET /v1/position's token.
func mustPosition(t *testing.T, base, token string) string {
	t.Helper()
	resp := bearerGet(t, http.DefaultClient, base+"/v1/position", token)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var body struct{ Token string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body.Token
}

// getStatus returns the status and WWW-Authenticate of a GET with the given
// bearer token ("" for none).
func getStatus(t *testing.T, c *http.Client, u, token string) (int, string) {
	t.Helper()
	resp := bearerGet(t, c, u, token)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

// TestServeAuth runs Postgres → bridge → JetStream → `bridge serve` with
// JWT authentication: 401 with WWW-Authenticate without a valid token,
// 403 for a table or a claim not granted, the caller's rows only, /metrics
// behind the token beyond loopback, an SSE stream ended when its token
// expires, and RS256 keys fetched from a JWKS URL, a new key picked up
// when a token names it.
func TestServeAuth(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant_id int NOT NULL, status text)`,
		`CREATE TABLE secrets (id int PRIMARY KEY, tenant_id int NOT NULL)`,
		`ALTER TABLE orders REPLICA IDENTITY FULL`)
	e.start(e.config("auth", ""))
	waitSlotActive(t, e, "slot_auth")
	e.pg.ExecT(t, `INSERT INTO orders VALUES (1, 1, 'open'), (2, 2, 'open'), (3, 1, 'paid')`,
		`INSERT INTO secrets VALUES (1, 1)`)
	e.waitStored("CDC_auth", 4, time.Minute)

	cs := config.Serve{
		Listen: "0.0.0.0:8090", // beyond loopback: /metrics takes a token too (the test listens on 127.0.0.1)
		Auth: config.ServeAuth{HS256Secret: testSecret, TablesClaim: "tables",
			Where: map[string]any{"eq": []any{"tenant_id", "{{.claims.tenant_id}}"}}},
	}
	base := startFeeds(t, e, "CDC_auth", cs)
	tok := func(tenant any, exp time.Duration) string {
		return mint(t, testSecret, jwt.MapClaims{"sub": "u", "tenant_id": tenant, "tables": []string{"public.orders"}, "exp": time.Now().Add(exp).Unix()})
	}
	good := tok(1, time.Hour)
	c := http.DefaultClient

	for _, p := range []string{"/v1/feed", "/v1/position", "/metrics"} {
		code, www := getStatus(t, c, base+p, "")
		require.Equal(t, http.StatusUnauthorized, code, p)
		require.Equal(t, `Bearer realm="bridge serve"`, www, p)
		code, www = getStatus(t, c, base+p, tok(1, -time.Hour))
		require.Equal(t, http.StatusUnauthorized, code, p)
		require.Equal(t, `Bearer realm="bridge serve", error="invalid_token", error_description="the token has expired"`, www, p)
	}
	for _, p := range []string{"/livez", "/readyz"} {
		require.Eventually(t, func() bool { code, _ := getStatus(t, c, base+p, ""); return code == http.StatusOK }, 30*time.Second, 20*time.Millisecond, p)
	}
	code, _ := getStatus(t, c, base+"/metrics", good)
	require.Equal(t, http.StatusOK, code)

	from := url.Values{"token": {strings.Split(mustPosition(t, base, good), ".")[0] + ".0"}, "timeout": {"100ms"}}
	resp, body := get(t, base, from, http.Header{"Authorization": {"Bearer " + good}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
	var ids []float64
	for _, ch := range changesOf(t, body.Changes) {
		require.Equal(t, "public.orders", ch.Table)
		require.Equal(t, float64(1), ch.After["tenant_id"])
		ids = append(ids, ch.After["id"].(float64))
	}
	require.Equal(t, []float64{1, 3}, ids, "tenant 1's orders, nothing of tenant 2, no table outside the claim")

	q := url.Values{"tables": {"public.secrets"}, "token": from["token"]}
	resp, body = get(t, base, q, http.Header{"Authorization": {"Bearer " + good}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, "forbidden", body.Error)
	require.Equal(t, `tables: the token does not grant "public.secrets"`, body.Detail)
	resp, body = get(t, base, from, http.Header{"Authorization": {"Bearer " + tok(map[string]any{"or": []any{}}, time.Hour)}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, `claim "tenant_id" must be a string, number or boolean`, body.Detail)
	require.Equal(t, float64(2), authCounter(t, base, good, "bridge_feeds_requests_total", "mode", "longpoll", "outcome", "unauthorized"),
		"the two feed requests without a valid token counted")
	require.Equal(t, float64(2), authCounter(t, base, good, "bridge_feeds_requests_total", "mode", "longpoll", "outcome", "forbidden"))

	t.Run("SSE ends when the token expires", func(t *testing.T) {
		// The test's leeway is 0. The request must reach the server
		// before the token expires (exp counts whole seconds, so 4 to 5 s
		// here): a test running beside this one can hold it up for a
		// second or more.
		short := tok(1, 5*time.Second)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/feed?sse=1&token="+from["token"][0], nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+short)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		evs := readSSE(resp.Body, func(ev sseEvent) bool { return ev.event == "error" })
		require.NotEmpty(t, evs)
		last := evs[len(evs)-1]
		require.Equal(t, "error", last.event)
		require.Contains(t, last.data, `"reason":"expired"`)
		require.Equal(t, float64(1), authCounter(t, base, good, "bridge_feeds_sse_disconnects_total", "reason", "expired"))
	})

	t.Run("JWKS URL", func(t *testing.T) {
		k1, k2 := testpki.RSAKey(t), testpki.ECKey(t)
		var mu sync.Mutex
		set := testpki.JWKS(t, testpki.JWK{Kid: "k1", Alg: "RS256", Key: &k1.PublicKey})
		idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(set)
		}))
		defer idp.Close()
		jb := startFeeds(t, e, "CDC_auth", config.Serve{Auth: config.ServeAuth{JWKSURL: idp.URL + "/jwks.json", Audience: "feeds"}})
		sign := func(m jwt.SigningMethod, kid string, key any, aud string) string {
			tk := jwt.NewWithClaims(m, jwt.MapClaims{"aud": aud, "exp": time.Now().Add(time.Hour).Unix()})
			tk.Header["kid"] = kid
			s, err := tk.SignedString(key)
			require.NoError(t, err)
			return s
		}
		require.Eventually(t, func() bool {
			code, _ := getStatus(t, c, jb+"/v1/position", sign(jwt.SigningMethodRS256, "k1", k1, "feeds"))
			return code == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond, "an RS256 token of the published key")
		code, www := getStatus(t, c, jb+"/v1/position", sign(jwt.SigningMethodRS256, "k1", k1, "other"))
		require.Equal(t, http.StatusUnauthorized, code)
		require.Contains(t, www, "audience")
		// The identity provider adds a key; a token naming it makes the
		// server fetch the set again.
		mu.Lock()
		set = testpki.JWKS(t, testpki.JWK{Kid: "k1", Alg: "RS256", Key: &k1.PublicKey}, testpki.JWK{Kid: "k2", Alg: "ES256", Key: &k2.PublicKey})
		mu.Unlock()
		code, _ = getStatus(t, c, jb+"/v1/position", sign(jwt.SigningMethodES256, "k2", k2, "feeds"))
		require.Equal(t, http.StatusOK, code, "a new key is fetched when a token names it")
	})
}

// authCounter is counter for a /metrics that takes a bearer token.
func authCounter(t *testing.T, base, token, name string, kv ...string) float64 {
	t.Helper()
	resp := bearerGet(t, http.DefaultClient, base+"/metrics", token)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	labels := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	v, ok := metricValue(fams, name, labels)
	require.True(t, ok, "no sample %s%v", name, labels)
	return v
}

// TestServeSecretsNeverLogged runs `bridge serve` at debug level with an
// HS256 secret and http.token in bridge.yaml, takes good and bad tokens
// in headers and in the query, and refuses a short secret in `bridge
// validate`: no secret and no token reaches the log or the output.
func TestServeSecretsNeverLogged(t *testing.T) {
	defer parallel(t)()
	const (
		jwtSecret    = "jwtSecr3t-never-logged-0123456789abcdef"
		shortSecret  = "shortSecr3tQ"
		metricsToken = "metricsT0ken-never-logged-77"
	)
	natsURL, _ := cdcStream(t)

	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := serveYAML(t, natsURL, fmt.Sprintf("  listen: %q\n  auth: {hs256_secret: %q, query_token: true}\n", addr, jwtSecret))
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, append(b, fmt.Sprintf("\nhttp: {token: %q}\n", metricsToken)...), 0o600))

	good := mint(t, jwtSecret, jwt.MapClaims{"sub": "s", "exp": time.Now().Add(time.Hour).Unix()})
	bad := mint(t, strings.Repeat("w", 40), jwt.MapClaims{"sub": "s", "exp": time.Now().Add(time.Hour).Unix()})
	expired := mint(t, jwtSecret, jwt.MapClaims{"sub": "s", "exp": time.Now().Add(-time.Hour).Unix()})
	secrets := []string{jwtSecret, shortSecret, metricsToken, good, bad, expired}

	var logs, out syncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		cmd := cli.NewCommand(&out, &logs)
		cmd.SetArgs([]string{"serve", "-c", cfg, "--log-level", "debug"})
		done <- cmd.ExecuteContext(ctx)
	}()
	base := "http://" + addr
	require.Eventually(t, func() bool { code, _ := httpStatus(t, base+"/readyz"); return code == http.StatusOK }, time.Minute, 20*time.Millisecond)
	for _, tk := range []string{good, bad, expired} {
		getStatus(t, http.DefaultClient, base+"/v1/position", tk)
		getStatus(t, http.DefaultClient, base+"/v1/feed?timeout=1ms&access_token="+tk, "")
		getStatus(t, http.DefaultClient, base+"/v1/feed?timeout=1ms&where=bad&access_token="+tk, "")
	}
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, rawGet(t, addr, "/v1/feed", "Authorization: Bearer "+good+strings.Repeat("x", 1<<17)))
	cancel()
	require.NoError(t, <-done)

	short := serveYAML(t, natsURL, fmt.Sprintf("  auth: {hs256_secret: %q}\n", shortSecret))
	cmd := cli.NewCommand(&out, &logs)
	cmd.SetArgs([]string{"validate", "-c", short})
	require.Error(t, cmd.Execute())
	require.Contains(t, logs.String(), "serve.auth.hs256_secret: must be at least 32 bytes")

	all := logs.String() + out.String()
	require.Contains(t, all, "serving feeds", "the log was captured")
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("secret %q leaked: ...%s...", s, all[max(0, i-200):min(len(all), i+100)])
		}
	}
}
