package serve

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/testpki"
)

const secret = "0123456789abcdef0123456789abcdef-test-secret"

// claims are a valid token's claims with extra ones added.
func claims(extra map[string]any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return c
}

func hs256(t *testing.T, key string, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(key))
	require.NoError(t, err)
	return s
}

func request(token, query string) *http.Request {
	r := httptest.NewRequest("GET", "/v1/feed?"+query, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func newAuth(t *testing.T, s config.Serve) *Auth {
	t.Helper()
	if s.Listen == "" {
		s.Listen = "127.0.0.1:8090"
	}
	if s.Auth.Leeway == 0 {
		s.Auth.Leeway = 30 * time.Second
	}
	a, err := NewAuth(t.Context(), s, nil)
	require.NoError(t, err)
	return a
}

// TestAuthHS256 checks the verification of HS256 tokens: signature, expiry
// and the other time claims with their leeway, issuer, audience, and that
// no other algorithm is accepted.
func TestAuthHS256(t *testing.T) {
	a := newAuth(t, config.Serve{Auth: config.ServeAuth{HS256Secret: secret, Issuer: "https://idp/", Audience: "bridge"}})
	good := map[string]any{"iss": "https://idp/", "aud": "bridge"}
	ok := func(extra map[string]any) jwt.MapClaims {
		m := map[string]any{}
		for k, v := range good {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return claims(m)
	}
	c, err := a.authenticate(request(hs256(t, secret, ok(nil)), ""), true)
	require.Nil(t, err)
	assert.Equal(t, "sub:alice", c.id)
	assert.WithinDuration(t, time.Now().Add(time.Hour+30*time.Second), c.until, 5*time.Second, "exp plus the leeway")

	c, err = a.authenticate(request(hs256(t, secret, ok(map[string]any{"exp": time.Now().Add(-10 * time.Second).Unix()})), ""), true)
	require.Nil(t, err, "expired within the leeway")
	require.NotNil(t, c)

	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, ok(nil)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, ok(nil)).SignedString([]byte(secret))
	valid := hs256(t, secret, ok(nil))
	tampered := valid[:strings.LastIndex(valid, ".")] + "." + strings.Repeat("A", 43)
	for _, tc := range []struct {
		name, token, want string
	}{
		{"no token", "", "no bearer token: send Authorization: Bearer <token>"},
		{"wrong secret", hs256(t, strings.Repeat("x", 40), ok(nil)), "the token's signature is invalid"},
		{"tampered signature", tampered, "the token's signature is invalid"},
		{"expired", hs256(t, secret, ok(map[string]any{"exp": time.Now().Add(-time.Minute).Unix()})), "the token has expired"},
		{"no expiry", hs256(t, secret, ok(map[string]any{"exp": nil})), "the token has no expiry (exp)"},
		{"not yet valid", hs256(t, secret, ok(map[string]any{"nbf": time.Now().Add(time.Minute).Unix()})), "the token is not valid yet (nbf)"},
		{"issued in the future", hs256(t, secret, ok(map[string]any{"iat": time.Now().Add(time.Minute).Unix()})), "the token was issued in the future (iat)"},
		{"other issuer", hs256(t, secret, ok(map[string]any{"iss": "https://evil/"})), "the token's issuer (iss) is not accepted"},
		{"other audience", hs256(t, secret, ok(map[string]any{"aud": []string{"other"}})), "the token's audience (aud) does not include this server"},
		{"alg none", none, `the token's algorithm "none" is not accepted (accepted: HS256)`},
		{"alg HS512", hs512, `the token's algorithm "HS512" is not accepted (accepted: HS256)`},
		{"garbage", "not.a.token", "the token is malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := a.authenticate(request(tc.token, ""), true)
			require.Nil(t, c)
			require.NotNil(t, err)
			assert.Equal(t, http.StatusUnauthorized, err.status)
			assert.Equal(t, tc.want, err.detail)
			w := httptest.NewRecorder()
			challenge(w, err)
			assert.Equal(t, http.StatusUnauthorized, w.Code)
			h := w.Header().Get("WWW-Authenticate")
			assert.True(t, strings.HasPrefix(h, `Bearer realm="bridge serve"`), h)
			if tc.token != "" {
				assert.Contains(t, h, `error="invalid_token"`)
			}
		})
	}

	t.Run("the Authorization header's form", func(t *testing.T) {
		r := request("", "")
		r.Header.Set("Authorization", "Basic dXNlcjpwdw==")
		_, err := a.authenticate(r, true)
		require.NotNil(t, err)
		assert.Equal(t, http.StatusUnauthorized, err.status)
		assert.Equal(t, `the Authorization header must be "Bearer <token>"`, err.detail)
		r.Header.Set("Authorization", "bearer "+valid) // the scheme is case-insensitive
		_, err = a.authenticate(r, true)
		require.Nil(t, err)
	})
	t.Run("access_token is refused unless query_token", func(t *testing.T) {
		_, err := a.authenticate(request("", "access_token="+valid), true)
		require.NotNil(t, err)
		assert.Equal(t, http.StatusUnauthorized, err.status)
		assert.Contains(t, err.detail, "access_token query parameter is not accepted here")

		q := newAuth(t, config.Serve{Auth: config.ServeAuth{HS256Secret: secret, QueryToken: true}})
		c, err := q.authenticate(request("", "access_token="+url.QueryEscape(hs256(t, secret, claims(nil)))), true)
		require.Nil(t, err)
		assert.Equal(t, "sub:alice", c.id)
		_, err = q.authenticate(request(valid, "access_token="+valid), true)
		require.NotNil(t, err)
		assert.Equal(t, http.StatusBadRequest, err.status, "a token in both places")
	})
}

// TestAuthJWKS verifies RS256 and ES256 tokens with a JWKS file, refuses
// HS256 tokens signed with the public key (algorithm confusion), and
// reloads the file.
func TestAuthJWKS(t *testing.T) {
	rsaKey, ecKey := testpki.RSAKey(t), testpki.ECKey(t)
	dir := t.TempDir()
	jwks := filepath.Join(dir, "jwks.json")
	require.NoError(t, os.WriteFile(jwks, testpki.JWKS(t,
		testpki.JWK{Kid: "r1", Alg: "RS256", Key: &rsaKey.PublicKey},
		testpki.JWK{Kid: "e1", Alg: "ES256", Key: &ecKey.PublicKey}), 0o600))
	a := newAuth(t, config.Serve{Auth: config.ServeAuth{JWKSFile: jwks}})

	sign := func(m jwt.SigningMethod, kid string, key any) string {
		tok := jwt.NewWithClaims(m, claims(nil))
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(key)
		require.NoError(t, err)
		return s
	}
	for name, tok := range map[string]string{
		"RS256":          sign(jwt.SigningMethodRS256, "r1", rsaKey),
		"ES256":          sign(jwt.SigningMethodES256, "e1", ecKey),
		"ES256 (no kid)": sign(jwt.SigningMethodES256, "", ecKey),
	} {
		_, err := a.authenticate(request(tok, ""), true)
		assert.Nil(t, err, name)
	}
	other := testpki.RSAKey(t)
	pubDER := testpki.JWKS(t, testpki.JWK{Kid: "r1", Alg: "RS256", Key: &rsaKey.PublicKey})
	for name, tok := range map[string]string{
		"another key, same kid":        sign(jwt.SigningMethodRS256, "r1", other),
		"unknown kid":                  sign(jwt.SigningMethodRS256, "r9", rsaKey),
		"HS256 keyed with the JWKS":    sign(jwt.SigningMethodHS256, "r1", pubDER),
		"RS256 under the ES256 kid":    sign(jwt.SigningMethodRS256, "e1", rsaKey),
		"ES256 signed by another key":  sign(jwt.SigningMethodES256, "e1", testpki.ECKey(t)),
		"HS256 with the shared secret": hs256(t, secret, claims(nil)),
	} {
		c, err := a.authenticate(request(tok, ""), true)
		assert.Nil(t, c, name)
		if assert.NotNil(t, err, name) {
			assert.Equal(t, http.StatusUnauthorized, err.status, name)
		}
	}

	// A rotation: the file now holds only a new key.
	next := testpki.RSAKey(t)
	require.NoError(t, os.WriteFile(jwks, testpki.JWKS(t, testpki.JWK{Kid: "r2", Alg: "RS256", Key: &next.PublicKey}), 0o600))
	a.reloadJWKS()
	_, err := a.authenticate(request(sign(jwt.SigningMethodRS256, "r2", next), ""), true)
	assert.Nil(t, err, "the new key verifies after the reload")
	_, err = a.authenticate(request(sign(jwt.SigningMethodRS256, "r1", rsaKey), ""), true)
	assert.NotNil(t, err, "the retired key no longer does")
	// A broken file keeps the keys.
	require.NoError(t, os.WriteFile(jwks, []byte("{"), 0o600))
	a.reloadJWKS()
	_, err = a.authenticate(request(sign(jwt.SigningMethodRS256, "r2", next), ""), true)
	assert.Nil(t, err, "a file that does not load keeps the previous keys")

	t.Run("a bad file at start", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.json")
		require.NoError(t, os.WriteFile(bad, []byte(`{"keys": []}`), 0o600))
		_, err := NewAuth(t.Context(), config.Serve{Listen: "127.0.0.1:1", Auth: config.ServeAuth{JWKSFile: bad}}, nil)
		require.EqualError(t, err, "serve.auth.jwks_file: "+bad+` holds no JSON Web Key Set (want {"keys": [...]} with at least one key)`)
		_, err = NewAuth(t.Context(), config.Serve{Listen: "127.0.0.1:1", Auth: config.ServeAuth{JWKSFile: filepath.Join(dir, "none.json")}}, nil)
		require.ErrorContains(t, err, "serve.auth.jwks_file: open "+filepath.Join(dir, "none.json")+": no such file or directory")
	})
}

