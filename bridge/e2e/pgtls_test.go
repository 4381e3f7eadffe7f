package e2e_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/internal/testpki"
)

// TestPostgresTLS runs the bridge against a Postgres with ssl on and
// test-generated certificates, where role bridgecert may connect only over
// TLS with a client certificate (pg_hba cert):
//
//   - sslmode=verify-full with sslrootcert, sslcert and sslkey: the regular
//     and the replication connections both use TLS with the client
//     certificate (pg_stat_ssl), and every change arrives exactly once across
//     two Postgres restarts mid-stream (the reconnections use TLS too);
//   - sslmode=require without sslrootcert: TLS without verification works;
//   - a wrong CA, a client certificate from another CA, no client
//     certificate, a server certificate for another host or expired, and a
//     server with ssl off: the first run stops, not retried, with one line
//     naming the file and the fix;
//   - an sslrootcert file that does not exist: a configuration error at the
//     dsn's path, naming the file.
func TestPostgresTLS(t *testing.T) {
	defer parallel(t)()
	certs := testpki.WriteCerts(t, t.TempDir(), "bridgecert")
	e := newEnvWith(t, pgtest.Options{TLS: &pgtest.TLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CA}, HBA: []string{
		"hostssl all bridgecert 127.0.0.1/32 cert",
		"hostnossl all bridgecert 127.0.0.1/32 reject",
	}})
	e.pg.ExecT(t, `CREATE ROLE bridgecert LOGIN SUPERUSER`, `CREATE TABLE ev (id bigserial PRIMARY KEY, w int, n int)`)
	dsn := func(user string, params ...string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?%s", user, e.pg.Port, strings.Join(params, "&"))
	}
	verify := "sslmode=verify-full&sslrootcert=" + certs.CA
	client := "sslcert=" + certs.ClientCert + "&sslkey=" + certs.ClientKey

	t.Run("verify-full with a client certificate, exactly once across restarts", func(t *testing.T) {
		path := e.config("pgtls", "")
		edit(t, path, e.pg.DSN(""), dsn("bridgecert", verify, client))
		r := e.start(path)
		waitReady(t, r)

		// Every connection of the source uses TLS with the client
		// certificate: the catalog connection and the walsender.
		type conn struct {
			backend, dn string
			ssl         bool
		}
		read := func() []conn {
			ctx := context.Background()
			admin, err := pgx.Connect(ctx, e.pg.DSN(""))
			require.NoError(t, err)
			defer admin.Close(ctx)
			rows, err := admin.Query(context.Background(), `SELECT a.backend_type, coalesce(s.ssl, false), coalesce(s.client_dn, '')
				FROM pg_stat_activity a LEFT JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'bridge:app' ORDER BY 1`)
			require.NoError(t, err)
			out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (c conn, err error) {
				return c, r.Scan(&c.backend, &c.ssl, &c.dn)
			})
			require.NoError(t, err)
			return out
		}
		want := []conn{{"client backend", "/CN=bridgecert", true}, {"walsender", "/CN=bridgecert", true}}
		require.Equal(t, want, read())

		insertAcrossRestarts(t, e, "CDC_pgtls")
		require.Eventually(t, func() bool { return len(read()) == 2 }, time.Minute, 50*time.Millisecond)
		require.Equal(t, want, read(), "the connections made after the restarts use TLS too")
		r.stop(t)
	})

	t.Run("sslmode=require without sslrootcert encrypts without verifying", func(t *testing.T) {
		path := e.config("pgrequire", "")
		edit(t, path, e.pg.DSN(""), dsn("postgres", "sslmode=require"))
		r := e.start(path)
		waitReady(t, r)
		var n int
		require.NoError(t, e.pg.Conn(t, "").QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
			WHERE a.application_name = 'bridge:app' AND s.ssl`).Scan(&n))
		require.Equal(t, 2, n, "both connections use TLS")
		e.pg.ExecT(t, `INSERT INTO ev (w, n) VALUES (9, 1)`)
		e.waitStored("CDC_pgrequire", 1, 30*time.Second)
		r.stop(t)
	})

	for _, c := range []struct {
		name string
		dsn  string
		want []string
	}{
		{"wrong CA", dsn("postgres", "sslmode=verify-full&sslrootcert="+certs.OtherCA),
			[]string{"the server's certificate (issued by CN=pgtest CA) is not signed by the CA in sslrootcert " + certs.OtherCA,
				"fix: set sslrootcert in the source's dsn to the file of the CA that signed the server's certificate"}},
		{"wrong CA with sslmode=require", dsn("postgres", "sslmode=require&sslrootcert="+certs.OtherCA),
			[]string{"is not signed by the CA in sslrootcert " + certs.OtherCA}},
		{"client certificate from another CA", dsn("bridgecert", verify, "sslcert="+certs.OtherClientCert+"&sslkey="+certs.OtherClientKey),
			[]string{`the server does not accept the client certificate in sslcert ` + certs.OtherClientCert + ` for user "bridgecert"`,
				"fix: use a client certificate signed by a CA in the server's ssl_ca_file"}},
		{"no client certificate", dsn("bridgecert", verify),
			[]string{`the server requires a client certificate for user "bridgecert", and the source's dsn sets no sslcert`,
				"fix: set sslcert and sslkey in the source's dsn"}},
		{"no TLS for a role that needs it", dsn("bridgecert", "sslmode=disable"),
			[]string{`rejects connection for host "127.0.0.1", user "bridgecert"`, "no encryption",
				"fix: if the server accepts this user over TLS only (hostssl in pg_hba.conf), set sslmode=verify-full and sslrootcert"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			stopsAtOnce(t, e, c.dsn, c.want)
		})
	}

	t.Run("sslrootcert that does not exist", func(t *testing.T) {
		path := e.config("pgnoca", "")
		edit(t, path, e.pg.DSN(""), dsn("postgres", "sslmode=verify-full&sslrootcert=/nonexistent/ca.crt"))
		cfg, err := config.Load(path, app.ConfigOptions()...)
		require.NoError(t, err)
		_, err = app.New(cfg, app.WithLogger(testLogger(t)))
		require.ErrorContains(t, err, "sources.app.config.dsn: ")
		require.ErrorContains(t, err, "unable to read CA file: open /nonexistent/ca.crt: no such file or directory")
		require.ErrorContains(t, err, "sslrootcert, sslcert and sslkey must name PEM files the bridge can read")
	})

	// The server's certificate replaced (and reloaded) by one for another
	// host, then by an expired one.
	certDir := t.TempDir()
	replace := func(t *testing.T, c testpki.Leaf) {
		cert, key := certs.Signer.WriteFiles(t, certDir, c.CommonName, c)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, e.pg.ReplaceTLS(ctx, &pgtest.TLS{CertFile: cert, KeyFile: key, CAFile: certs.CA}))
	}
	t.Run("server certificate for another host", func(t *testing.T) {
		replace(t, testpki.Leaf{CommonName: "elsewhere", DNS: []string{"db.example.com"}, IPs: []net.IP{net.ParseIP("10.1.2.3")}})
		stopsAtOnce(t, e, dsn("postgres", verify), []string{
			"the server's certificate is not valid for host 127.0.0.1: it names db.example.com, 10.1.2.3 (sslmode=verify-full checks the name)",
			"fix: connect with a name the certificate holds"})
	})
	t.Run("expired server certificate", func(t *testing.T) {
		replace(t, testpki.Leaf{CommonName: "expired", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
		stopsAtOnce(t, e, dsn("postgres", verify), []string{
			"the server's certificate is not valid now (x509: certificate has expired or is not yet valid",
			"fix: renew the server's certificate"})
	})

	// Last: it turns TLS off.
	t.Run("server without TLS", func(t *testing.T) {
		e.pg.ExecT(t, `ALTER SYSTEM SET ssl = off`, `SELECT pg_reload_conf()`)
		stopsAtOnce(t, e, dsn("postgres", verify), []string{
			"the server does not accept TLS connections (ssl is off), but the source's dsn requires TLS (sslmode=verify-full)",
			"fix: turn TLS on in the server"})
	})
}

// stopsAtOnce runs the bridge of e's config with dsn and requires its first
// run to stop, not retried, with an error of one line holding want.
func stopsAtOnce(t *testing.T, e *env, dsn string, want []string) {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' {
			return r
		}
		return -1
	}, strings.ToLower(t.Name()[strings.LastIndex(t.Name(), "/")+1:]))
	path := e.config(name, "")
	edit(t, path, e.pg.DSN(""), dsn)
	started, _ := runFails(t, path, nil, want...)
	require.True(t, started, "the bridge started; its first run stopped")
}
