package reload_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/reload"
	"github.com/bridgecdc/bridge/internal/syncbuf"
	"github.com/bridgecdc/bridge/internal/testpki"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer = syncbuf.Buffer

// quiet drops net/http's log of refused handshakes.
var quiet = log.New(io.Discard, "", 0)

// fixture is an HTTPS server on 127.0.0.1 whose certificate comes from
// files in dir.
type fixture struct {
	ca       *testpki.CA
	dir      string
	cfg      config.ServerTLS
	stls     *reload.ServerTLS
	addr     string
	log      *syncBuffer
	clientCA *testpki.CA
}

// serve starts the server with a certificate named cn; with mutual, it
// requires client certificates of f.clientCA.
func serve(t *testing.T, cn string, mutual bool) *fixture {
	t.Helper()
	f := &fixture{ca: testpki.NewCA(t, "server CA"), dir: t.TempDir(), log: &syncBuffer{}}
	f.cfg.CertFile, f.cfg.KeyFile = f.ca.WriteFiles(t, f.dir, "server", testpki.Localhost(cn))
	if mutual {
		f.clientCA = testpki.NewCA(t, "client CA")
		f.cfg.ClientCAFile = f.clientCA.WriteCA(t, f.dir, "clients")
	}
	var err error
	f.stls, err = reload.NewServerTLS("serve.tls", f.cfg, slog.New(slog.NewTextHandler(f.log, nil)))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.addr = ln.Addr().String()
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }),
		TLSConfig: f.stls.Config(),
		ErrorLog:  quiet,
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

// rotate writes a new certificate named cn (key and certificate, each
// renamed into place, the key first as cert-manager does not promise).
func (f *fixture) rotate(t *testing.T, cn string) {
	t.Helper()
	c, k := f.ca.Issue(t, testpki.Localhost(cn))
	testpki.WriteFile(t, f.cfg.KeyFile, k)
	testpki.WriteFile(t, f.cfg.CertFile, c)
}

