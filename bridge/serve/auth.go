package serve

// Authentication of `bridge serve` (serve.auth, docs/security.md): bearer
// JWTs verified here, or an authenticating proxy's client header; a JWT's
// claims decide the tables (tables_claim) and the rows (where, a template
// over claims) its caller may read.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/reload"
)

// asymmetric are the algorithms a JWKS verifies; HS256 is only ever
// verified with hs256_secret, so that a public key can never be used as an
// HMAC secret.
var asymmetric = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// realm names the protection space in WWW-Authenticate.
const realm = "bridge serve"

// Auth authenticates requests. Build it with NewAuth; a nil *Auth lets
// every request in (no authentication).
type Auth struct {
	mode   string // config.AuthJWT or config.AuthProxy
	header string // proxy: the header the proxy sets
	log    *slog.Logger
	// listener is where the Auth is used: it decides whether the proxy's
	// header and a token in the URL are trusted (On).
	listener Listener
	// scopeClaim (JWT) and scopeHeader (proxy) carry the caller's scopes
	// (Permit).
	scopeClaim, scopeHeader string
	// queryConfigured is serve.auth.query_token; queryToken whether the
	// listener accepts it (TLS, or loopback).
	queryConfigured bool

	parser      *jwt.Parser
	algs        []string                     // the algorithms accepted
	keys        *atomic.Pointer[jwt.Keyfunc] // shared by the copies On makes
	jwksFile    string                       // reloaded by Watch
	tablesClaim string
	where       *whereTemplate
	queryToken  bool
	leeway      time.Duration
}

// caller is an authenticated request's identity and grants.
type caller struct {
	// id keys the per-client limit: the proxy's header, the token's
	// subject, or for a token without one, a digest of the token.
	id string
	// name is who the caller is in logs and records: a JWT's sub, the
	// proxy's header; "" for a token without sub.
	name string
	// scopes are what the token's scope claim or the proxy's scope header
	// grant (Permit).
	scopes []string
	// tables the caller may read; nil when the token does not limit them.
	tables []string
	// where is ANDed with the request's filter; nil adds none.
	where *feeds.Cond
	// until is when the token stops being accepted (exp + leeway); zero
	// without a token. An SSE stream ends then.
	until time.Time
}

// authError is a refused request: 401 (who are you?), 403 (not this) or
// 400 (a malformed credential).
type authError struct {
	status int
	code   string // invalid_request, invalid_token (401's WWW-Authenticate)
	detail string
}

func (e *authError) Error() string { return e.detail }

func unauthorized(code, format string, args ...any) *authError {
	return &authError{status: http.StatusUnauthorized, code: code, detail: fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) *authError {
	return &authError{status: http.StatusForbidden, detail: fmt.Sprintf(format, args...)}
}

// NewAuth builds the authentication serve.auth configures, or nil for
// mode none. clientHeader is serve.client_header (proxy mode). ctx bounds
// the refresh of a jwks_url, which is fetched in the background: a first
// fetch that fails is logged and retried when a token names an unknown
// key. Errors name their YAML path.
func NewAuth(ctx context.Context, s config.Serve, log *slog.Logger) (*Auth, error) {
	if log == nil {
		log = slog.Default()
	}
	a := s.Auth
	mode := s.EffectiveMode()
	served := Listener{Key: "serve.listen", Addr: s.Listen, TLS: s.TLS.Enabled(), MutualTLS: s.TLS.ClientCAFile != ""}
	switch mode {
	case config.AuthNone:
		return nil, nil
	case config.AuthProxy:
		return (&Auth{mode: mode, header: s.ClientHeader, scopeHeader: a.ScopeHeader, log: log}).On(served), nil
	}
	au := &Auth{mode: mode, log: log, tablesClaim: a.TablesClaim, queryConfigured: a.QueryToken, leeway: a.Leeway, scopeClaim: a.ScopeClaim}
	if au.scopeClaim == "" {
		au.scopeClaim = "scope"
	}
	au.keys = new(atomic.Pointer[jwt.Keyfunc])
	au.listener, au.queryToken = served, a.QueryToken && served.queryTokenOK()
	opts := []jwt.ParserOption{
		jwt.WithLeeway(a.Leeway), jwt.WithIssuedAt(), jwt.WithExpirationRequired(), jwt.WithJSONNumber(),
	}
	if a.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(a.Issuer))
	}
	if a.Audience != "" {
		opts = append(opts, jwt.WithAudience(a.Audience))
	}
	switch {
	case a.HS256Secret != "":
		secret := []byte(a.HS256Secret)
		kf := jwt.Keyfunc(func(*jwt.Token) (any, error) { return secret, nil })
		au.keys.Store(&kf)
		au.algs = []string{"HS256"}
	case a.JWKSFile != "":
		kf, err := loadJWKS(a.JWKSFile)
		if err != nil {
			return nil, err
		}
		au.keys.Store(&kf)
		au.jwksFile = a.JWKSFile
		au.algs = asymmetric
	case a.JWKSURL != "":
		url := config.Redact(a.JWKSURL)
		k, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{a.JWKSURL}, keyfunc.Override{
			HTTPTimeout: 10 * time.Second,
			RefreshErrorHandlerFunc: func(string) func(context.Context, error) {
				return func(_ context.Context, err error) {
					log.Warn("serve.auth.jwks_url: fetching the key set failed; tokens signed by keys not yet fetched get 401", "url", url, "err", err)
				}
			},
		})
		if err != nil {
			return nil, &config.FieldError{Path: "serve.auth.jwks_url", Msg: err.Error()}
		}
		kf := jwt.Keyfunc(k.KeyfuncCtx(ctx))
		au.keys.Store(&kf)
		au.algs = asymmetric
	}
	au.parser = jwt.NewParser(append(opts, jwt.WithValidMethods(au.algs))...)
	w, err := parseWhereTemplate(a.Where)
	if err != nil {
		return nil, err
	}
	au.where = w
	return au, nil
}

