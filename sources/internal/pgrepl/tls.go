package pgrepl

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// explainConnect returns err, the failure to connect with dsn, as a
// *SetupError (which stops the bridge instead of retrying) when it is a TLS
// or certificate problem that retrying cannot cure: a server certificate
// that sslrootcert does not vouch for, that names another host or has
// expired; a server without TLS while sslmode requires it; a client
// certificate the server does not accept. The SetupError names the DSN
// parameter and its file, and says what to change. Any other err is
// returned as it is.
func explainConnect(dsn string, err error) error {
	if err == nil {
		return nil
	}
	what, fix := tlsProblem(dsn, err)
	if what == "" {
		return err
	}
	return &SetupError{What: what, Fix: fix}
}

// tlsProblem returns what went wrong and the fix, or "" when err is no TLS
// or certificate problem.
func tlsProblem(dsn string, err error) (what, fix string) {
	rootcert := dsnFile(dsn, "sslrootcert", "PGSSLROOTCERT", "root.crt")
	sslcert := dsnFile(dsn, "sslcert", "PGSSLCERT", "postgresql.crt")
	var (
		unknownCA   x509.UnknownAuthorityError
		badHost     x509.HostnameError
		invalid     x509.CertificateInvalidError
		pgErr       *pgconn.PgError
		opErr       *net.OpError
		serverCerts = "the server's certificate"
	)
	switch {
	case errors.As(err, &unknownCA):
		if unknownCA.Cert != nil {
			serverCerts = fmt.Sprintf("the server's certificate (issued by %s)", unknownCA.Cert.Issuer)
		}
		if rootcert == "" {
			return fmt.Sprintf("%s is not signed by a CA this system trusts, and the source's dsn sets no sslrootcert (%v)", serverCerts, unknownCA),
				"set sslrootcert=/path/to/ca.crt in the source's dsn to the CA that signed the server's certificate (for a managed database, the provider's CA bundle)"
		}
		return fmt.Sprintf("%s is not signed by the CA in sslrootcert %s (%v)", serverCerts, rootcert, unknownCA),
			fmt.Sprintf("set sslrootcert in the source's dsn to the file of the CA that signed the server's certificate instead of %s (for a managed database, the provider's CA bundle)", rootcert)
	case errors.As(err, &badHost):
		names := "no host name"
		if c := badHost.Certificate; c != nil {
			var all []string
			all = append(all, c.DNSNames...)
			for _, ip := range c.IPAddresses {
				all = append(all, ip.String())
			}
			if len(all) > 0 {
				names = strings.Join(all, ", ")
			}
		}
		return fmt.Sprintf("the server's certificate is not valid for host %s: it names %s (sslmode=verify-full checks the name)", badHost.Host, names),
			"connect with a name the certificate holds (host in the source's dsn), or have the server's certificate reissued for this name; sslmode=verify-ca checks the CA but not the name"
	case errors.As(err, &invalid):
		if invalid.Reason == x509.Expired {
			return fmt.Sprintf("the server's certificate is not valid now (%v)", invalid),
				"renew the server's certificate (ssl_cert_file in postgresql.conf, then SELECT pg_reload_conf()), or correct this machine's clock"
		}
		return fmt.Sprintf("the server's certificate cannot be used (%v)", invalid),
			"have the server's certificate (ssl_cert_file in postgresql.conf) reissued as a TLS server certificate signed by the CA in sslrootcert"
	case strings.Contains(err.Error(), "server refused TLS connection"):
		mode := dsnParam(dsn, "sslmode")
		if mode == "" {
			mode = os.Getenv("PGSSLMODE")
		}
		return fmt.Sprintf("the server does not accept TLS connections (ssl is off), but the source's dsn requires TLS (sslmode=%s)", mode),
			"turn TLS on in the server (ssl = on, with ssl_cert_file and ssl_key_file, in postgresql.conf, then SELECT pg_reload_conf()); only on a network you trust, set sslmode=disable in the dsn"
	case errors.As(err, &pgErr) && pgErr.Code == "28000":
		msg := pgErr.Message
		switch {
		case strings.Contains(msg, "requires a valid client certificate"):
			if sslcert == "" {
				return fmt.Sprintf("the server requires a client certificate for user %q, and the source's dsn sets no sslcert (%s)", pgUser(err), msg),
					"set sslcert and sslkey in the source's dsn to a certificate whose CN is the user, signed by a CA in the server's ssl_ca_file"
			}
			return fmt.Sprintf("the server does not accept the client certificate in sslcert %s for user %q (%s)", sslcert, pgUser(err), msg),
				"use a client certificate signed by a CA in the server's ssl_ca_file (sslcert and sslkey in the source's dsn), or add its CA to ssl_ca_file"
		case strings.Contains(msg, "certificate authentication failed"):
			return fmt.Sprintf("the client certificate in sslcert %s is not for user %q (%s)", sslcert, pgUser(err), msg),
				"use a certificate whose CN is the user name, or map its CN to the user in pg_ident.conf"
		case strings.Contains(msg, "no encryption"):
			return msg + " (the connection did not use TLS)",
				"if the server accepts this user over TLS only (hostssl in pg_hba.conf), set sslmode=verify-full and sslrootcert in the source's dsn; otherwise add a pg_hba.conf line for it"
		}
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		// A TLS alert from the server during the handshake.
		if sslcert == "" {
			return fmt.Sprintf("the server ended the TLS handshake (%v)", opErr), "check the server's log for the reason; if it requires a client certificate, set sslcert and sslkey in the source's dsn"
		}
		return fmt.Sprintf("the server ended the TLS handshake, refusing the client certificate in sslcert %s or the connection's TLS settings (%v)", sslcert, opErr),
			"use a client certificate signed by a CA in the server's ssl_ca_file (sslcert and sslkey in the source's dsn); the server's log says why"
	}
	return "", ""
}

// pgUser returns the user of a connection attempt, from err.
func pgUser(err error) string {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		return ce.Config.User
	}
	return ""
}

// dsnFile returns the file the DSN's parameter key names, else the one the
// variable env names, else ~/.postgresql/def when it exists (where libpq
// and pgx look by default), else "".
func dsnFile(dsn, key, env, def string) string {
	if v := dsnParam(dsn, key); v != "" {
		return v
	}
	if v := os.Getenv(env); v != "" {
		return v
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".postgresql", def)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// dsnParam returns the value of parameter key in dsn, a URL
// (postgres://...?sslrootcert=/ca.crt) or key=value pairs
// (sslrootcert='/ca.crt'), or "" when it is not set.
func dsnParam(dsn, key string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return ""
		}
		return u.Query().Get(key)
	}
	value := ""
	s := dsn
	for {
		s = strings.TrimLeft(s, " \t\n\r\v\f")
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return value
		}
		k := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t\n\r\v\f")
		var v strings.Builder
		quoted := strings.HasPrefix(s, "'")
		if quoted {
			s = s[1:]
		}
		i := 0
		for ; i < len(s); i++ {
			c := s[i]
			if quoted && c == '\'' || !quoted && strings.IndexByte(" \t\n\r\v\f", c) >= 0 {
				break
			}
			if c == '\\' && i+1 < len(s) {
				i++
				c = s[i]
			}
			v.WriteByte(c)
		}
		if quoted && i < len(s) {
			i++ // the closing quote
		}
		s = s[i:]
		if k == key {
			value = v.String() // the last one wins, as in libpq
		}
	}
}