// TestAuthProxy checks proxy mode: the client header is required and
// names the client.
func TestAuthProxy(t *testing.T) {
	a := newAuth(t, config.Serve{ClientHeader: "X-User"})
	_, err := a.authenticate(request("", ""), true)
	require.NotNil(t, err)
	assert.Equal(t, http.StatusUnauthorized, err.status)
	assert.Equal(t, "no X-User header: requests must come through the authenticating proxy", err.detail)
	r := request("", "")
	r.Header.Set("X-User", "bob")
	c, err := a.authenticate(r, true)
	require.Nil(t, err)
	assert.Equal(t, "bob", c.id)

	none := newAuth(t, config.Serve{})
	assert.Nil(t, none, "no authentication configured")
}

// TestAuthTablesClaim reads the tables a token grants.
func TestAuthTablesClaim(t *testing.T) {
	a := newAuth(t, config.Serve{Auth: config.ServeAuth{HS256Secret: secret, TablesClaim: "tables"}})
	for name, tc := range map[string]struct {
		claim  any
		want   []string
		status int
		detail string
	}{
		"a list":         {claim: []any{"public.orders", "public.items"}, want: []string{"public.orders", "public.items"}},
		"a string":       {claim: "public.orders public.items,shop.x", want: []string{"public.orders", "public.items", "shop.x"}},
		"missing":        {claim: nil, status: 403, detail: `the token has no "tables" claim: it grants no table`},
		"empty list":     {claim: []any{}, status: 403, detail: `claim "tables" is empty: the token grants no table`},
		"empty string":   {claim: " ", status: 403, detail: `claim "tables" is empty: the token grants no table`},
		"not strings":    {claim: []any{1, 2}, status: 403, detail: `claim "tables" must list schema.table names as strings`},
		"an object":      {claim: map[string]any{"public.orders": true}, status: 403, detail: `claim "tables" must be a list of schema.table names`},
		"a number, even": {claim: 7, status: 403, detail: `claim "tables" must be a list of schema.table names`},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := a.authenticate(request(hs256(t, secret, claims(map[string]any{"tables": tc.claim})), ""), true)
			if tc.status != 0 {
				require.Nil(t, c)
				require.NotNil(t, err)
				assert.Equal(t, tc.status, err.status)
				assert.Equal(t, tc.detail, err.detail)
				return
			}
			require.Nil(t, err)
			assert.Equal(t, tc.want, c.tables)
		})
	}
	c, err := a.authenticate(request(hs256(t, secret, claims(nil)), ""), false)
	require.Nil(t, err, "without grants (metrics) a valid token is enough")
	assert.Nil(t, c.tables)
}

