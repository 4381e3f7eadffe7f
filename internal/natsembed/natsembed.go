// Package natsembed runs an in-process nats-server with JetStream: the
// bridge's embedded default when no NATS URL is configured, and the real
// server every NATS test runs against.
package natsembed

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds how long Start waits for the server to accept clients.
const readyTimeout = 10 * time.Second

// Options configures an embedded server.
type Options struct {
	// Host to listen on. Default "127.0.0.1".
	Host string
	// Port to listen on; -1 picks a free one, 0 means the NATS default 4222.
	Port int
	// StoreDir is the JetStream store directory. Required by Start; StartT
	// uses a fresh t.TempDir() when empty. Starting a server again with the
	// same Port and StoreDir after Shutdown resumes with the same streams,
	// which is how tests simulate a NATS restart.
	StoreDir string
	// SyncAlways makes JetStream fsync every write (sync_interval: always).
	SyncAlways bool
	// MaxPayload is the largest message the server accepts, in bytes;
	// 0 keeps the server's default (1 MiB).
	MaxPayload int32
	// MaxFileStore caps JetStream's file storage, in bytes, as a full disk
	// would (the server refuses writes with "insufficient resources");
	// 0 keeps the server's default (a share of the disk).
	MaxFileStore int64
	// Logf receives the server's log lines; nil keeps the server silent.
	Logf func(format string, args ...any)

	// User and Password, or Token, when set, are required of every client
	// (the bridge's embedded server when nats.user and nats.password, or
	// nats.token, are set).
	User, Password, Token string
	// UserNKey, when set, is the public key of a user every client may
	// authenticate as by signing the server's challenge with its seed (the
	// bridge's own key, UserKey); the server then admits no one else but
	// the users above.
	UserNKey string

	// Nkeys are users authenticating with nkeys, with their permissions.
	// For tests.
	Nkeys []*server.NkeyUser

	// TLS, when set, makes the server require TLS with this configuration:
	// its certificate, and, with ClientAuth tls.RequireAndVerifyClientCert
	// and ClientCAs, client certificates (verify: true). For tests.
	TLS *tls.Config
	// TLSHandshakeFirst makes the server expect the TLS handshake before
	// its INFO (handshake_first: true). For tests, with TLS.
	TLSHandshakeFirst bool
	// Operator runs the server in operator mode, trusting the operator and
	// resolving its accounts' JWTs from memory. For tests; see NewOperator.
	Operator *Operator
}

// Server is a running embedded nats-server.
type Server struct {
	ns   *server.Server
	opts Options // as started, with the port actually bound
}

// Start starts a nats-server with JetStream in this process and waits until
// it accepts connections. The server installs no signal handlers. Call
// Shutdown to stop it.
func Start(o Options) (*Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("starting embedded nats-server: StoreDir must be set")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	so := &server.Options{
		ServerName: "bridge-embedded",
		Host:       o.Host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      o.Logf == nil,
		MaxPayload: o.MaxPayload,
	}
	if o.MaxFileStore > 0 {
		so.JetStreamMaxStore = o.MaxFileStore
	}
	if o.SyncAlways {
		so.SyncAlways = true
		so.SyncInterval = 2 * time.Minute // ignored with SyncAlways, but must be set
	}
	switch {
	case o.User != "":
		so.Username, so.Password = o.User, o.Password
	case o.Token != "":
		so.Authorization = o.Token
	}
	so.Nkeys = append(so.Nkeys, o.Nkeys...)
	if o.UserNKey != "" {
		so.Nkeys = append(so.Nkeys, &server.NkeyUser{Nkey: o.UserNKey})
	}
	if o.TLS != nil {
		so.TLS, so.TLSConfig, so.TLSTimeout = true, o.TLS, 5
		so.TLSVerify = o.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		so.TLSHandshakeFirst = o.TLSHandshakeFirst
	}
	if o.Operator != nil {
		if err := o.Operator.configure(so); err != nil {
			return nil, fmt.Errorf("starting embedded nats-server: %w", err)
		}
	}
	hp := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("starting embedded nats-server on %s: %w", hp, err)
	}
	// The logger is set even without Logf: a server that cannot listen or
	// start JetStream says so only through Fatalf, and keeps running.
	lg := &logger{logf: o.Logf}
	ns.SetLogger(lg, false, false)
	ns.Start()
	if err := waitReady(ns, lg); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		err = fmt.Errorf("starting embedded nats-server on %s (store %s): %w", hp, o.StoreDir, err)
		if o.Port > 0 {
			if held := portHolders(o.Port); held != "" {
				err = fmt.Errorf("%w; port %d is held by %s", err, o.Port, held)
			}
		}
		return nil, err
	}
	if a, ok := ns.Addr().(*net.TCPAddr); ok {
		o.Port = a.Port
	}
	return &Server{ns: ns, opts: o}, nil
}

// URL returns the client URL, e.g. "nats://127.0.0.1:4222".
func (s *Server) URL() string {
	return "nats://" + net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

// Options returns the options the server runs with, Port being the port
// actually bound. Start(s.Options()) after Shutdown restarts the same server.
func (s *Server) Options() Options { return s.opts }

// NATS returns the underlying server, for tests and diagnostics.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server, closing client connections and flushing
// JetStream. It returns ctx's error if the server has not finished by ctx's
// deadline; the shutdown then carries on in the background. Safe to call
// more than once, and on a nil *Server.
func (s *Server) Shutdown(ctx context.Context) error {
	if s == nil || s.ns == nil {
		return nil
	}
	done := make(chan struct{})
	go func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("shutting down embedded nats-server: %w", ctx.Err())
	}
}

// waitReady waits up to readyTimeout for ns to accept clients. It returns
// at once with the server's own words when the server reports a fatal
// error (a port it cannot bind, a store it cannot open): the server does
// not stop by itself then, and waiting would only add the timeout.
func waitReady(ns *server.Server, lg *logger) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		if ns.ReadyForConnections(50 * time.Millisecond) {
			return nil
		}
		if f := lg.fatal(); f != "" {
			return errors.New(f)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s", readyTimeout)
		}
	}
}

// logger forwards the server's log lines to logf, when set, and keeps the
// first fatal one for Start's error.
type logger struct {
	logf func(string, ...any)

	mu       sync.Mutex
	firstFTL string
}

func (l *logger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstFTL
}

func (l *logger) log(level, f string, v ...any) {
	if l.logf != nil {
		l.logf(level+f, v...)
	}
}

func (l *logger) Noticef(f string, v ...any) { l.log("[INF] ", f, v...) }
func (l *logger) Warnf(f string, v ...any)   { l.log("[WRN] ", f, v...) }
func (l *logger) Errorf(f string, v ...any)  { l.log("[ERR] ", f, v...) }
func (l *logger) Debugf(f string, v ...any)  { l.log("[DBG] ", f, v...) }
func (l *logger) Tracef(f string, v ...any)  { l.log("[TRC] ", f, v...) }
func (l *logger) Fatalf(f string, v ...any) {
	l.mu.Lock()
	if l.firstFTL == "" {
		l.firstFTL = fmt.Sprintf(f, v...)
	}
	l.mu.Unlock()
	l.log("[FTL] ", f, v...)
}
