package natsconn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// Error is a NATS connection failure that retrying cannot cure: a TLS
// problem, credentials the server refuses, a permission the user lacks.
// Its message is one line: what happened, naming the key and file
// involved, and the fix.
type Error struct {
	What, Fix string
	Err       error
}

func (e *Error) Error() string { return e.What + "; fix: " + e.Fix }

// Unwrap returns the error of the NATS client.
func (e *Error) Unwrap() error { return e.Err }

// Explain returns err, the failure to connect with c, as a permanent
// (sinks.Permanent) *Error when a change of configuration or certificate
// is its cure: the server's certificate not signed by the configured CA,
// expired, or for another host; a client certificate missing or refused;
// TLS required by one side only; credentials refused or expired. Any other
// err (a refused connection, a timeout) is returned as it is.
func (c Conn) Explain(err error) error {
	if err == nil {
		return nil
	}
	if e := c.explain(err); e != nil {
		return sinks.Permanent(e)
	}
	return err
}

func (c Conn) explain(err error) *Error {
	var (
		unknownCA x509.UnknownAuthorityError
		badHost   x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	msg := err.Error()
	lower := strings.ToLower(msg)
	caKey, certKey := c.Key("tls.ca_file"), c.Key("tls.cert_file")
	fail := func(fix, format string, args ...any) *Error {
		return &Error{What: fmt.Sprintf(format, args...), Fix: fix, Err: err}
	}
	issuer := func(cert *x509.Certificate) string {
		if cert == nil {
			return ""
		}
		return " (issued by " + cert.Issuer.String() + ")"
	}
	switch {
	case errors.As(err, &unknownCA):
		if c.TLS.CAFile == "" {
			return fail(fmt.Sprintf("set %s to the PEM file of the CA that signed the NATS server's certificate", caKey),
				"the NATS server's certificate%s is not signed by a CA this system trusts, and %s is not set (%v)", issuer(unknownCA.Cert), caKey, unknownCA)
		}
		return fail(fmt.Sprintf("set %s to the PEM file of the CA that signed the NATS server's certificate (the server's tls cert_file), instead of %s", caKey, c.TLS.CAFile),
			"%s %s does not sign the NATS server's certificate%s (%v)", caKey, c.TLS.CAFile, issuer(unknownCA.Cert), unknownCA)
	case errors.As(err, &badHost):
		names := "no host name"
		if cert := badHost.Certificate; cert != nil {
			all := append([]string(nil), cert.DNSNames...)
			for _, ip := range cert.IPAddresses {
				all = append(all, ip.String())
			}
			if len(all) > 0 {
				names = strings.Join(all, ", ")
			}
		}
		return fail(fmt.Sprintf("connect with a name the certificate holds (%s), or set %s to one of them, or have the server's certificate reissued for %s", c.Key("url"), c.Key("tls.server_name"), badHost.Host),
			"the NATS server's certificate is not valid for %s: it names %s", badHost.Host, names)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return fail("renew the NATS server's certificate (its tls cert_file; nats-server reloads it on SIGHUP), or correct this machine's clock",
			"the NATS server's certificate is not valid now (%v)", invalid)
	case errors.As(err, &invalid):
		return fail(fmt.Sprintf("have the NATS server's certificate reissued as a TLS server certificate signed by the CA in %s", caKey),
			"the NATS server's certificate cannot be used (%v)", invalid)
	case strings.Contains(lower, "first record does not look like a tls handshake"):
		if c.TLS.HandshakeFirst {
			return fail(fmt.Sprintf("remove %s (the server sends its INFO before TLS), or set handshake_first: true in the server's tls block", c.Key("tls.handshake_first")),
				"the NATS server does not start with TLS, but %s is set (%v)", c.Key("tls.handshake_first"), err)
		}
		return fail("check the URL's port: it is not a NATS server", "the server did not answer TLS (%v)", err)
	case errors.Is(err, nats.ErrSecureConnWanted):
		why := c.Key("url") + " is a tls:// URL"
		if c.TLS.Enabled() {
			why = "nats.tls is set"
			for _, k := range []string{"tls.ca_file", "tls.cert_file", "tls.server_name", "tls.handshake_first", "tls.insecure_skip_verify"} {
				if _, ok := c.from[k]; ok {
					why = c.Key(k) + " is set"
					break
				}
			}
		}
		return fail("turn TLS on in the NATS server (a tls block with cert_file and key_file), or, only on a network you trust, use a nats:// URL without the tls keys",
			"the NATS server at %s does not offer TLS, which the bridge requires because %s", config.Redact(c.URL), why)
	case errors.Is(err, nats.ErrSecureConnRequired):
		return fail(fmt.Sprintf("use a tls:// URL in %s, or set %s to the servers' CA", c.Key("url"), caKey),
			"the NATS server at %s requires TLS", config.Redact(c.URL))
	case strings.Contains(lower, "connection closed by remote after tls handshake"),
		strings.Contains(lower, "remote error: tls:"):
		// The server ended the connection over the client certificate
		// (verify: true): missing, from another CA, expired, or not for
		// client authentication.
		if c.TLS.CertFile == "" {
			return fail(fmt.Sprintf("set %s and %s to a client certificate signed by a CA the NATS server trusts (its tls ca_file)", certKey, c.Key("tls.key_file")),
				"the NATS server requires a client certificate (tls verify: true), and %s is not set (%v)", certKey, err)
		}
		return fail("use a client certificate signed by a CA in the NATS server's tls ca_file, valid now and for client authentication; the server's log says why it refused",
			"the NATS server refused the client certificate in %s %s (%v)", certKey, c.TLS.CertFile, err)
	case errors.Is(err, nats.ErrAuthExpired):
		return fail("issue new credentials for the bridge's user (`nsc generate creds`) and put them in "+c.credsName(),
			"the NATS server says the credentials in %s have expired", c.credsName())
	case errors.Is(err, nats.ErrAuthRevoked):
		return fail("issue credentials for a user that is not revoked (`nsc generate creds`) and put them in "+c.credsName(),
			"the NATS server says the credentials in %s are revoked", c.credsName())
	case errors.Is(err, nats.ErrAuthorization), strings.Contains(lower, "authorization violation"), strings.Contains(lower, "authentication"):
		if !c.hasCreds() {
			return fail(fmt.Sprintf("set the bridge's NATS credentials: %s, %s, %s and %s, or %s", c.Key("creds"), c.Key("nkey_seed_file"), c.Key("user"), c.Key("password"), c.Key("token")),
				"the NATS server at %s requires authentication, and no credentials are set (%v)", config.Redact(c.URL), err)
		}
		return fail("check that the NATS server knows these credentials (its authorization block, or the account's users in operator mode)",
			"the NATS server at %s refused the credentials in %s (%v)", config.Redact(c.URL), c.credsName(), err)
	case strings.Contains(lower, "nats: error loading") || strings.Contains(lower, "nats: failed to parse root certificate") || strings.Contains(lower, "nats: error parsing client certificate"):
		return fail(fmt.Sprintf("make %s and %s name readable PEM files", caKey, certKey), "the TLS files cannot be read (%v)", err)
	}
	return nil
}

// credsName names the credentials c uses, for messages.
func (c Conn) credsName() string {
	switch {
	case c.Creds != "":
		return c.Key("creds") + " " + c.Creds
	case c.UserJWT != "":
		return c.Key("user_jwt")
	case c.NKeySeedFile != "":
		return c.Key("nkey_seed_file") + " " + c.NKeySeedFile
	case c.User != "":
		return c.Key("user") + " and " + c.Key("password")
	case c.Token != "":
		return c.Key("token")
	}
	return "(none)"
}

var violationRE = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]+)"`)