// TestWhereTemplateHostileClaims renders serve.auth.where with claim
// values crafted to change the condition: each stays one value, or the
// token is refused; none widens what the caller reads.
func TestWhereTemplateHostileClaims(t *testing.T) {
	w, err := parseWhereTemplate(map[string]any{"and": []any{
		map[string]any{"eq": []any{"tenant_id", "{{.claims.tenant_id}}"}},
		map[string]any{"in": []any{"region", []any{"{{ .claims.org.regions }}", "global"}}},
		map[string]any{"ne": []any{"label", "t-{{.claims.tenant_id}}"}},
		map[string]any{"eq": []any{"team", `{{index .claims "https://example.com/team"}}`}},
	}})
	require.NoError(t, err)
	base := map[string]any{"tenant_id": json.Number("7"), "org": map[string]any{"regions": []any{"eu", "us"}}, "https://example.com/team": "red"}
	render := func(over map[string]any) (string, *authError) {
		m := jwt.MapClaims{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range over {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		c, aerr := w.render(m)
		if aerr != nil {
			return "", aerr
		}
		b, err := json.Marshal(c)
		require.NoError(t, err)
		return string(b), nil
	}
	got, aerr := render(nil)
	require.Nil(t, aerr)
	assert.JSONEq(t, `{"and":[{"eq":["tenant_id",7]},{"in":["region",["eu","us","global"]]},{"ne":["label","t-7"]},{"eq":["team","red"]}]}`, got,
		"a number claim stays a number; an array claim fills in; text templates render to a string")

	injections := []string{
		`7"]}, {"or": [{"notnull": "tenant_id"}]}, {"eq": ["x", "`,
		`7}}{{.claims.other}}`,
		`{"or":[{"notnull":"tenant_id"}]}`,
		"7\x00", `\u0022`, "' OR 1=1 --",
	}
	for _, inj := range injections {
		got, aerr := render(map[string]any{"tenant_id": inj})
		require.Nil(t, aerr, inj)
		var c feeds.Cond
		require.NoError(t, json.Unmarshal([]byte(got), &c), got)
		require.Len(t, c.Subs, 4, "the structure is the template's: %s", got)
		assert.Equal(t, feeds.Eq("tenant_id", inj), c.Subs[0], "the claim is one string value, compared whole")
		assert.Equal(t, feeds.Ne("label", "t-"+inj), c.Subs[2])
	}
	for name, tc := range map[string]struct {
		over   map[string]any
		detail string
	}{
		"an object":                {map[string]any{"tenant_id": map[string]any{"or": []any{map[string]any{"notnull": "tenant_id"}}}}, `claim "tenant_id" must be a string, number or boolean`},
		"a list where one value":   {map[string]any{"tenant_id": []any{json.Number("7"), json.Number("8")}}, `claim "tenant_id" must be a single value for eq, got a list`},
		"missing":                  {map[string]any{"tenant_id": nil}, `the token has no "tenant_id" claim, which serve.auth.where uses`},
		"null":                     {map[string]any{"tenant_id": "x", "org": map[string]any{"regions": nil}}, `the token has no "org.regions" claim, which serve.auth.where uses`},
		"an empty list":            {map[string]any{"org": map[string]any{"regions": []any{}}}, `claim "org.regions" is an empty list: it grants no rows`},
		"a list of objects":        {map[string]any{"org": map[string]any{"regions": []any{map[string]any{"a": 1}}}}, `claim "org.regions" must list values (strings, numbers, booleans)`},
		"a nested path not an obj": {map[string]any{"org": "acme"}, `the token has no "org.regions" claim, which serve.auth.where uses`},
	} {
		_, aerr := render(tc.over)
		if assert.NotNil(t, aerr, name) {
			assert.Equal(t, http.StatusForbidden, aerr.status, name)
			assert.Equal(t, tc.detail, aerr.detail, name)
		}
	}
	_, aerr = render(map[string]any{"https://example.com/team": nil})
	require.NotNil(t, aerr)
	assert.Equal(t, `the token has no "https://example.com/team" claim, which serve.auth.where uses`, aerr.detail)
}

// TestWhereTemplateConfig reports bad templates at their YAML path: a
// claim can only ever be a value.
func TestWhereTemplateConfig(t *testing.T) {
	for _, tc := range []struct {
		where map[string]any
		want  string
	}{
		{map[string]any{"eq": []any{"{{.claims.col}}", 1}}, `serve.auth.where.eq[0]: "{{.claims.col}}": a column cannot come from a claim; only values can`},
		{map[string]any{"and": []any{map[string]any{"eq": []any{"a", 1}}, map[string]any{"null": "{{.claims.c}}"}}}, `serve.auth.where.and[1].null: "{{.claims.c}}": a column cannot come from a claim; only values can`},
		{map[string]any{"not": map[string]any{"in": []any{"a", []any{1, "{{.claims.x"}}}}, `serve.auth.where.not.in[1][1]: template: serve.auth.where.not.in[1][1]:1: unclosed action`},
		{map[string]any{"eq": []any{"a"}}, `serve.auth.where.eq: want ["column", value]`},
		{map[string]any{"or": "x"}, `serve.auth.where.or: want a non-empty array of conditions`},
	} {
		_, err := parseWhereTemplate(tc.where)
		assert.EqualError(t, err, tc.want)
	}
	w, err := parseWhereTemplate(nil)
	require.NoError(t, err)
	assert.Nil(t, w)
}

// TestJSONDepth measures nesting without recursing, strings skipped.
func TestJSONDepth(t *testing.T) {
	deep := strings.Repeat(`{"not":`, 10000) + `{"null":"a"}` + strings.Repeat("}", 10000)
	assert.Equal(t, 34, jsonDepth(deep, 33), "stops once past the limit")
	assert.Equal(t, 3, jsonDepth(`{"in":["a",[1,2]]}`, 100))
	assert.Equal(t, 2, jsonDepth(`{"eq":["a","[[[{{{\"]]]"]}`, 100), "brackets in strings do not count")
	c, err := feeds.ParseCond([]byte(`{"and":[{"eq":["a",1]},{"or":[{"not":{"null":"b"}},{"eq":["c",2]}]}]}`))
	require.NoError(t, err)
	assert.Equal(t, 4, condDepth(&c))
}

// TestAuthOnListener: the proxy's header is trusted only on a listener
// only the proxy reaches (loopback; mutual TLS with a verified client
// certificate), and a token in the URL only over TLS or on loopback, each
// judged on the listener the Auth is used on (the console's http.listen),
// not on serve.listen.
func TestAuthOnListener(t *testing.T) {
	proxy := newAuth(t, config.Serve{ClientHeader: "X-User"}) // serve.listen 127.0.0.1:8090
	forged := request("", "")
	forged.Header.Set("X-User", "admin")
	forged.RemoteAddr = "203.0.113.9:4444"
	_, err := proxy.authenticate(forged, true)
	require.Nil(t, err, "on loopback the proxy is on the same host")

	public := proxy.On(Listener{Key: "http.listen", Addr: "0.0.0.0:8080"})
	c, err := public.authenticate(forged, false)
	require.Nil(t, c)
	require.NotNil(t, err)
	assert.Equal(t, http.StatusForbidden, err.status)
	assert.Equal(t, `the X-User header is not trusted on http.listen "0.0.0.0:8080": every client that reaches it could send it; the proxy must reach the bridge on loopback or with a client certificate (mutual TLS)`, err.detail)
	assert.False(t, Listener{Addr: ":8080", TLS: true}.ProxyTrusted(), "TLS alone authenticates no proxy")

	mtls := proxy.On(Listener{Key: "http.listen", Addr: "0.0.0.0:8080", TLS: true, MutualTLS: true})
	_, err = mtls.authenticate(forged, false)
	require.NotNil(t, err, "no client certificate on this connection")
	withCert := forged.Clone(t.Context())
	withCert.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}
	c, err = mtls.authenticate(withCert, false)
	require.Nil(t, err)
	assert.Equal(t, "admin", c.name)

	q := newAuth(t, config.Serve{Auth: config.ServeAuth{HS256Secret: secret, QueryToken: true}})
	inURL := request("", "access_token="+url.QueryEscape(hs256(t, secret, claims(nil))))
	_, err = q.authenticate(inURL, true)
	require.Nil(t, err, "serve.listen on loopback")
	_, err = q.On(Listener{Key: "http.listen", Addr: "0.0.0.0:8080", TLS: true}).authenticate(inURL, true)
	require.Nil(t, err, "over TLS")
	_, err = q.On(Listener{Key: "http.listen", Addr: "0.0.0.0:8080"}).authenticate(inURL, true)
	require.NotNil(t, err)
	assert.Equal(t, `a token in the access_token query parameter is not accepted on http.listen "0.0.0.0:8080", which is served without TLS: send it in the Authorization header`, err.detail)
	assert.Nil(t, (*Auth)(nil).On(Listener{}))
}

// TestPermit: the console's overview needs bridge:status or
// bridge:control, its buttons bridge:control and a sub; scopes come from
// the scope claim (a string or a list) or the proxy's scope header, and
// the caller is named by its sub or the proxy's user.
func TestPermit(t *testing.T) {
	a := newAuth(t, config.Serve{Auth: config.ServeAuth{HS256Secret: secret}})
	permit := func(a *Auth, r *http.Request, scope string) (string, string) {
		who, err := a.Permit(r, scope)
		if err != nil {
			return who, err.Error()
		}
		return who, ""
	}
	tok := func(extra map[string]any) *http.Request { return request(hs256(t, secret, claims(extra)), "") }

	for name, tc := range map[string]struct {
		extra           map[string]any
		status, control string // "" allowed, else the refusal
	}{
		"a tenant's read token": {nil,
			`reading the console's overview needs bridge:status or bridge:control, which the token does not grant (claim "scope")`,
			`pausing, resuming and snapshotting sources needs bridge:control, which the token does not grant (claim "scope")`},
		"status":               {map[string]any{"scope": "feeds bridge:status"}, "", `pausing, resuming and snapshotting sources needs bridge:control, which the token does not grant (claim "scope")`},
		"control":              {map[string]any{"scope": "bridge:control"}, "", ""},
		"control as a list":    {map[string]any{"scope": []any{"x", "bridge:control"}}, "", ""},
		"control without sub":  {map[string]any{"scope": "bridge:control", "sub": nil}, "", "the token has no sub claim: the console records who pauses, resumes and snapshots by it"},
		"a lookalike scope":    {map[string]any{"scope": "bridge:control-x bridge:statusx"}, `reading the console's overview needs bridge:status or bridge:control, which the token does not grant (claim "scope")`, `pausing, resuming and snapshotting sources needs bridge:control, which the token does not grant (claim "scope")`},
		"another claim's name": {map[string]any{"scp": "bridge:control"}, `reading the console's overview needs bridge:status or bridge:control, which the token does not grant (claim "scope")`, `pausing, resuming and snapshotting sources needs bridge:control, which the token does not grant (claim "scope")`},
	} {
		t.Run(name, func(t *testing.T) {
			_, got := permit(a, tok(tc.extra), ScopeStatus)
			assert.Equal(t, tc.status, got, "status")
			who, got := permit(a, tok(tc.extra), ScopeControl)
			assert.Equal(t, tc.control, got, "control")
			if got == "" {
				assert.Equal(t, "alice", who)
			}
		})
	}
	scp := newAuth(t, config.Serve{Auth: config.ServeAuth{HS256Secret: secret, ScopeClaim: "roles"}})
	_, got := permit(scp, tok(map[string]any{"roles": []any{"bridge:control"}}), ScopeControl)
	assert.Empty(t, got, "serve.auth.scope_claim")

	// Through Protect, which keeps the caller for Permit.
	var who string
	var perr error
	h := a.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { who, perr = a.Permit(r, ScopeControl) }))
	h.ServeHTTP(httptest.NewRecorder(), tok(map[string]any{"scope": "bridge:control", "sub": "ops-7"}))
	require.NoError(t, perr)
	assert.Equal(t, "ops-7", who)

	proxy := newAuth(t, config.Serve{ClientHeader: "X-User", Auth: config.ServeAuth{ScopeHeader: "X-Scopes"}})
	r := request("", "")
	r.Header.Set("X-User", "bob")
	_, got = permit(proxy, r, ScopeStatus)
	assert.Equal(t, `reading the console's overview needs bridge:status or bridge:control, which the proxy does not grant "bob" (header X-Scopes)`, got)
	r.Header.Set("X-Scopes", "readers,bridge:control")
	who, got = permit(proxy, r, ScopeControl)
	assert.Empty(t, got)
	assert.Equal(t, "bob", who)
	bare := newAuth(t, config.Serve{ClientHeader: "X-User"})
	_, got = permit(bare, r, ScopeStatus)
	assert.Equal(t, "reading the console's overview needs bridge:status or bridge:control, and the proxy passes no scopes: set serve.auth.scope_header to the header in which it sends the caller's scopes", got)

	who, err := (*Auth)(nil).Permit(r, ScopeControl)
	assert.NoError(t, err)
	assert.Empty(t, who)
}