// loadJWKS reads a JSON Web Key Set file.
func loadJWKS(path string) (jwt.Keyfunc, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, &config.FieldError{Path: "serve.auth.jwks_file", Msg: fmt.Sprintf("%v (want a JSON Web Key Set: {\"keys\": [...]})", err)}
	}
	var probe struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil || len(probe.Keys) == 0 {
		return nil, &config.FieldError{Path: "serve.auth.jwks_file", Msg: fmt.Sprintf("%s holds no JSON Web Key Set (want {\"keys\": [...]} with at least one key)", path)}
	}
	k, err := keyfunc.NewJWKSetJSON(raw)
	if err != nil {
		return nil, &config.FieldError{Path: "serve.auth.jwks_file", Msg: fmt.Sprintf("%s: %v", path, err)}
	}
	return k.Keyfunc, nil
}

// files returns the files Watch reloads.
func (a *Auth) files() []string {
	if a == nil || a.jwksFile == "" {
		return nil
	}
	return []string{a.jwksFile}
}

// reloadJWKS reads jwks_file again; a file that does not load keeps the
// previous keys.
func (a *Auth) reloadJWKS() {
	kf, err := loadJWKS(a.jwksFile)
	if err != nil {
		a.log.Error("serve.auth.jwks_file did not reload: verifying with the previous keys", "err", err)
		return
	}
	a.keys.Store(&kf)
	a.log.Info("serve.auth.jwks_file reloaded", "file", a.jwksFile)
}

// bearer returns the request's token: the Authorization header's, or the
// access_token query parameter's when query_token allows it.
func (a *Auth) bearer(r *http.Request) (string, *authError) {
	h := r.Header.Get("Authorization")
	q, inQuery := r.URL.Query()["access_token"]
	if inQuery && !a.queryToken {
		if a.queryConfigured {
			return "", unauthorized("invalid_request", "a token in the access_token query parameter is not accepted on %s %q, which is served without TLS: send it in the Authorization header", a.listener.Key, a.listener.Addr)
		}
		return "", unauthorized("invalid_request", "a token in the access_token query parameter is not accepted here: send it in the Authorization header")
	}
	if h != "" && inQuery {
		return "", &authError{status: http.StatusBadRequest, code: "invalid_request", detail: "a token in both the Authorization header and access_token: send one"}
	}
	if inQuery {
		if len(q) != 1 || q[0] == "" {
			return "", unauthorized("invalid_request", "access_token must be given once, not empty")
		}
		return q[0], nil
	}
	if h == "" {
		return "", unauthorized("", "no bearer token: send Authorization: Bearer <token>")
	}
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", unauthorized("invalid_request", "the Authorization header must be \"Bearer <token>\"")
	}
	return strings.TrimSpace(tok), nil
}