// dial opens a TLS connection trusting the server's CA and returns the
// name on the certificate it was served.
func (f *fixture) dial(t *testing.T, certs ...tls.Certificate) (*tls.Conn, string) {
	t.Helper()
	c, err := tls.Dial("tcp", f.addr, &tls.Config{RootCAs: f.ca.Pool(), ServerName: "localhost", Certificates: certs})
	require.NoError(t, err)
	return c, c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// served returns the name on the certificate a new connection gets.
func (f *fixture) served(t *testing.T) string {
	t.Helper()
	c, cn := f.dial(t)
	_ = c.Close()
	return cn
}

// get sends one HTTP/1.1 request on c and returns the status.
func get(t *testing.T, c net.Conn) string {
	t.Helper()
	_, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Status
}

// TestServerTLSReloadsOnFileChange rotates the certificate files under a
// running server: new connections get the new certificate, a connection
// opened before keeps working.
func TestServerTLSReloadsOnFileChange(t *testing.T) {
	f := serve(t, "first", false)
	require.NoError(t, f.stls.Watch(t.Context(), nil))
	inFlight, cn := f.dial(t)
	defer inFlight.Close()
	require.Equal(t, "first", cn)
	require.Equal(t, "200 OK", get(t, inFlight))

	f.rotate(t, "second")
	require.Eventually(t, func() bool { return f.served(t) == "second" }, 30*time.Second, 20*time.Millisecond,
		"a new connection gets the rotated certificate")
	require.Equal(t, "200 OK", get(t, inFlight), "the connection opened before still serves")
	require.Equal(t, "first", inFlight.ConnectionState().PeerCertificates[0].Subject.CommonName)
	require.Contains(t, f.log.String(), "TLS certificate reloaded")

	// Kubernetes' secret volumes: the files are links through ..data,
	// which is swapped for a new directory.
	dir := t.TempDir()
	gen := func(name, cn string) {
		g := filepath.Join(dir, name)
		require.NoError(t, os.Mkdir(g, 0o755))
		f.ca.WriteFiles(t, g, "tls", testpki.Localhost(cn))
		require.NoError(t, os.Symlink(name, filepath.Join(dir, "..data_tmp")))
		require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	}
	gen("..gen1", "k8s-1")
	require.NoError(t, os.Symlink("..data/tls.crt", filepath.Join(dir, "tls.crt")))
	require.NoError(t, os.Symlink("..data/tls.key", filepath.Join(dir, "tls.key")))
	k8s := serveFiles(t, f.ca, config.ServerTLS{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")})
	require.NoError(t, k8s.stls.Watch(t.Context(), nil))
	require.Equal(t, "k8s-1", k8s.served(t))
	gen("..gen2", "k8s-2")
	require.Eventually(t, func() bool { return k8s.served(t) == "k8s-2" }, 30*time.Second, 20*time.Millisecond,
		"a swapped ..data link is seen")
}

// serveFiles is serve with given files.
func serveFiles(t *testing.T, ca *testpki.CA, c config.ServerTLS) *fixture {
	t.Helper()
	f := &fixture{ca: ca, cfg: c, log: &syncBuffer{}}
	var err error
	f.stls, err = reload.NewServerTLS("http.tls", c, slog.New(slog.NewTextHandler(f.log, nil)))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.NotFoundHandler(), TLSConfig: f.stls.Config(), ErrorLog: quiet}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

// TestServerTLSReloadsOnSIGHUP sends SIGHUP to this process: the files
// are read again then, and not before (nothing watches them here).
func TestServerTLSReloadsOnSIGHUP(t *testing.T) {
	// The test's own subscription keeps SIGHUP from ending the process
	// whatever happens below.
	guard := make(chan os.Signal, 1)
	signal.Notify(guard, syscall.SIGHUP)
	defer signal.Stop(guard)

	f := serve(t, "first", false)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	trigger := reload.OnSIGHUP(ctx)
	require.NoError(t, reload.Watch(ctx, slog.New(slog.DiscardHandler), nil, trigger, func() { _ = f.stls.Reload() }))

	f.rotate(t, "second")
	require.Equal(t, "first", f.served(t), "nothing reloads without the signal")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return f.served(t) == "second" }, 30*time.Second, 20*time.Millisecond)
}

// TestServerTLSBadReloadKeepsCertificate writes broken files over a
// serving certificate: the previous one stays and the error is logged
// naming the file.
func TestServerTLSBadReloadKeepsCertificate(t *testing.T) {
	f := serve(t, "first", false)
	testpki.WriteFile(t, f.cfg.CertFile, []byte("not a certificate\n"))
	err := f.stls.Reload()
	require.Error(t, err)
	assert.Equal(t, fmt.Sprintf("serve.tls.cert_file: no PEM certificate in %s (want the PEM certificate chain the listener presents, leaf first)", f.cfg.CertFile), err.Error())
	require.Equal(t, "first", f.served(t))
	require.Contains(t, f.log.String(), "TLS files did not reload: serving the previous certificate")

	// A certificate whose key has not been written yet.
	other := testpki.NewCA(t, "other")
	c, _ := other.Issue(t, testpki.Localhost("second"))
	testpki.WriteFile(t, f.cfg.CertFile, c)
	err = f.stls.Reload()
	require.ErrorContains(t, err, "serve.tls.key_file: "+f.cfg.KeyFile+" does not hold the private key of "+f.cfg.CertFile)
	require.Equal(t, "first", f.served(t))
}

// TestServerTLSMutual requires client certificates of the configured CA.
func TestServerTLSMutual(t *testing.T) {
	f := serve(t, "server", true)
	client := func(certs ...tls.Certificate) error {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.ca.Pool(), ServerName: "localhost", Certificates: certs}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://" + f.addr + "/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	require.NoError(t, client(f.clientCA.ClientCert(t, "reader")))
	err := client()
	require.Error(t, err, "no client certificate")
	require.ErrorContains(t, err, "certificate required")
	err = client(testpki.NewCA(t, "stranger").ClientCert(t, "intruder"))
	require.Error(t, err, "a client certificate of another CA")
	require.ErrorContains(t, err, "tls: ")
}

// TestCheck names the key and the file of each problem, with what the
// file should hold.
func TestCheck(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	dir := t.TempDir()
	cert, key := ca.WriteFiles(t, dir, "good", testpki.Localhost("good"))
	expCert, expKey := ca.WriteFiles(t, dir, "expired", testpki.Leaf{CommonName: "old", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	_, otherKey := ca.WriteFiles(t, dir, "other", testpki.Localhost("other"))
	junk := filepath.Join(dir, "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("hello"), 0o600))
	missing := filepath.Join(dir, "missing.pem")
	ca2 := ca.WriteCA(t, dir, "ca")

	msgs := func(errs []error) []string {
		var out []string
		for _, e := range errs {
			out = append(out, e.Error())
		}
		return out
	}
	assert.Empty(t, reload.Check("http.tls", config.ServerTLS{CertFile: cert, KeyFile: key, ClientCAFile: ca2}))
	assert.Empty(t, reload.Check("http.tls", config.ServerTLS{}))
	assert.Equal(t, []string{
		"http.tls.cert_file: open " + missing + ": no such file or directory (want the PEM certificate chain the listener presents, leaf first)",
		"http.tls.key_file: open " + missing + ": no such file or directory (want the PEM private key of cert_file)",
		"http.tls.client_ca_file: open " + missing + ": no such file or directory (want the PEM certificates of the CAs that sign client certificates)",
	}, msgs(reload.Check("http.tls", config.ServerTLS{CertFile: missing, KeyFile: missing, ClientCAFile: missing})))
	assert.Equal(t, []string{
		"serve.tls.cert_file: no PEM certificate in " + junk + " (want the PEM certificate chain the listener presents, leaf first)",
		"serve.tls.client_ca_file: no PEM certificate in " + junk + " (want the PEM certificates of the CAs that sign client certificates)",
	}, msgs(reload.Check("serve.tls", config.ServerTLS{CertFile: junk, KeyFile: key, ClientCAFile: junk})))
	assert.Equal(t, []string{
		"serve.tls.key_file: " + otherKey + " does not hold the private key of " + cert + ": tls: private key does not match public key",
	}, msgs(reload.Check("serve.tls", config.ServerTLS{CertFile: cert, KeyFile: otherKey})))
	errs := msgs(reload.Check("serve.tls", config.ServerTLS{CertFile: expCert, KeyFile: expKey}))
	require.Len(t, errs, 1)
	assert.Regexp(t, `^serve.tls.cert_file: the certificate in `+expCert+` expired at \S+: renew it`, errs[0])
}