// TestClientKey: max_per_client counts a JWT's caller by its sub (or its
// token), whatever client header it sends; the proxy's user; the header
// without authentication; else the remote IP.
func TestClientKey(t *testing.T) {
	a := newAuth(t, config.Serve{ClientHeader: "X-Client-Id", Auth: config.ServeAuth{HS256Secret: secret}})
	key := func(tok, header string) string {
		r := request(tok, "")
		r.RemoteAddr = "192.0.2.7:5555"
		if header != "" {
			r.Header.Set("X-Client-Id", header)
		}
		var c *caller
		if tok != "" {
			var err *authError
			c, err = a.authenticate(r, true)
			require.Nil(t, err)
		}
		return clientKey(r, c, "X-Client-Id")
	}
	alice := hs256(t, secret, claims(nil))
	assert.Equal(t, "sub:alice", key(alice, ""))
	assert.Equal(t, "sub:alice", key(alice, "dodge-1"), "a JWT's caller cannot change its key with the header")
	noSub := hs256(t, secret, claims(map[string]any{"sub": nil, "n": 1}))
	k := key(noSub, "dodge-2")
	assert.True(t, strings.HasPrefix(k, "token:"), k)
	assert.Equal(t, k, key(noSub, "dodge-3"), "one token, one key")
	assert.NotEqual(t, k, key(hs256(t, secret, claims(map[string]any{"sub": nil, "n": 2})), ""), "another token, another key")
	assert.Equal(t, "x1", key("", "x1"), "no authentication: the header names the client")
	assert.Equal(t, "192.0.2.7", key("", ""))
}