// PermissionDenied returns, when err is the failure of an operation on nc
// that got no answer (a timeout) while the server refused the connection a
// permission, LastRefusal's error; else nil. NATS reports such refusals apart
// from the publish or subscription that caused them, and the publish's
// answer never comes.
func PermissionDenied(nc *nats.Conn, err error) error {
	if nc == nil || err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		return nil
	}
	_, refused := LastRefusal(nc)
	return refused
}

// LastRefusal returns the last permission the server refused nc (since it last
// connected): the subject, and a permanent *Error "permission denied on
// <subject>" naming the permission to grant; nil when none.
func LastRefusal(nc *nats.Conn) (subject string, err error) {
	last := nc.LastError()
	if last == nil {
		return "", nil
	}
	m := violationRE.FindStringSubmatch(last.Error())
	if m == nil {
		return "", nil
	}
	op, subject := "publish", m[2]
	if strings.EqualFold(m[1], "subscription") {
		op = "subscribe"
	}
	return subject, sinks.Permanent(&Error{
		What: fmt.Sprintf("permission denied on %s: the NATS server refuses the bridge's user to %s to it (%v)", subject, op, last),
		Fix:  fmt.Sprintf("allow the bridge's NATS user to %s to %s (docs/security.md lists every permission the bridge needs)", op, Grant(subject)),
		Err:  last,
	})
}

// Grant returns the permission that covers subject as the bridge uses it:
// the subject itself, or the wildcard of its family ($KV.<bucket>.>,
// $JS.API.CONSUMER.CREATE.<stream>.>, _INBOX.>, ...).
func Grant(subject string) string {
	toks := strings.Split(subject, ".")
	switch {
	case toks[0] == "$KV" && len(toks) > 2:
		return "$KV." + toks[1] + ".>"
	case strings.HasPrefix(subject, "$JS.API.CONSUMER.") && len(toks) > 5:
		return strings.Join(toks[:5], ".") + ".>" // $JS.API.CONSUMER.<op>.<stream>.>
	case strings.HasPrefix(subject, "$JS.API.DIRECT.GET.") && len(toks) > 5:
		return strings.Join(toks[:5], ".") + ".>"
	case toks[0] == "_INBOX":
		return "_INBOX.>"
	}
	return subject
}