// authenticate checks r's credentials. grants asks for the caller's
// tables and rows too (feeds); without it a valid token is enough
// (/metrics beyond loopback).
func (a *Auth) authenticate(r *http.Request, grants bool) (*caller, *authError) {
	if a.mode == config.AuthProxy {
		if aerr := a.proxyTrusted(r); aerr != nil {
			return nil, aerr
		}
		id := r.Header.Get(a.header)
		if id == "" {
			return nil, unauthorized("", "no %s header: requests must come through the authenticating proxy", a.header)
		}
		c := &caller{id: id, name: id}
		if a.scopeHeader != "" {
			c.scopes = splitScopes(r.Header.Get(a.scopeHeader))
		}
		return c, nil
	}
	raw, aerr := a.bearer(r)
	if aerr != nil {
		return nil, aerr
	}
	claims := jwt.MapClaims{}
	kf := *a.keys.Load()
	if tok, err := a.parser.ParseWithClaims(raw, claims, kf); err != nil {
		if tok != nil && !errors.Is(err, jwt.ErrTokenMalformed) {
			if alg, _ := tok.Header["alg"].(string); !slices.Contains(a.algs, alg) {
				return nil, unauthorized("invalid_token", "the token's algorithm %q is not accepted (accepted: %s)", alg, strings.Join(a.algs, ", "))
			}
		}
		return nil, unauthorized("invalid_token", "%s", tokenProblem(err))
	}
	c := &caller{}
	if sub, _ := claims["sub"].(string); sub != "" {
		c.id, c.name = "sub:"+sub, sub
	} else {
		// Without a subject the token itself names the caller: one token
		// is one client, whatever header it sends.
		d := sha256.Sum256([]byte(raw))
		c.id = "token:" + hex.EncodeToString(d[:12])
	}
	c.scopes = claimScopes(claims, a.scopeClaim)
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		c.until = exp.Add(a.leeway)
	}
	if !grants {
		return c, nil
	}
	if a.tablesClaim != "" {
		tables, aerr := claimTables(claims, a.tablesClaim)
		if aerr != nil {
			return nil, aerr
		}
		c.tables = tables
	}
	if a.where != nil {
		w, aerr := a.where.render(claims)
		if aerr != nil {
			return nil, aerr
		}
		c.where = w
	}
	return c, nil
}

// tokenProblem says why a token was refused, in the words of RFC 6750's
// error_description: no key material, no claim values.
func tokenProblem(err error) string {
	for _, e := range []struct {
		err error
		msg string
	}{
		{jwt.ErrTokenMalformed, "the token is malformed"},
		{jwt.ErrTokenSignatureInvalid, "the token's signature is invalid"},
		{jwt.ErrTokenUnverifiable, "the token cannot be verified: unknown key or algorithm"},
		{jwt.ErrTokenExpired, "the token has expired"},
		{jwt.ErrTokenNotValidYet, "the token is not valid yet (nbf)"},
		{jwt.ErrTokenUsedBeforeIssued, "the token was issued in the future (iat)"},
		{jwt.ErrTokenInvalidIssuer, "the token's issuer (iss) is not accepted"},
		{jwt.ErrTokenInvalidAudience, "the token's audience (aud) does not include this server"},
		{jwt.ErrTokenRequiredClaimMissing, "the token has no expiry (exp)"},
	} {
		if errors.Is(err, e.err) {
			return e.msg
		}
	}
	return "the token is invalid"
}

// claimTables reads the tables claim: a JSON array of names, or one string
// of names separated by spaces or commas.
func claimTables(claims jwt.MapClaims, name string) ([]string, *authError) {
	v, ok := claims[name]
	if !ok {
		return nil, forbidden("the token has no %q claim: it grants no table", name)
	}
	var out []string
	switch x := v.(type) {
	case string:
		out = strings.FieldsFunc(x, func(r rune) bool { return r == ' ' || r == ',' })
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, forbidden("claim %q must list schema.table names as strings", name)
			}
			out = append(out, s)
		}
	default:
		return nil, forbidden("claim %q must be a list of schema.table names", name)
	}
	if len(out) == 0 {
		return nil, forbidden("claim %q is empty: the token grants no table", name)
	}
	return out, nil
}

