package reload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/bridgecdc/bridge/config"
)

// ServerTLS is the TLS side of an HTTPS listener configured by a
// config.ServerTLS section. Config's GetConfigForClient reads the current
// certificate and client CAs at each handshake, so a reload applies to new
// connections while those in flight keep theirs.
type ServerTLS struct {
	path string // YAML path of the section, e.g. serve.tls
	cfg  config.ServerTLS
	log  *slog.Logger
	cur  atomic.Pointer[tlsState]
}

// tlsState is one loaded generation of the files.
type tlsState struct {
	cert     tls.Certificate
	clientCA *x509.CertPool // nil: no client certificate asked for
	notAfter time.Time
}

// NewServerTLS loads the files of c, the section at YAML path (e.g.
// "serve.tls"). Its errors are config.FieldErrors at the key of the file
// that failed, each naming the file and what it should hold (see Check).
// A nil log discards.
func NewServerTLS(path string, c config.ServerTLS, log *slog.Logger) (*ServerTLS, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &ServerTLS{path: path, cfg: c, log: log}
	st, err := load(path, c, time.Now())
	if err != nil {
		return nil, err
	}
	s.cur.Store(st)
	return s, nil
}

// Check returns the problems of loading the files of c, the section at
// YAML path, now: an unreadable file, a file with no PEM certificate, a
// key that does not fit the certificate, an expired certificate. Nil when
// c configures no TLS. For validation, which reports every problem.
func Check(path string, c config.ServerTLS) []error {
	if !c.Enabled() || c.CertFile == "" || c.KeyFile == "" {
		return nil // the config package reports a missing half
	}
	if _, err := load(path, c, time.Now()); err != nil {
		var errs interface{ Unwrap() []error }
		if errors.As(err, &errs) {
			return errs.Unwrap()
		}
		return []error{err}
	}
	return nil
}

// load reads and checks the files of c.
func load(path string, c config.ServerTLS, now time.Time) (*tlsState, error) {
	var errs []error
	fail := func(key, format string, args ...any) {
		errs = append(errs, &config.FieldError{Path: path + "." + key, Msg: fmt.Sprintf(format, args...)})
	}
	st := &tlsState{}
	certPEM, certErr := os.ReadFile(c.CertFile)
	keyPEM, keyErr := os.ReadFile(c.KeyFile)
	switch {
	case certErr != nil:
		fail("cert_file", "%v (want the PEM certificate chain the listener presents, leaf first)", certErr)
	case !hasPEM(certPEM, "CERTIFICATE"):
		fail("cert_file", "no PEM certificate in %s (want the PEM certificate chain the listener presents, leaf first)", c.CertFile)
		certErr = errors.New("no certificate")
	}
	if keyErr != nil {
		fail("key_file", "%v (want the PEM private key of cert_file)", keyErr)
	}
	if certErr == nil && keyErr == nil {
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			fail("key_file", "%s does not hold the private key of %s: %v", c.KeyFile, c.CertFile, err)
		} else {
			st.cert = cert
			st.notAfter = cert.Leaf.NotAfter
			if now.After(cert.Leaf.NotAfter) {
				fail("cert_file", "the certificate in %s expired at %s: renew it (the listener reloads it when the file changes)", c.CertFile, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
			}
		}
	}
	if c.ClientCAFile != "" {
		caPEM, err := os.ReadFile(c.ClientCAFile)
		pool := x509.NewCertPool()
		switch {
		case err != nil:
			fail("client_ca_file", "%v (want the PEM certificates of the CAs that sign client certificates)", err)
		case !pool.AppendCertsFromPEM(caPEM):
			fail("client_ca_file", "no PEM certificate in %s (want the PEM certificates of the CAs that sign client certificates)", c.ClientCAFile)
		default:
			st.clientCA = pool
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return st, nil
}

// hasPEM reports whether b holds a PEM block of type typ.
func hasPEM(b []byte, typ string) bool {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return false
		}
		if blk.Type == typ {
			return true
		}
	}
}

// Reload reads the files again. When they load, new connections get the
// new certificate and client CAs; otherwise the previous ones stay and the
// error says why. Each outcome is logged.
func (s *ServerTLS) Reload() error {
	st, err := load(s.path, s.cfg, time.Now())
	if err != nil {
		s.log.Error("TLS files did not reload: serving the previous certificate", "section", s.path, "err", err)
		return err
	}
	prev := s.cur.Swap(st)
	if !prev.notAfter.Equal(st.notAfter) || !prev.cert.Leaf.Equal(st.cert.Leaf) {
		s.log.Info("TLS certificate reloaded", "section", s.path, "subject", st.cert.Leaf.Subject.String(), "not_after", st.notAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// Files returns the files the section reads.
func (s *ServerTLS) Files() []string {
	out := []string{s.cfg.CertFile, s.cfg.KeyFile}
	if s.cfg.ClientCAFile != "" {
		out = append(out, s.cfg.ClientCAFile)
	}
	return out
}

// Watch reloads on trigger (e.g. SIGHUP) and when a file changes, until
// ctx ends (see the package's Watch).
func (s *ServerTLS) Watch(ctx context.Context, trigger <-chan struct{}) error {
	return Watch(ctx, s.log, s.Files(), trigger, func() { _ = s.Reload() })
}

// MutualTLS reports whether clients must present a certificate.
func (s *ServerTLS) MutualTLS() bool { return s.cfg.ClientCAFile != "" }

// Config returns the server's tls.Config: TLS 1.2 or later, HTTP/2 and
// HTTP/1.1, the current certificate and, with client_ca_file, a client
// certificate required and verified against the current CAs.
func (s *ServerTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			st := s.cur.Load()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{st.cert},
				NextProtos:   []string{"h2", "http/1.1"},
			}
			if st.clientCA != nil {
				c.ClientCAs = st.clientCA
				c.ClientAuth = tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}
