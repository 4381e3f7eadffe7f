package pgtest

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/internal/testpki"
)

func TestStartAndQuery(t *testing.T) {
	s := StartT(t, Options{})
	c := s.Conn(t, "")
	var wl string
	if err := c.QueryRow(context.Background(), "show wal_level").Scan(&wl); err != nil {
		t.Fatal(err)
	}
	if wl != "logical" {
		t.Fatalf("wal_level = %q, want logical", wl)
	}
}

// TestTLS starts a cluster with ssl on and a role that must present a
// client certificate, and connects with verify-full, with and without the
// certificate, and with the wrong CA.
func TestTLS(t *testing.T) {
	certs := testpki.WriteCerts(t, t.TempDir(), "certuser")
	s := StartT(t, Options{TLS: &TLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CAFile: certs.CA}, HBA: []string{"hostssl all certuser 127.0.0.1/32 cert"}})
	s.ExecT(t, `CREATE ROLE certuser LOGIN`)
	ctx := context.Background()
	dsn := func(user, params string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?%s", user, s.Port, params)
	}
	verify := "sslmode=verify-full&sslrootcert=" + certs.CA

	connect := func(dsn string) (ssl bool, clientDN string, err error) {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false, "", err
		}
		defer c.Close(ctx)
		err = c.QueryRow(ctx, `SELECT ssl, coalesce(client_dn, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &clientDN)
		return ssl, clientDN, err
	}
	if ssl, _, err := connect(dsn("postgres", verify)); err != nil || !ssl {
		t.Fatalf("verify-full: ssl %v, err %v", ssl, err)
	}
	if ssl, _, err := connect(dsn("postgres", "sslmode=disable")); err != nil || ssl {
		t.Fatalf("sslmode=disable: ssl %v, err %v", ssl, err)
	}
	ssl, dn, err := connect(dsn("certuser", verify+"&sslcert="+certs.ClientCert+"&sslkey="+certs.ClientKey))
	if err != nil || !ssl || dn != "/CN=certuser" {
		t.Fatalf("client certificate: ssl %v, client_dn %q, err %v", ssl, dn, err)
	}
	if _, _, err := connect(dsn("certuser", verify)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("certuser without a certificate: err %v, want a refusal", err)
	}
	var unknownCA x509.UnknownAuthorityError
	if _, _, err := connect(dsn("postgres", "sslmode=verify-full&sslrootcert="+certs.OtherCA)); !errors.As(err, &unknownCA) {
		t.Fatalf("wrong CA: err %v, want x509.UnknownAuthorityError", err)
	}
}

// TestEveryMajorStarts starts a cluster of each major of the matrix and
// checks that it runs that major with logical decoding, and that only the
// majors with wal2json say so.
func TestEveryMajorStarts(t *testing.T) {
	for _, m := range Majors() {
		t.Run(fmt.Sprint("pg", m), func(t *testing.T) {
			t.Parallel()
			s := StartT(t, Options{Major: m})
			if s.Major != m {
				t.Fatalf("asked for PostgreSQL %d, got %d", m, s.Major)
			}
			c := s.Conn(t, "")
			var lsn string
			if err := c.QueryRow(t.Context(), `SELECT lsn::text FROM pg_create_logical_replication_slot('s', 'pgoutput')`).Scan(&lsn); err != nil {
				t.Fatalf("PostgreSQL %d cannot create a pgoutput slot: %v", m, err)
			}
			_, err := c.Exec(t.Context(), `SELECT pg_create_logical_replication_slot('w', 'wal2json')`)
			if has := HasWal2json(m); has != (err == nil) {
				t.Fatalf("PostgreSQL %d: HasWal2json = %v, but creating a wal2json slot gave %v", m, has, err)
			}
		})
	}
}

// TestStandbyPromote makes a standby of a PostgreSQL 17 primary, sees a
// row reach it, promotes it and writes to it.
func TestStandbyPromote(t *testing.T) {
	p := StartT(t, Options{Major: 17})
	p.ExecT(t, `CREATE TABLE t (id int)`, `INSERT INTO t VALUES (1)`)
	s := NewStandbyT(t, p, StandbyOptions{})
	p.ExecT(t, `INSERT INTO t VALUES (2)`)
	c := s.Conn(t, "")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := c.QueryRow(t.Context(), `SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby has %d rows of 2 after 30s:\n%s", n, s.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.Exec(t.Context(), `INSERT INTO t VALUES (3)`); err == nil {
		t.Fatal("a standby accepted a write")
	}
	if err := s.Promote(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.ExecT(t, `INSERT INTO t VALUES (3)`)
}