// TestTablesNotRevealed: a refused table never lists serve.tables, and a
// caller whose token does not grant a table learns only that, not whether
// the table is served.
func TestTablesNotRevealed(t *testing.T) {
	s := &Server{cfg: Config{Tables: []string{"public.orders", "secret.payroll"}}}
	parse := func(query string, who *caller) string {
		_, _, err := s.parseRequest(httptest.NewRequest("GET", "/v1/feed?"+query, nil), who)
		require.Error(t, err)
		return err.Error()
	}
	got := parse("tables=public.items", nil)
	assert.Equal(t, `tables: "public.items" is not served here (serve.tables)`, got)
	tenant := &caller{tables: []string{"public.orders", "public.items"}}
	for _, q := range []string{"tables=secret.payroll", "tables=public.nothing"} {
		got = parse(q, tenant)
		assert.Contains(t, got, "the token does not grant", q)
	}
	got = parse("", &caller{tables: []string{"public.items"}})
	assert.Equal(t, "tables: the token grants none of the tables served here (serve.tables)", got)
	for _, q := range []string{"tables=public.items", "tables=secret.payroll", "tables=public.nothing", ""} {
		for _, who := range []*caller{nil, tenant, {tables: []string{"public.items"}}} {
			_, _, err := s.parseRequest(httptest.NewRequest("GET", "/v1/feed?"+q, nil), who)
			if err == nil {
				continue
			}
			for _, served := range s.cfg.Tables {
				if !strings.Contains(q, served) {
					assert.NotContains(t, err.Error(), served, "%s: %v", q, err)
				}
			}
		}
	}
}