// challenge writes a refusal: 401 with WWW-Authenticate (RFC 6750), 403
// or 400, with the JSON body of every error.
func challenge(w http.ResponseWriter, e *authError) {
	body := apiError{Error: "unauthorized", Detail: e.detail}
	switch e.status {
	case http.StatusUnauthorized:
		v := `Bearer realm="` + realm + `"`
		if e.code != "" {
			v += `, error="` + e.code + `", error_description="` + strings.ReplaceAll(e.detail, `"`, "'") + `"`
		}
		w.Header().Set("WWW-Authenticate", v)
	case http.StatusForbidden:
		body.Error = "forbidden"
	default:
		body.Error = "bad-request"
	}
	writeJSON(w, e.status, body)
}

// whereTemplate is serve.auth.where: a condition whose values may be
// templates over the token's claims. Rendering substitutes values only, in
// the parsed condition, so a claim can never add a condition, change a
// column or close a bracket, whatever it holds.
type whereTemplate struct {
	cond  feeds.Cond
	tmpls map[string]*valueTemplate // by the template text
}

// valueTemplate is one templated value.
type valueTemplate struct {
	claim []string           // a value that is exactly one claim reference: its path
	text  *template.Template // otherwise: rendered to a string
}

var (
	// wholeClaimRE is a value that is exactly {{.claims.a.b}}.
	wholeClaimRE = regexp.MustCompile(`^\{\{-?\s*\.claims((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*-?\}\}$`)
	// indexClaimRE is a value that is exactly {{index .claims "name"}},
	// for claim names that are not identifiers (URLs, dashes).
	indexClaimRE = regexp.MustCompile(`^\{\{-?\s*index\s+\.claims\s+"([^"\\]+)"\s*-?\}\}$`)
)

const authWherePath = "serve.auth.where"

// parseWhereTemplate parses serve.auth.where; nil when empty. Errors are
// *config.FieldError at the offending path.
func parseWhereTemplate(m map[string]any) (*whereTemplate, error) {
	c, err := parseCondAt(authWherePath, m)
	if err != nil || c == nil {
		return nil, err
	}
	w := &whereTemplate{cond: *c, tmpls: map[string]*valueTemplate{}}
	if err := w.compile(c, authWherePath); err != nil {
		return nil, err
	}
	return w, nil
}

// compile checks that templates appear only in values and parses each.
func (w *whereTemplate) compile(c *feeds.Cond, path string) error {
	p := path + "." + string(c.Kind)
	if strings.Contains(c.Col, "{{") {
		at := p
		if c.Kind != feeds.KindNull && c.Kind != feeds.KindNotNull {
			at += "[0]"
		}
		return &config.FieldError{Path: at, Msg: fmt.Sprintf("%q: a column cannot come from a claim; only values can", c.Col)}
	}
	for i, v := range c.Vals {
		s, ok := v.(string)
		if !ok || !strings.Contains(s, "{{") {
			continue
		}
		at := p + "[1]"
		if c.Kind == feeds.KindIn || c.Kind == feeds.KindContains {
			at = fmt.Sprintf("%s[1][%d]", p, i)
		}
		if _, done := w.tmpls[s]; done {
			continue
		}
		vt := &valueTemplate{}
		if m := wholeClaimRE.FindStringSubmatch(s); m != nil {
			vt.claim = strings.Split(m[1][1:], ".")
		} else if m := indexClaimRE.FindStringSubmatch(s); m != nil {
			vt.claim = []string{m[1]}
		} else {
			t, err := template.New(at).Option("missingkey=error").Parse(s)
			if err != nil {
				return &config.FieldError{Path: at, Msg: err.Error()}
			}
			vt.text = t
		}
		w.tmpls[s] = vt
	}
	for i := range c.Subs {
		sp := p
		if c.Kind != feeds.KindNot {
			sp = fmt.Sprintf("%s[%d]", p, i)
		}
		if err := w.compile(&c.Subs[i], sp); err != nil {
			return err
		}
	}
	return nil
}

