package e2e_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/internal/testpki"
)

// pki is a server certificate and client CA in files, for a listener's
// tls section.
type pki struct {
	ca, clients       *testpki.CA
	dir               string
	cert, key, cliCA  string
	clientCert, other tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{ca: testpki.NewCA(t, "server CA"), clients: testpki.NewCA(t, "client CA"), dir: t.TempDir()}
	p.cert, p.key = p.ca.WriteFiles(t, p.dir, "server", testpki.Localhost("first"))
	p.cliCA = p.clients.WriteCA(t, p.dir, "clients")
	p.clientCert = p.clients.ClientCert(t, "reader")
	p.other = testpki.NewCA(t, "stranger").ClientCert(t, "intruder")
	return p
}

// client is an HTTPS client trusting the server CA, with certs.
func (p *pki) client(certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: p.ca.Pool(), ServerName: "localhost", Certificates: certs}}}
}

// served returns the name on the certificate a new connection to addr
// gets.
func (p *pki) served(t *testing.T, addr string) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: p.ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{p.clientCert}})
	require.NoError(t, err)
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// rotate replaces the server certificate with one named cn.
func (p *pki) rotate(t *testing.T, cn string) {
	t.Helper()
	c, k := p.ca.Issue(t, testpki.Localhost(cn))
	testpki.WriteFile(t, p.key, k)
	testpki.WriteFile(t, p.cert, c)
}

// TestServeTLSCommand runs `bridge serve` over mutual TLS with JWT
// authentication: a client without a certificate, or with one of another
// CA, is refused; a rotated certificate is served to new connections
// without a restart.
func TestServeTLSCommand(t *testing.T) {
	defer parallel(t)()
	natsURL, _ := cdcStream(t)

	p := newPKI(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := serveYAML(t, natsURL, fmt.Sprintf(`  listen: %q
  tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
  auth: {hs256_secret: %q}
`, addr, p.cert, p.key, p.cliCA, testSecret))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		cmd := cli.NewCommand(io.Discard, io.Discard)
		cmd.SetArgs([]string{"serve", "-c", cfg})
		done <- cmd.ExecuteContext(ctx)
	}()
	c := p.client(p.clientCert)
	require.Eventually(t, func() bool {
		r, err := c.Get("https://" + addr + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond)

	token := mint(t, testSecret, jwt.MapClaims{"exp": time.Now().Add(time.Hour).Unix()})
	code, _ := getStatus(t, c, "https://"+addr+"/v1/position", token)
	require.Equal(t, http.StatusOK, code)
	code, _ = getStatus(t, c, "https://"+addr+"/v1/position", "")
	require.Equal(t, http.StatusUnauthorized, code, "mutual TLS and a token: both are needed")

	for name, cl := range map[string]*http.Client{"no client certificate": p.client(), "a certificate of another CA": p.client(p.other)} {
		_, err := cl.Get("https://" + addr + "/livez")
		require.Error(t, err, name)
	}
	if r, err := http.Get("http://" + addr + "/livez"); err == nil {
		r.Body.Close()
		require.Equal(t, http.StatusBadRequest, r.StatusCode, "plain HTTP is not served")
	}

	require.Equal(t, "first", p.served(t, addr))
	p.rotate(t, "second")
	require.Eventually(t, func() bool { return p.served(t, addr) == "second" }, 30*time.Second, 20*time.Millisecond,
		"the rotated certificate, without a restart")
	code, _ = getStatus(t, c, "https://"+addr+"/v1/position", token)
	require.Equal(t, http.StatusOK, code)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("bridge serve did not stop")
	}
}

// TestListenersRefused checks that `bridge validate` refuses listeners
// beyond loopback without authentication, and TLS files that do not load,
// each with one line naming the key and the fix; `bridge serve` refuses
// those of its own listener (serve.*) the same way, and only logs the key
// of those of the bridge's metrics listener (http.*), which it does not
// open.
func TestListenersRefused(t *testing.T) {
	defer parallel(t)()
	p := newPKI(t)
	missing := filepath.Join(p.dir, "missing.pem")
	junk := filepath.Join(p.dir, "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("junk"), 0o600))
	for _, tc := range []struct {
		name, serve, http, want string
	}{
		{"serve beyond loopback", `  listen: "0.0.0.0:8090"`, "", `serve.listen: "0.0.0.0:8090" can be reached from other machines and serve.auth is not set: anyone who reaches it reads every row. Set serve.auth.hs256_secret or jwks_url (JWT), serve.client_header behind an authenticating proxy, listen on 127.0.0.1, or set serve.auth.mode: none to serve without authentication`},
		{"metrics beyond loopback", "", `  listen: ":8080"`, `http.listen: ":8080" serves /metrics to every machine that can reach it: set http.token (a bearer token Prometheus sends) or http.tls.client_ca_file (mutual TLS), listen on 127.0.0.1, or set http.allow_public: true to serve it openly`},
		{"serve.tls missing", fmt.Sprintf("  tls: {cert_file: %q, key_file: %q}", missing, p.key), "", "serve.tls.cert_file: open " + missing + ": no such file or directory (want the PEM certificate chain the listener presents, leaf first)"},
		{"http.tls wrong key", "", fmt.Sprintf("  tls: {cert_file: %q, key_file: %q}", p.cert, p.cliCA), "http.tls.key_file: " + p.cliCA + " does not hold the private key of " + p.cert},
		{"client CA not a certificate", fmt.Sprintf("  tls: {cert_file: %q, key_file: %q, client_ca_file: %q}", p.cert, p.key, junk), "", "serve.tls.client_ca_file: no PEM certificate in " + junk + " (want the PEM certificates of the CAs that sign client certificates)"},
		{"opted in", "  listen: \"0.0.0.0:8090\"\n  auth: {mode: none}", "  listen: \":8080\"\n  allow_public: true", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := serveYAML(t, "nats://127.0.0.1:1", tc.serve+"\n")
			if tc.http != "" {
				b, err := os.ReadFile(cfg)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(cfg, append(b, []byte("\nhttp:\n"+tc.http+"\n")...), 0o600))
			}
			code, _, errs := execCLI(t, "validate", "-c", cfg)
			if tc.want == "" {
				require.Equal(t, 0, code, errs)
				return
			}
			require.Equal(t, 1, code)
			require.Contains(t, errs, "  "+tc.want)
			require.Equal(t, 2, strings.Count(errs, "\n"), "one line of problem: %s", errs)
			code, _, errs = execCLI(t, "serve", "-c", cfg)
			require.Equal(t, 1, code)
			if tc.http == "" {
				require.Contains(t, errs, "  "+tc.want, "bridge serve refuses before starting")
				return
			}
			// Past the configuration, to the NATS connection (nothing
			// listens at port 1). A key the file's loading finds wrong is
			// logged; the TLS files of http.tls are not even read.
			require.NotContains(t, errs, tc.want)
			require.Contains(t, errs, "connecting to nats://127.0.0.1:1")
			if key, _, _ := strings.Cut(tc.want, ":"); key == "http.listen" {
				require.Contains(t, errs, `"msg":"ignoring problems in sections of the configuration that serve does not read (bridge validate reports them)","keys":"http.listen"`)
			}
		})
	}
}

