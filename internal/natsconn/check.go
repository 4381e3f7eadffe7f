package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/bridgecdc/bridge/config"
)

// Check returns the problems of section path (e.g. "nats", or "" for a
// plugin block's own keys): its nats CLI context (Resolve) and the files
// it names, read now: a creds file without a user JWT and seed or whose
// JWT has expired, an nkey seed file without a user seed, a CA file
// without a PEM certificate, a client certificate that does not load,
// whose key does not fit, or that is not valid now. Each is a
// *config.FieldError at the key that names the file (or at path.context
// for a file the context names), saying what the file should hold.
func Check(path, url string, c config.NATSClient, now time.Time) []error {
	r, err := Resolve(path, url, c)
	if err != nil {
		return []error{err}
	}
	return r.check(now)
}

// check returns the problems of c's files.
func (c Conn) check(now time.Time) []error {
	var errs []error
	fail := func(key, format string, args ...any) {
		o := c.from[key]
		msg := fmt.Sprintf(format, args...)
		if o.field != "" {
			msg = fmt.Sprintf("%s of nats CLI context %q (%s): %s", o.field, o.context, o.file, msg)
		}
		errs = append(errs, &config.FieldError{Path: o.path, Msg: msg})
	}
	read := func(key, file, want string) []byte {
		b, err := os.ReadFile(file)
		if err != nil {
			fail(key, "%v (want %s)", err, want)
			return nil
		}
		return b
	}
	if c.Creds != "" {
		const want = "a .creds file: a user JWT and its nkey seed, from `nsc generate creds`"
		if b := read("creds", c.Creds, want); b != nil {
			tok, err := nkeys.ParseDecoratedJWT(b)
			if err == nil {
				var kp nkeys.KeyPair
				if kp, err = nkeys.ParseDecoratedNKey(b); err == nil {
					kp.Wipe()
				}
			}
			switch {
			case err != nil:
				fail("creds", "%s is not a .creds file: %v (want %s)", c.Creds, err, want)
			default:
				if msg := expired(tok, now); msg != "" {
					fail("creds", "the user JWT in %s %s: issue new credentials (`nsc generate creds`) and write them to %s (read again at each reconnect)", c.Creds, msg, c.Creds)
				}
			}
			clear(b)
		}
	}
	if c.UserJWT != "" {
		if msg := expired(c.UserJWT, now); msg != "" {
			fail("user_jwt", "the user JWT %s: issue a new one", msg)
		}
	}
	if c.NKeySeedFile != "" {
		if b := read("nkey_seed_file", c.NKeySeedFile, "a user's nkey seed, SU..., from `nk -gen user`"); b != nil {
			clear(b)
			kp, err := readSeed(c.NKeySeedFile)
			if err != nil {
				fail("nkey_seed_file", "%s: %v", c.NKeySeedFile, err)
			} else {
				if pub, err := kp.PublicKey(); err == nil && !nkeys.IsValidPublicUserKey(pub) {
					fail("nkey_seed_file", "%s holds the seed of an account, operator or server key, not of a user (want a seed starting with SU)", c.NKeySeedFile)
				}
				kp.Wipe()
			}
		}
	}
	if f := c.TLS.CAFile; f != "" {
		const want = "the PEM certificates of the CAs that sign the NATS servers' certificates"
		if b := read("tls.ca_file", f, want); b != nil && !x509.NewCertPool().AppendCertsFromPEM(b) {
			fail("tls.ca_file", "no PEM certificate in %s (want %s)", f, want)
		}
	}
	if c.TLS.CertFile != "" && c.TLS.KeyFile != "" {
		certPEM := read("tls.cert_file", c.TLS.CertFile, "the PEM client certificate the bridge presents to NATS, leaf first")
		keyPEM := read("tls.key_file", c.TLS.KeyFile, "the PEM private key of "+c.TLS.CertFile)
		if certPEM != nil && keyPEM != nil {
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			switch {
			case err != nil && !strings.Contains(string(certPEM), "CERTIFICATE"):
				fail("tls.cert_file", "no PEM certificate in %s (want the PEM client certificate the bridge presents to NATS, leaf first)", c.TLS.CertFile)
			case err != nil:
				fail("tls.key_file", "%s does not hold the private key of %s: %v", c.TLS.KeyFile, c.TLS.CertFile, err)
			case now.After(cert.Leaf.NotAfter):
				fail("tls.cert_file", "the client certificate in %s expired at %s: renew it (it is read again at each reconnect)", c.TLS.CertFile, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
			case now.Before(cert.Leaf.NotBefore):
				fail("tls.cert_file", "the client certificate in %s is not valid before %s: check this machine's clock, or use a certificate valid now", c.TLS.CertFile, cert.Leaf.NotBefore.UTC().Format(time.RFC3339))
			}
		}
		clear(keyPEM)
	}
	return errs
}

// expired returns "expired at <time>" when the user JWT tok has expired
// by now, "" otherwise (or when tok does not decode: the server says so).
func expired(tok string, now time.Time) string {
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil || uc.Expires == 0 || now.Unix() < uc.Expires {
		return ""
	}
	return "expired at " + time.Unix(uc.Expires, 0).UTC().Format(time.RFC3339)
}
