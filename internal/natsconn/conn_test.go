package natsconn_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/testpki"
	"github.com/bridgecdc/bridge/sinks"
)

// connect resolves the nats section {url, c} and connects with it.
func connect(t *testing.T, url string, c config.NATSClient) error {
	t.Helper()
	for _, err := range natsconn.Check("nats", url, c, time.Now()) {
		return err
	}
	conn, err := natsconn.Resolve("nats", url, c)
	require.NoError(t, err)
	nc, err := natsconn.Connect(conn, "test", nats.Timeout(5*time.Second))
	if err == nil {
		nc.Close()
	}
	return err
}

// TestConnectTLS: against nats-servers requiring TLS (with client
// certificates: verify true), the nats.tls keys connect, and each
// misconfiguration fails with one line naming the key, the file and the
// fix, as a permanent error.
func TestConnectTLS(t *testing.T) {
	p := testpki.WriteCerts(t, t.TempDir(), "bridge")
	server := p.Server(t, testpki.Localhost("nats"))
	mtls := natsembed.StartT(t, natsembed.Options{TLS: p.Mutual(server)})
	oneWay := natsembed.StartT(t, natsembed.Options{TLS: &tls.Config{Certificates: []tls.Certificate{server}, MinVersion: tls.VersionTLS12}})
	first := natsembed.StartT(t, natsembed.Options{TLS: &tls.Config{Certificates: []tls.Certificate{server}, MinVersion: tls.VersionTLS12}, TLSHandshakeFirst: true})
	expired := natsembed.StartT(t, natsembed.Options{TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.Server(t, testpki.Leaf{
		CommonName: "old", IPs: testpki.Localhost("").IPs, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})}}})
	elsewhere := natsembed.StartT(t, natsembed.Options{TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{p.Server(t, testpki.Leaf{
		CommonName: "elsewhere", DNS: []string{"nats.example.com"}})}}})
	plain := natsembed.StartT(t, natsembed.Options{})
	tlsURL := func(s *natsembed.Server) string { return "tls://" + strings.TrimPrefix(s.URL(), "nats://") }
	mutual := config.NATSTLS{CAFile: p.CA, CertFile: p.ClientCert, KeyFile: p.ClientKey}

	t.Run("mutual TLS", func(t *testing.T) {
		require.NoError(t, connect(t, mtls.URL(), config.NATSClient{TLS: mutual}))
		require.NoError(t, connect(t, tlsURL(mtls), config.NATSClient{TLS: mutual}))
	})
	t.Run("server name", func(t *testing.T) {
		require.NoError(t, connect(t, elsewhere.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA, ServerName: "nats.example.com"}}))
	})
	t.Run("handshake first", func(t *testing.T) {
		require.NoError(t, connect(t, first.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA, HandshakeFirst: true}}))
	})
	t.Run("insecure_skip_verify", func(t *testing.T) {
		require.NoError(t, connect(t, oneWay.URL(), config.NATSClient{TLS: config.NATSTLS{InsecureSkipVerify: true}}))
	})

	for _, c := range []struct {
		name string
		url  string
		c    config.NATSClient
		want []string
	}{
		{"wrong CA", mtls.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.OtherCA, CertFile: p.ClientCert, KeyFile: p.ClientKey}},
			[]string{"nats.tls.ca_file " + p.OtherCA + " does not sign the NATS server's certificate (issued by CN=pgtest CA)",
				"fix: set nats.tls.ca_file to the PEM file of the CA that signed the NATS server's certificate"}},
		{"no CA for a server of a private CA", tlsURL(oneWay), config.NATSClient{},
			[]string{"the NATS server's certificate (issued by CN=pgtest CA) is not signed by a CA this system trusts, and nats.tls.ca_file is not set",
				"fix: set nats.tls.ca_file"}},
		{"no client certificate", mtls.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA}},
			[]string{"the NATS server requires a client certificate (tls verify: true), and nats.tls.cert_file is not set",
				"fix: set nats.tls.cert_file and nats.tls.key_file to a client certificate signed by a CA the NATS server trusts"}},
		{"client certificate of another CA", mtls.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA, CertFile: p.OtherClientCert, KeyFile: p.OtherClientKey}},
			[]string{"the NATS server refused the client certificate in nats.tls.cert_file " + p.OtherClientCert,
				"fix: use a client certificate signed by a CA in the NATS server's tls ca_file"}},
		{"expired server certificate", expired.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA}},
			[]string{"the NATS server's certificate is not valid now (x509: certificate has expired or is not yet valid",
				"fix: renew the NATS server's certificate"}},
		{"server certificate for another host", elsewhere.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA}},
			[]string{"the NATS server's certificate is not valid for 127.0.0.1: it names nats.example.com",
				"fix: connect with a name the certificate holds (nats.url), or set nats.tls.server_name to one of them"}},
		{"TLS to a server without it", plain.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA}},
			[]string{"does not offer TLS, which the bridge requires because nats.tls.ca_file is set", "fix: turn TLS on in the NATS server"}},
		{"tls:// to a server without it", tlsURL(plain), config.NATSClient{},
			[]string{"does not offer TLS, which the bridge requires because nats.url is a tls:// URL"}},
		{"handshake_first to a server that sends INFO first", oneWay.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA, HandshakeFirst: true}},
			[]string{"the NATS server does not start with TLS, but nats.tls.handshake_first is set", "fix: remove nats.tls.handshake_first"}},
		{"expired client certificate (found before connecting)", mtls.URL(), config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA, CertFile: p.ExpiredClientCert, KeyFile: p.ExpiredClientKey}},
			[]string{"nats.tls.cert_file: the client certificate in " + p.ExpiredClientCert + " expired at ", "renew it"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := connect(t, c.url, c.c)
			require.Error(t, err)
			for _, w := range c.want {
				assert.ErrorContains(t, err, w)
			}
			assert.NotContains(t, err.Error(), "\n")
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				assert.True(t, sinks.IsPermanent(err), "permanent: %v", err)
			}
			t.Logf("%v", err)
		})
	}
}