// TestMetricsListenerSecured runs `bridge run` with http.tls, mutual TLS
// and http.token: /metrics needs the token, the health endpoints do not,
// plain HTTP and clients without a certificate are refused, and a rotated
// certificate is served to new connections.
func TestMetricsListenerSecured(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	p := newPKI(t)
	const metricsToken = "m3trics-t0ken-for-the-test"
	cfgPath := e.config("mtls", "")
	b, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	y := strings.Replace(string(b), "http:\n  listen: \"127.0.0.1:0\"\n", fmt.Sprintf(`http:
  listen: "127.0.0.1:0"
  token: %q
  tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
`, metricsToken, p.cert, p.key, p.cliCA), 1)
	require.NotEqual(t, string(b), y)
	require.NoError(t, os.WriteFile(cfgPath, []byte(y), 0o600))
	r := e.start(cfgPath)
	addr := r.app.HTTPAddr()
	c := p.client(p.clientCert)

	code, www := getStatus(t, c, "https://"+addr+"/metrics", "")
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, `Bearer realm="bridge metrics"`, www)
	code, _ = getStatus(t, c, "https://"+addr+"/metrics", "wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = getStatus(t, c, "https://"+addr+"/metrics", metricsToken)
	require.Equal(t, http.StatusOK, code)
	code, _ = getStatus(t, c, "https://"+addr+"/livez", "")
	require.Equal(t, http.StatusOK, code, "health stays open to authenticated connections")
	_, err = p.client().Get("https://" + addr + "/livez")
	require.Error(t, err, "no client certificate")
	if resp, err := http.Get("http://" + addr + "/livez"); err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to the TLS listener")
	}

	p.rotate(t, "second")
	require.Eventually(t, func() bool { return p.served(t, addr) == "second" }, 30*time.Second, 20*time.Millisecond)
}
