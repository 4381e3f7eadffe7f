// Package production_test checks the recommended production configuration,
// bridge.yaml beside this file, which docs/security.md shows: the YAML in the
// page is this file, byte for byte, and the file loads through the bridge's
// own config.Load and app.New, with every file it names (certificates, a
// .creds file, the Postgres password) made for the test, and has each
// property the page claims of it.
package production_test

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/testpki"
	_ "github.com/bridgecdc/bridge/plugins"
)

const (
	configFile = "bridge.yaml"
	docFile    = "../../docs/security.md"
	// docMarker precedes the YAML block in docFile that must equal configFile.
	docMarker = "<!-- examples/production/bridge.yaml"
)

// docBlock returns the first ```yaml block after marker in the Markdown
// text doc.
func docBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	i := strings.Index(doc, marker)
	require.GreaterOrEqual(t, i, 0, "%s has no %q", docFile, marker)
	rest := doc[i:]
	const open = "```yaml\n"
	j := strings.Index(rest, open)
	require.GreaterOrEqual(t, j, 0, "no ```yaml block after %q", marker)
	rest = rest[j+len(open):]
	k := strings.Index(rest, "\n```")
	require.GreaterOrEqual(t, k, 0, "the block after %q does not end", marker)
	return rest[:k+1]
}

// TestProductionConfigIsTheDocs: docs/security.md shows exactly the file
// the next test checks, so the two cannot drift apart.
func TestProductionConfigIsTheDocs(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile(configFile)
	require.NoError(t, err)
	doc, err := os.ReadFile(docFile)
	require.NoError(t, err)
	require.Equal(t, string(file), docBlock(t, string(doc), docMarker),
		"the YAML in %s differs from examples/production/%s: change both", docFile, configFile)
}

// secretFiles makes the files the configuration names, as a machine in
// production holds them: a CA for the NATS servers and one for Postgres, a
// client certificate, the feeds' server certificate, a .creds file (a user
// JWT signed by its account, and the user's seed) and the password.
func secretFiles(t *testing.T) map[string]string {
	t.Helper()
	natsCA := testpki.NewCA(t, "NATS CA")
	pgCA := testpki.NewCA(t, "Postgres CA")
	feedsCA := testpki.NewCA(t, "feeds CA")
	clientCrt, clientKey := natsCA.Issue(t, testpki.Leaf{CommonName: "bridge", Client: true})
	feedsCrt, feedsKey := feedsCA.Issue(t, testpki.Leaf{CommonName: "feeds.example.com", DNS: []string{"feeds.example.com"}})
	acct, err := nkeys.CreateAccount()
	require.NoError(t, err)
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	upub, err := user.PublicKey()
	require.NoError(t, err)
	useed, err := user.Seed()
	require.NoError(t, err)
	uc := natsjwt.NewUserClaims(upub)
	uc.Expires = time.Now().Add(24 * time.Hour).Unix()
	ujwt, err := uc.Encode(acct)
	require.NoError(t, err)
	creds, err := natsjwt.FormatUserConfig(ujwt, useed)
	require.NoError(t, err)
	return map[string]string{
		"/run/secrets/bridge.creds":       string(creds),
		"/etc/bridge/tls/nats-ca.pem":     string(natsCA.PEM),
		"/run/secrets/nats-client.crt":    string(clientCrt),
		"/run/secrets/nats-client.key":    string(clientKey),
		"/run/secrets/pg_password":        "pg-Pa55word-from-a-file",
		"/etc/bridge/tls/pg-ca.pem":       string(pgCA.PEM),
		"/run/secrets/feeds.crt":          string(feedsCrt),
		"/run/secrets/feeds.key":          string(feedsKey),
		"/run/secrets/bridge.nk":          string(useed),
		"/run/secrets/pg.crt":             "",
		"/run/secrets/pg.key":             "",
		"/run/secrets/metrics_token":      "",
		"/run/secrets/metrics.crt":        "",
		"/run/secrets/metrics.key":        "",
		"/run/secrets/feeds_token_secret": "resume-token-secret-from-a-file-of-48-bytes-xxxx",
	}
}

// pathRE finds the secret and TLS file paths the configuration names,
// in its comments too.
var pathRE = regexp.MustCompile(`/(?:run/secrets|etc/bridge/tls)/[A-Za-z0-9._-]+`)

// loadProduction loads the file with its paths moved under a temporary
// root holding secretFiles, and no environment: config.Load (interpolating
// ${file:...}), then app.New, which checks every plugin block (the DSN is
// parsed by pgx, which reads sslrootcert), the NATS files (the creds'
// JWT and seed, the CA, the client certificate and its key) and the
// feeds' certificate.
func loadProduction(t *testing.T) (*config.Config, string) {
	t.Helper()
	raw, err := os.ReadFile(configFile)
	require.NoError(t, err)
	files := secretFiles(t)
	root := t.TempDir()
	text := string(raw)
	for _, p := range pathRE.FindAllString(text, -1) {
		content, ok := files[p]
		require.True(t, ok, "%s names %s, which the test does not make: add it to secretFiles", configFile, p)
		if content == "" {
			continue // only in a comment
		}
		dst := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o700))
		require.NoError(t, os.WriteFile(dst, []byte(content), 0o400))
	}
	for _, prefix := range []string{"/run/secrets/", "/etc/bridge/tls/"} {
		text = strings.ReplaceAll(text, prefix, filepath.Join(root, prefix)+"/")
	}
	p := filepath.Join(root, "bridge.yaml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	cfg, err := config.Load(p, config.WithEnv(func() []string { return nil }))
	require.NoError(t, err, "config.Load")
	_, err = app.New(cfg)
	require.NoError(t, err, "app.New: what `bridge validate` checks without connecting")
	return cfg, string(raw)
}