// TestCheckFiles: the files the keys name are read at start, each problem
// at its key, naming the file and what it should hold.
func TestCheckFiles(t *testing.T) {
	p := testpki.WriteCerts(t, t.TempDir(), "bridge")
	dir := t.TempDir()
	write := func(name, content string) string {
		f := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(f, []byte(content), 0o600))
		return f
	}
	op, err := natsembed.NewOperator("O")
	require.NoError(t, err)
	acct, err := op.NewAccount("A", true)
	require.NoError(t, err)
	old, err := acct.Creds("old", jwt.Permissions{}, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	oldCreds := write("old.creds", string(old))
	akp, err := nkeys.CreateAccount()
	require.NoError(t, err)
	aseed, err := akp.Seed()
	require.NoError(t, err)
	accountSeed := write("account.nk", string(aseed))

	check := func(c config.NATSClient) []string {
		var out []string
		for _, err := range natsconn.Check("nats", "tls://nats:4222", c, time.Now()) {
			out = append(out, err.Error())
		}
		return out
	}
	assert.Empty(t, check(config.NATSClient{TLS: config.NATSTLS{CAFile: p.CA, CertFile: p.ClientCert, KeyFile: p.ClientKey}}))
	assert.Equal(t, []string{"nats.tls.ca_file: open /nonexistent/ca.crt: no such file or directory (want the PEM certificates of the CAs that sign the NATS servers' certificates)"},
		check(config.NATSClient{TLS: config.NATSTLS{CAFile: "/nonexistent/ca.crt"}}))
	notPEM := write("notpem.crt", "hello")
	assert.Equal(t, []string{"nats.tls.ca_file: no PEM certificate in " + notPEM + " (want the PEM certificates of the CAs that sign the NATS servers' certificates)"},
		check(config.NATSClient{TLS: config.NATSTLS{CAFile: notPEM}}))
	assert.Equal(t, []string{"nats.tls.key_file: " + p.OtherClientKey + " does not hold the private key of " + p.ClientCert + ": tls: private key does not match public key"},
		check(config.NATSClient{TLS: config.NATSTLS{CertFile: p.ClientCert, KeyFile: p.OtherClientKey}}))
	assert.Equal(t, []string{"nats.tls.cert_file: no PEM certificate in " + notPEM + " (want the PEM client certificate the bridge presents to NATS, leaf first)"},
		check(config.NATSClient{TLS: config.NATSTLS{CertFile: notPEM, KeyFile: p.ClientKey}}))
	got := check(config.NATSClient{TLS: config.NATSTLS{CertFile: p.ExpiredClientCert, KeyFile: p.ExpiredClientKey}})
	require.Len(t, got, 1)
	assert.Regexp(t, `^nats\.tls\.cert_file: the client certificate in .*expired[-a-z]*\.crt expired at 20\d\d-.*Z: renew it \(it is read again at each reconnect\)$`, got[0])

	assert.Equal(t, []string{"nats.creds: open /nonexistent/bridge.creds: no such file or directory (want a .creds file: a user JWT and its nkey seed, from `nsc generate creds`)"},
		check(config.NATSClient{Creds: "/nonexistent/bridge.creds"}))
	got = check(config.NATSClient{Creds: notPEM})
	require.Len(t, got, 1)
	assert.Contains(t, got[0], "nats.creds: "+notPEM+" is not a .creds file")
	got = check(config.NATSClient{Creds: oldCreds})
	require.Len(t, got, 1)
	assert.Regexp(t, `^nats\.creds: the user JWT in .*old\.creds expired at .*: issue new credentials \(`+"`nsc generate creds`"+`\)`, got[0])
	assert.Equal(t, []string{"nats.nkey_seed_file: " + accountSeed + " holds the seed of an account, operator or server key, not of a user (want a seed starting with SU)"},
		check(config.NATSClient{NKeySeedFile: accountSeed}))
	assert.Equal(t, []string{"nats.nkey_seed_file: " + notPEM + ": no nkey seed in the file (want a seed such as SUAM..., from `nk -gen user` or nsc)"},
		check(config.NATSClient{NKeySeedFile: notPEM}))
	for _, err := range natsconn.Check("nats", "", config.NATSClient{TLS: config.NATSTLS{CAFile: "/nonexistent"}}, time.Now()) {
		var fe *config.FieldError
		require.ErrorAs(t, err, &fe)
		assert.Equal(t, "nats.tls.ca_file", fe.Path)
	}
}