// render returns the condition with the claims' values in place of the
// templates; 403 when a claim is missing or is not a value.
func (w *whereTemplate) render(claims jwt.MapClaims) (*feeds.Cond, *authError) {
	c, err := w.renderCond(w.cond, claims)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

func (w *whereTemplate) renderCond(c feeds.Cond, claims jwt.MapClaims) (feeds.Cond, *authError) {
	out := feeds.Cond{Kind: c.Kind, Col: c.Col}
	list := c.Kind == feeds.KindIn || c.Kind == feeds.KindContains
	for _, v := range c.Vals {
		s, ok := v.(string)
		vt := w.tmpls[s]
		if !ok || vt == nil {
			out.Vals = append(out.Vals, v)
			continue
		}
		if vt.text != nil {
			var b strings.Builder
			if err := vt.text.Execute(&b, map[string]any{"claims": map[string]any(claims)}); err != nil {
				return feeds.Cond{}, forbidden("the token lacks a claim serve.auth.where uses: %v", err)
			}
			out.Vals = append(out.Vals, b.String())
			continue
		}
		name := strings.Join(vt.claim, ".")
		cv, found := lookupClaim(claims, vt.claim)
		if !found {
			return feeds.Cond{}, forbidden("the token has no %q claim, which serve.auth.where uses", name)
		}
		switch x := cv.(type) {
		case string, bool, json.Number, float64:
			out.Vals = append(out.Vals, x)
		case []any:
			if !list {
				return feeds.Cond{}, forbidden("claim %q must be a single value for %s, got a list", name, c.Kind)
			}
			if len(x) == 0 {
				return feeds.Cond{}, forbidden("claim %q is an empty list: it grants no rows", name)
			}
			for _, e := range x {
				switch e.(type) {
				case string, bool, json.Number, float64:
					out.Vals = append(out.Vals, e)
				default:
					return feeds.Cond{}, forbidden("claim %q must list values (strings, numbers, booleans)", name)
				}
			}
		default:
			return feeds.Cond{}, forbidden("claim %q must be a string, number or boolean", name)
		}
	}
	for _, sub := range c.Subs {
		rs, err := w.renderCond(sub, claims)
		if err != nil {
			return feeds.Cond{}, err
		}
		out.Subs = append(out.Subs, rs)
	}
	return out, nil
}

// lookupClaim follows path through nested objects of claims.
func lookupClaim(claims jwt.MapClaims, path []string) (any, bool) {
	var cur any = map[string]any(claims)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, cur != nil
}

// Watch reloads the JWKS file when it changes or trigger receives.
func (a *Auth) watch(ctx context.Context, trigger <-chan struct{}) error {
	if len(a.files()) == 0 {
		return nil
	}
	return reload.Watch(ctx, a.log, a.files(), trigger, a.reloadJWKS)
}

// Protect returns next behind a's authentication: a request without valid
// credentials gets 401 (400, 403) as on /v1/position, and never reaches
// next. A nil *Auth returns next. The web console (bridge/console) guards
// its API with it, so it asks what `bridge serve` asks; Permit then says
// what the caller may do there.
func (a *Auth) Protect(next http.Handler) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := a.authenticate(r, false)
		if err != nil {
			challenge(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// callerKey is the context key of the caller Protect authenticated.
type callerKey struct{}

// Listener is the listener an Auth serves on: it decides whether an
// authenticating proxy's header can be trusted there (only the proxy can
// reach the listener) and whether a token may travel in the URL (only over
// TLS, or on loopback behind a TLS-terminating proxy on the same host).
type Listener struct {
	// Key is the YAML key of the listen address, named in refusals:
	// "serve.listen", "http.listen".
	Key string
	// Addr is the listen address (host:port).
	Addr string
	// TLS is true when the listener serves HTTPS; MutualTLS when clients
	// must present a certificate of its client_ca_file.
	TLS, MutualTLS bool
}

// ProxyTrusted reports whether an authenticating proxy's header can be
// trusted on l: l is on loopback (a proxy on the same host; a sidecar) or
// requires a client certificate (the proxy's). On any other listener every
// client that reaches it can send the header.
func (l Listener) ProxyTrusted() bool { return config.IsLoopback(l.Addr) || l.MutualTLS }

// queryTokenOK reports whether a token in the URL is accepted on l.
func (l Listener) queryTokenOK() bool { return l.TLS || config.IsLoopback(l.Addr) }

// On returns a's authentication on another listener than serve.listen
// (the web console on http.listen): the proxy's header is trusted only
// where l.ProxyTrusted, and access_token (query_token) only where l serves
// TLS or is on loopback. A nil *Auth returns nil.
func (a *Auth) On(l Listener) *Auth {
	if a == nil {
		return nil
	}
	b := &Auth{mode: a.mode, header: a.header, log: a.log, listener: l, scopeClaim: a.scopeClaim, scopeHeader: a.scopeHeader,
		queryConfigured: a.queryConfigured, queryToken: a.queryConfigured && l.queryTokenOK(),
		keys: a.keys, parser: a.parser, algs: a.algs, jwksFile: a.jwksFile, tablesClaim: a.tablesClaim, where: a.where, leeway: a.leeway}
	return b
}

// Listener returns the listener a serves on.
func (a *Auth) Listener() Listener { return a.listener }

// Mode returns a's mode: config.AuthJWT or config.AuthProxy.
func (a *Auth) Mode() string { return a.mode }

// proxyTrusted refuses a request whose proxy header cannot be trusted: on
// a listener other clients reach (not loopback, no mutual TLS), or over a
// connection without a verified client certificate.
func (a *Auth) proxyTrusted(r *http.Request) *authError {
	l := a.listener
	switch {
	case config.IsLoopback(l.Addr):
		return nil
	case l.MutualTLS && r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
		return nil
	}
	e := forbidden("the %s header is not trusted on %s %q: every client that reaches it could send it; the proxy must reach the bridge on loopback or with a client certificate (mutual TLS)", a.header, l.Key, l.Addr)
	a.log.Warn("request refused: "+e.detail, "remote", r.RemoteAddr, "path", r.URL.Path)
	return e
}

// Scopes of the web console's API, granted by the token's scope claim
// (serve.auth.scope_claim) or the proxy's scope header
// (serve.auth.scope_header). The feeds and the console's tail need
// neither: tables_claim and where decide what a caller reads there.
const (
	// ScopeStatus reads the console's overview: the sources' states,
	// lag, slots, sinks and snapshots.
	ScopeStatus = "bridge:status"
	// ScopeControl pauses, resumes and snapshots sources, and reads the
	// overview.
	ScopeControl = "bridge:control"
)

// Permit reports whether r's caller, authenticated by Protect, has scope
// (ScopeControl grants ScopeStatus too), and names it for the logs and the
// records of what it did: the token's sub, or the user the proxy names.
// Acting (ScopeControl) needs a named caller. A refusal is a 403 whose
// error says why in one line. A nil *Auth allows everything, naming no
// one ("").
func (a *Auth) Permit(r *http.Request, scope string) (string, error) {
	if a == nil {
		return "", nil
	}
	c, _ := r.Context().Value(callerKey{}).(*caller)
	if c == nil {
		var aerr *authError
		if c, aerr = a.authenticate(r, false); aerr != nil {
			return "", aerr
		}
	}
	has := slices.Contains(c.scopes, scope) || (scope == ScopeStatus && slices.Contains(c.scopes, ScopeControl))
	what := "reading the console's overview needs " + ScopeStatus + " or " + ScopeControl
	if scope == ScopeControl {
		what = "pausing, resuming and snapshotting sources needs " + ScopeControl
	}
	var e *authError
	switch {
	case !has && a.mode == config.AuthProxy && a.scopeHeader == "":
		e = forbidden("%s, and the proxy passes no scopes: set serve.auth.scope_header to the header in which it sends the caller's scopes", what)
	case !has && a.mode == config.AuthProxy:
		e = forbidden("%s, which the proxy does not grant %q (header %s)", what, c.name, a.scopeHeader)
	case !has:
		e = forbidden("%s, which the token does not grant (claim %q)", what, a.scopeClaim)
	case scope == ScopeControl && c.name == "":
		e = forbidden("the token has no sub claim: the console records who pauses, resumes and snapshots by it")
	default:
		return c.name, nil
	}
	return c.name, e
}

// claimScopes reads the scope claim: a string of scopes separated by
// spaces (RFC 9068's scope) or a JSON array of strings (scp, roles).
func claimScopes(claims jwt.MapClaims, name string) []string {
	switch x := claims[name].(type) {
	case string:
		return splitScopes(x)
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// splitScopes splits a list of scopes separated by spaces or commas.
func splitScopes(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' })
}

// clientKey names r's client for max_per_client: the authenticated caller
// (a JWT's sub, else a digest of its token; the proxy's user), else the
// client header without authentication (serve.auth.mode: none), else the
// remote IP. With a JWT the caller cannot change its key with a header.
func clientKey(r *http.Request, who *caller, header string) string {
	if who != nil && who.id != "" {
		return who.id
	}
	if header != "" {
		if v := r.Header.Get(header); v != "" {
			return v
		}
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	return host
}