// TestProductionConfig checks what docs/security.md says of the
// recommended configuration.
func TestProductionConfig(t *testing.T) {
	t.Parallel()
	cfg, raw := loadProduction(t)

	t.Run("NATS: TLS to every server, mutual TLS, a creds file", func(t *testing.T) {
		n := cfg.NATS
		require.NotEmpty(t, n.URL, "an external NATS, not the embedded server")
		for _, u := range strings.Split(n.URL, ",") {
			pu, err := url.Parse(strings.TrimSpace(u))
			require.NoError(t, err)
			assert.Equal(t, "tls", pu.Scheme, "%s: TLS required (never plain text)", u)
		}
		assert.NotEmpty(t, n.TLS.CAFile, "the servers' CA, not any public CA")
		assert.NotEmpty(t, n.TLS.CertFile, "a client certificate (mutual TLS)")
		assert.NotEmpty(t, n.TLS.KeyFile)
		assert.False(t, n.TLS.InsecureSkipVerify, "servers verified")
		assert.True(t, n.Creds != "" || n.NKeySeedFile != "", "a creds file or an nkey: a key that never crosses the connection")
		assert.Empty(t, n.User+n.Password+n.Token, "no password or token")
		assert.Empty(t, n.Context, "nothing from a nats CLI context")
	})

	t.Run("Postgres: verify-full, the password from a file", func(t *testing.T) {
		require.NotEmpty(t, cfg.Sources)
		for name, src := range cfg.Sources {
			dsn, _ := src.Config["dsn"].(string)
			u, err := url.Parse(dsn)
			require.NoError(t, err, "sources.%s.config.dsn", name)
			q := u.Query()
			assert.Equal(t, "verify-full", q.Get("sslmode"), "sources.%s: encrypted, and the server's name checked", name)
			assert.NotEmpty(t, q.Get("sslrootcert"), "sources.%s: the database's CA", name)
			pw, _ := u.User.Password()
			assert.Equal(t, "pg-Pa55word-from-a-file", pw, "sources.%s: the password read from its file", name)
		}
		assert.Regexp(t, `postgres://[^:@/]+:\$\{file:/run/secrets/[^}]+\}@`, raw, "the file holds a ${file:...} reference, not the password")
	})

	t.Run("no secret in the file", func(t *testing.T) {
		for _, s := range []string{cfg.HTTP.Token, cfg.Serve.Auth.HS256Secret, cfg.NATS.Password, cfg.NATS.Token} {
			if s != "" {
				assert.NotContains(t, raw, s)
			}
		}
		assert.NotContains(t, raw, "pg-Pa55word-from-a-file")
	})

	t.Run("http.listen: loopback, or a token and TLS", func(t *testing.T) {
		h := cfg.HTTP
		assert.False(t, h.AllowPublic, "http.allow_public: nothing served openly")
		if !config.IsLoopback(h.Listen) {
			assert.True(t, h.Token != "" || h.TLS.ClientCAFile != "", "http.listen %s beyond loopback: a token or mutual TLS", h.Listen)
			assert.True(t, h.TLS.Enabled(), "http.listen %s beyond loopback: TLS", h.Listen)
		}
		// The console: on loopback, or behind serve.auth's JWTs.
		if h.Console && !config.IsLoopback(h.Listen) {
			assert.Equal(t, config.AuthJWT, cfg.Serve.EffectiveMode())
			assert.Empty(t, app.ConsoleOff(cfg))
		}
	})

	t.Run("serve: TLS and JWTs that fix each caller's tables and rows", func(t *testing.T) {
		s := cfg.Serve
		if config.IsLoopback(s.Listen) {
			t.Fatalf("serve.listen %s: the recommended configuration serves feeds to other machines; check that", s.Listen)
		}
		assert.True(t, s.TLS.Enabled(), "serve.tls beyond loopback")
		assert.Equal(t, config.AuthJWT, s.EffectiveMode(), "JWTs, not mode none, not a proxy header")
		assert.Empty(t, s.Auth.Mode, "no mode written: no mode: none")
		assert.Empty(t, s.ClientHeader, "no header a client could forge")
		u, err := url.Parse(s.Auth.JWKSURL)
		require.NoError(t, err)
		assert.Equal(t, "https", u.Scheme, "keys fetched over https")
		assert.Empty(t, s.Auth.HS256Secret, "asymmetric keys: the bridge cannot mint tokens")
		assert.NotEmpty(t, s.Auth.Issuer, "tokens of this identity provider only")
		assert.NotEmpty(t, s.Auth.Audience, "tokens issued for the feeds only")
		assert.NotEmpty(t, s.Auth.TablesClaim, "each caller reads the tables its token grants")
		assert.NotEmpty(t, s.Auth.Where, "each caller reads its tenant's rows")
		assert.False(t, s.Auth.QueryToken, "no tokens in URLs")
		assert.NotEmpty(t, s.AllowedHosts, "requests for other host names refused")
		assert.Equal(t, "resume-token-secret-from-a-file-of-48-bytes-xxxx", s.TokenSecret, "resume tokens signed, the secret from a file")
	})

	t.Run("shared configuration and data dir", func(t *testing.T) {
		assert.Empty(t, cfg.Config.KVEnv, "config.kv_env: the shared entry reads no variable")
		assert.True(t, filepath.IsAbs(cfg.DataDir), "data_dir absolute: %q", cfg.DataDir)
		assert.Equal(t, 3, cfg.Checkpoint.Replicas, "checkpoints on three servers")
	})
}