// TestNKeyAndCreds: an nkey user and a JWT user (operator mode) connect
// with nats.nkey_seed_file and nats.creds; refused credentials say which.
func TestNKeyAndCreds(t *testing.T) {
	dir := t.TempDir()
	pub, seed := natsembed.UserT(t)
	seedFile := filepath.Join(dir, "bridge.nk")
	require.NoError(t, os.WriteFile(seedFile, seed, 0o600))
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	require.NoError(t, connect(t, ns.ClientURL(), config.NATSClient{NKeySeedFile: seedFile}))
	err = connect(t, ns.ClientURL(), config.NATSClient{})
	require.ErrorContains(t, err, "requires authentication, and no credentials are set")
	_, oseed := natsembed.UserT(t)
	otherFile := filepath.Join(dir, "other.nk")
	require.NoError(t, os.WriteFile(otherFile, oseed, 0o600))
	err = connect(t, ns.ClientURL(), config.NATSClient{NKeySeedFile: otherFile})
	require.ErrorContains(t, err, "refused the credentials in nats.nkey_seed_file "+otherFile)
	require.True(t, sinks.IsPermanent(err))

	op, err := natsembed.NewOperator("O")
	require.NoError(t, err)
	acct, err := op.NewAccount("A", true)
	require.NoError(t, err)
	creds, err := acct.Creds("bridge", jwt.Permissions{}, time.Time{})
	require.NoError(t, err)
	credsFile := filepath.Join(dir, "bridge.creds")
	require.NoError(t, os.WriteFile(credsFile, creds, 0o600))
	srv := natsembed.StartT(t, natsembed.Options{Operator: op})
	require.NoError(t, connect(t, srv.URL(), config.NATSClient{Creds: credsFile}))
	// Credentials of an account the server does not know.
	op2, err := natsembed.NewOperator("O2")
	require.NoError(t, err)
	acct2, err := op2.NewAccount("B", true)
	require.NoError(t, err)
	creds2, err := acct2.Creds("bridge", jwt.Permissions{}, time.Time{})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(credsFile, creds2, 0o600))
	err = connect(t, srv.URL(), config.NATSClient{Creds: credsFile})
	require.ErrorContains(t, err, "refused the credentials in nats.creds "+credsFile)
}

// TestPermissionDenied: a request to a subject the user may not publish
// to gets no answer; PermissionDenied turns the timeout into "permission
// denied on <subject>" with the permission to grant. Other timeouts stay.
func TestPermissionDenied(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "u", Password: "p", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"ok.>"}},
		}}}})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	nc, err := natsconn.Connect(natsconn.Conn{URL: ns.ClientURL(), User: "u", Password: "p"}, "test")
	require.NoError(t, err)
	defer nc.Close()

	_, err = nc.Request("ok.nobody", nil, 200*time.Millisecond)
	require.Error(t, err)
	require.NoError(t, natsconn.PermissionDenied(nc, err), "no refusal yet: a plain timeout")

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = nc.RequestWithContext(ctx, "$KV.bucket.key", nil)
	require.Error(t, err)
	d := natsconn.PermissionDenied(nc, err)
	require.Error(t, d)
	assert.True(t, sinks.IsPermanent(d))
	assert.Contains(t, d.Error(), `permission denied on $KV.bucket.key: the NATS server refuses the bridge's user to publish to it`)
	assert.Contains(t, d.Error(), "fix: allow the bridge's NATS user to publish to $KV.bucket.>")
	assert.NoError(t, natsconn.PermissionDenied(nc, context.Canceled))

	for s, want := range map[string]string{
		"cdc.shop.public.orders":                "cdc.shop.public.orders",
		"$JS.API.STREAM.INFO.CDC":               "$JS.API.STREAM.INFO.CDC",
		"$JS.API.CONSUMER.CREATE.CDC.abc.cdc.>": "$JS.API.CONSUMER.CREATE.CDC.>",
		"$JS.API.DIRECT.GET.KV_b.$KV.b.k":       "$JS.API.DIRECT.GET.KV_b.>",
		"_INBOX.abc.*":                          "_INBOX.>",
		"$KV.bridge_checkpoints.shop.app":       "$KV.bridge_checkpoints.>",
	} {
		assert.Equal(t, want, natsconn.Grant(s), s)
	}
}
