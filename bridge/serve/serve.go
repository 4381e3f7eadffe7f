package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/reload"
)

// Config configures the feeds HTTP server of `bridge serve`. Zero
// values take the defaults.
type Config struct {
	// Listen is the HTTP address. Default "127.0.0.1:8090".
	Listen string
	// Where is a condition ANDed with every request's filter, also on
	// replayed history; nil adds none.
	Where *feeds.Cond
	// Tables, when set, are the only tables a request may read; a request
	// naming none reads all of them.
	Tables []string
	// MaxConns bounds the feed requests (long-polls and SSE streams) in
	// progress; beyond it: 503 with Retry-After. Default 10000.
	MaxConns int
	// MaxPerClient bounds them per client (the authenticated caller: a
	// JWT's sub, the proxy's ClientHeader; else ClientHeader's value; else
	// the remote IP); beyond it: 429 with Retry-After. Default 100.
	MaxPerClient int
	// ClientHeader names the request header identifying a client (for
	// example one an authenticating proxy sets); "" uses the remote IP.
	// With a JWT the token's subject names the client, never the header.
	ClientHeader string
	// Hold is the default and largest long-poll wait. Default 20s.
	Hold time.Duration
	// KeepAlive is the interval of SSE keep-alive comments. Default 15s.
	KeepAlive time.Duration
	// WriteTimeout bounds each SSE write; a client that does not take an
	// event within it is disconnected (it resumes with Last-Event-ID).
	// Default 10s.
	WriteTimeout time.Duration
	// MaxLag is how many stream messages an SSE client may fall behind the
	// head after a write before it is disconnected with reason "slow".
	// Default 100000.
	MaxLag uint64

	// Auth authenticates /v1/feed and /v1/position (and /metrics when
	// ProtectMetrics); nil serves everyone (NewAuth).
	Auth *Auth
	// ProtectMetrics asks Auth's credentials on /metrics too: set for a
	// listen address beyond loopback.
	ProtectMetrics bool
	// TLS serves HTTPS (Serve, HTTPServer); nil serves plain HTTP.
	TLS *reload.ServerTLS
	// MaxHeaderBytes bounds a request's line and headers: 431 beyond.
	// Default 65536.
	MaxHeaderBytes int
	// MaxQueryBytes bounds a request's query string: 414 beyond. Default
	// 16384.
	MaxQueryBytes int
	// MaxFilterDepth bounds the nesting of and, or and not in a request's
	// where: 400 beyond. Default 16.
	MaxFilterDepth int
	// ReadHeaderTimeout bounds the TLS handshake and the reading of a
	// request's headers. Default 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a kept-alive connection idle this long. Default 2m.
	IdleTimeout time.Duration
	// AllowedHosts are the names besides localhost and loopback addresses
	// a request's Host may carry on a loopback Listen (guard.go).
	AllowedHosts []string
}

func (c *Config) defaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8090"
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 10000
	}
	if c.MaxPerClient <= 0 {
		c.MaxPerClient = 100
	}
	if c.Hold <= 0 {
		c.Hold = 20 * time.Second
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 15 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.MaxLag == 0 {
		c.MaxLag = 100_000
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.MaxQueryBytes <= 0 {
		c.MaxQueryBytes = 16 << 10
	}
	if c.MaxFilterDepth <= 0 {
		c.MaxFilterDepth = 16
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
}

// Server serves feeds over HTTP: long-poll and server-sent events on
// GET /v1/feed, the current position on GET /v1/position, /livez, /readyz
// and its Prometheus metrics on /metrics (metrics.go). docs/feeds.md
// documents the wire.
type Server struct {
	fs  *feeds.Feeds
	cfg Config
	log *slog.Logger
	met *feedMetrics

	mu        sync.Mutex
	conns     int
	perClient map[string]int

	// draining ends when Drain is called: feed requests in progress
	// return their position and end.
	draining context.Context
	drain    context.CancelFunc
}

// New returns the server of fs with cfg; zero values in cfg take their
// defaults, a nil log logs to slog.Default().
func New(fs *feeds.Feeds, cfg Config, log *slog.Logger) *Server {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Server{fs: fs, cfg: cfg, log: log, perClient: map[string]int{}}
	s.draining, s.drain = context.WithCancel(context.Background())
	s.met = newFeedMetrics(s, fs)
	return s
}

// Drain ends the feed requests in progress for a restart or a load
// balancer's drain, each with the position its client resumes from on
// any process: a long-poll answers at once with its token, an SSE stream
// writes its last id (see sse) and ends. Requests arriving afterwards are
// served as usual. HTTPServer's Shutdown calls it.
func (s *Server) Drain() { s.drain() }

// requestContext is r's context, also ended by Drain; stop releases it.
func (s *Server) requestContext(r *http.Request) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(r.Context())
	undo := context.AfterFunc(s.draining, cancel)
	return ctx, func() { undo(); cancel() }
}

// inProgress returns the number of feed requests admitted and not finished.
func (s *Server) inProgress() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// Handler returns the HTTP handler. A query string longer than
// MaxQueryBytes gets 414 before anything else is read.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/feed", s.feed)
	mux.HandleFunc("GET /v1/position", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.authenticate(w, r, false, ""); !ok {
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"token": s.fs.Position().String()})
	})
	metrics := s.met.handler()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.ProtectMetrics {
			if _, ok := s.authenticate(w, r, false, ""); !ok {
				return
			}
		}
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.fs.Ready() {
			http.Error(w, "not ready: the stream consumer is not at a transaction boundary", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := len(r.URL.RawQuery); n > s.cfg.MaxQueryBytes {
			writeJSON(w, http.StatusRequestURITooLong, apiError{Error: "uri-too-long",
				Detail: fmt.Sprintf("the query string is %d bytes, more than the server's limit of %d (serve.max_query_bytes)", n, s.cfg.MaxQueryBytes)})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// authenticate checks r's credentials with Auth, answering 401, 403 or 400
// itself when they fail; a nil caller with ok means no Auth. grants asks
// for the caller's tables and rows (feed requests). mode, when set, counts
// a refusal in the feed requests' metrics.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, grants bool, mode string) (*caller, bool) {
	if s.cfg.Auth == nil {
		return nil, true
	}
	c, err := s.cfg.Auth.authenticate(r, grants)
	if err == nil {
		return c, true
	}
	if mode != "" {
		switch err.status {
		case http.StatusUnauthorized:
			s.met.request(mode, outcomeUnauthorized)
		case http.StatusForbidden:
			s.met.request(mode, outcomeForbidden)
		default:
			s.met.request(mode, outcomeBadRequest)
		}
	}
	challenge(w, err)
	return nil, false
}

// HTTPServer returns an http.Server for the handler with the server's
// limits: MaxHeaderBytes, ReadHeaderTimeout (which bounds a TLS handshake
// too), IdleTimeout, and TLS when configured. net/http's own log (refused
// handshakes, malformed requests) goes to the server's logger at debug
// level: hostile clients must not flood the log.
func (s *Server) HTTPServer() *http.Server {
	srv := &http.Server{
		Handler:           s.guard(s.Handler()),
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	if s.cfg.TLS != nil {
		srv.TLSConfig = s.cfg.TLS.Config()
	}
	srv.RegisterOnShutdown(s.Drain)
	return srv
}

// Serve serves srv (from HTTPServer) on ln, over TLS when configured,
// until srv is shut down.
func (s *Server) Serve(srv *http.Server, ln net.Listener) error {
	if s.cfg.TLS != nil {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}

// Watch reloads the TLS files and serve.auth.jwks_file when they change
// and each time trigger receives (SIGHUP), until ctx ends.
func (s *Server) Watch(ctx context.Context, trigger <-chan struct{}) error {
	var files []string
	var fns []func()
	if s.cfg.TLS != nil {
		files = append(files, s.cfg.TLS.Files()...)
		fns = append(fns, func() { _ = s.cfg.TLS.Reload() })
	}
	if f := s.cfg.Auth.files(); len(f) > 0 {
		files = append(files, f...)
		fns = append(fns, s.cfg.Auth.reloadJWKS)
	}
	if len(fns) == 0 {
		return nil
	}
	return reload.Watch(ctx, s.log, files, trigger, func() {
		for _, f := range fns {
			f()
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError is the body of every error response.
type apiError struct {
	Error    string `json:"error"` // bad-request, must-refetch, too-many-requests, overloaded, unavailable, …
	Reason   string `json:"reason,omitempty"`
	Detail   string `json:"detail,omitempty"`
	Position string `json:"position,omitempty"` // for must-refetch: where to start again after refetching
}

// admit counts a feed request in; the returned func counts it out. The
// client is the authenticated caller, else ClientHeader's value, else the
// remote IP (clientKey).
func (s *Server) admit(w http.ResponseWriter, r *http.Request, mode string, who *caller) (func(), bool) {
	client := clientKey(r, who, s.cfg.ClientHeader)
	s.mu.Lock()
	defer s.mu.Unlock()
	retry := strconv.Itoa(1 + rand.IntN(3))
	if s.conns >= s.cfg.MaxConns {
		s.met.request(mode, outcomeOverloaded)
		w.Header().Set("Retry-After", retry)
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "overloaded", Detail: fmt.Sprintf("%d feed requests in progress, the server's limit", s.conns)})
		return nil, false
	}
	if s.perClient[client] >= s.cfg.MaxPerClient {
		s.met.request(mode, outcomeTooMany)
		w.Header().Set("Retry-After", retry)
		writeJSON(w, http.StatusTooManyRequests, apiError{Error: "too-many-requests", Detail: fmt.Sprintf("%d feed requests in progress for this client, the limit", s.perClient[client])})
		return nil, false
	}
	s.conns++
	s.perClient[client]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.conns--
		if s.perClient[client]--; s.perClient[client] <= 0 {
			delete(s.perClient, client)
		}
	}, true
}

// parseRequest reads the filter and position of a feed request. The
// filter is the request's, limited to Tables and the caller's tables, and
// its where ANDed with Where and the caller's. An *authError (403) is a
// table the caller may not read; other errors are the request's (400).
func (s *Server) parseRequest(r *http.Request, who *caller) (feeds.Filter, feeds.Token, error) {
	q := r.URL.Query()
	var f feeds.Filter
	if v := q.Get("tables"); v != "" {
		f.Tables = strings.Split(v, ",")
	}
	for _, t := range f.Tables {
		if schema, table, ok := strings.Cut(t, "."); !ok || schema == "" || table == "" {
			return f, feeds.Token{}, fmt.Errorf("tables: %q is not schema.table (e.g. public.orders)", t)
		}
		// The caller's grant first, and never the list of served tables:
		// a caller learns nothing of tables it may not read.
		if who != nil && who.tables != nil && !contains(who.tables, t) {
			return f, feeds.Token{}, forbidden("tables: the token does not grant %q", t)
		}
		if len(s.cfg.Tables) > 0 && !contains(s.cfg.Tables, t) {
			return f, feeds.Token{}, fmt.Errorf("tables: %q is not served here (serve.tables)", t)
		}
	}
	if len(f.Tables) == 0 {
		f.Tables = s.cfg.Tables
		if who != nil && who.tables != nil {
			f.Tables = who.tables
			if len(s.cfg.Tables) > 0 {
				f.Tables = nil
				for _, t := range who.tables {
					if contains(s.cfg.Tables, t) {
						f.Tables = append(f.Tables, t)
					}
				}
				if len(f.Tables) == 0 {
					return f, feeds.Token{}, forbidden("tables: the token grants none of the tables served here (serve.tables)")
				}
			}
		}
	}
	if v := q.Get("ops"); v != "" {
		for _, op := range strings.Split(v, ",") {
			switch cdc.Op(op) {
			case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead:
			default:
				return f, feeds.Token{}, fmt.Errorf("ops: %q is not one of insert, update, delete, read", op)
			}
			f.Ops = append(f.Ops, cdc.Op(op))
		}
	}
	if v := q.Get("columns"); v != "" {
		f.Columns = strings.Split(v, ",")
	}
	var conds []feeds.Cond
	if v := q.Get("where"); v != "" {
		c, err := s.parseWhere(v)
		if err != nil {
			return f, feeds.Token{}, err
		}
		conds = append(conds, c)
	}
	if s.cfg.Where != nil {
		conds = append(conds, *s.cfg.Where)
	}
	if who != nil && who.where != nil {
		conds = append(conds, *who.where)
	}
	switch len(conds) {
	case 0:
	case 1:
		f.Where = &conds[0]
	default:
		f.Where = feeds.And(conds...).Ptr()
	}
	tok := q.Get("token")
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		tok = v
	} else if v := q.Get("last_event_id"); v != "" {
		tok = v
	}
	if tok == "now" {
		tok = ""
	}
	t, err := feeds.ParseToken(tok)
	if err != nil {
		return f, feeds.Token{}, fmt.Errorf("token: %w", err)
	}
	return f, t, nil
}

// parseWhere parses a request's where, refusing one nested deeper than
// MaxFilterDepth before the parser recurses into it.
func (s *Server) parseWhere(v string) (feeds.Cond, error) {
	// A condition n deep nests JSON at most 2n+1 deep ({"and":[...]}).
	if jsonDepth(v, 2*s.cfg.MaxFilterDepth+1) > 2*s.cfg.MaxFilterDepth+1 {
		return feeds.Cond{}, fmt.Errorf("where: nested deeper than the server's limit of %d (serve.max_filter_depth)", s.cfg.MaxFilterDepth)
	}
	c, err := feeds.ParseCond([]byte(v))
	if err != nil {
		return feeds.Cond{}, err
	}
	if d := condDepth(&c); d > s.cfg.MaxFilterDepth {
		return feeds.Cond{}, fmt.Errorf("where: nested %d deep, more than the server's limit of %d (serve.max_filter_depth)", d, s.cfg.MaxFilterDepth)
	}
	return c, nil
}

// jsonDepth returns how deeply objects and arrays nest in the JSON text
// v, stopping once past limit.
func jsonDepth(v string, limit int) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > deepest {
				if deepest = depth; deepest > limit {
					return deepest
				}
			}
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// condDepth is the nesting of c: 1 for a comparison, one more for each
// and, or and not around it.
func condDepth(c *feeds.Cond) int {
	d := 0
	for i := range c.Subs {
		d = max(d, condDepth(&c.Subs[i]))
	}
	return d + 1
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func (s *Server) feed(w http.ResponseWriter, r *http.Request) {
	mode := modeLongPoll
	if r.URL.Query().Get("sse") != "" || strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		mode = modeSSE
	}
	who, ok := s.authenticate(w, r, true, mode)
	if !ok {
		return
	}
	filter, tok, err := s.parseRequest(r, who)
	var denied *authError
	if errors.As(err, &denied) {
		s.met.request(mode, outcomeForbidden)
		challenge(w, denied)
		return
	}
	if err != nil {
		s.met.request(mode, outcomeBadRequest)
		writeJSON(w, http.StatusBadRequest, apiError{Error: "bad-request", Detail: err.Error()})
		return
	}
	done, ok := s.admit(w, r, mode, who)
	if !ok {
		return
	}
	defer done()
	f, err := s.fs.Register(filter, tok)
	if err != nil {
		s.fail(w, mode, err)
		return
	}
	defer f.Close()
	rctx, stop := s.requestContext(r)
	defer stop()
	if mode == modeSSE {
		var until time.Time
		if who != nil {
			until = who.until
		}
		s.sse(rctx, w, r, f, until)
		return
	}
	hold := s.cfg.Hold
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			s.met.request(mode, outcomeBadRequest)
			writeJSON(w, http.StatusBadRequest, apiError{Error: "bad-request", Detail: fmt.Sprintf("timeout: want a duration such as 20s, got %q", v)})
			return
		}
		hold = min(d, hold)
	}
	ctx, cancel := context.WithTimeout(rctx, hold)
	defer cancel()
	b, err := f.Next(ctx)
	switch {
	case err == nil || errors.Is(err, context.DeadlineExceeded):
	case r.Context().Err() != nil:
		s.met.request(mode, outcomeClientGone)
		return
	case errors.Is(err, feeds.ErrClosed):
		// The server is stopping: answer with the position reached, which
		// the client's next poll resumes from wherever it lands.
		b = feeds.Batch{Token: f.Token()}
	case errors.Is(err, context.Canceled) && s.draining.Err() != nil:
		// Drained: b holds the position reached, as at a timeout.
	default:
		s.fail(w, mode, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Bridge-Token", b.Token.String())
	if _, err := w.Write(appendBatch(nil, b)); err != nil {
		s.met.request(mode, outcomeClientGone)
		return
	}
	s.met.request(mode, outcomeOK)
	s.met.deliver(mode, b, time.Now())
}

// appendBatch writes {"token":..,"up_to_date":..,"changes":[..]} reusing
// each change's shared encoding.
func appendBatch(dst []byte, b feeds.Batch) []byte {
	dst = append(dst, `{"token":"`...)
	dst = append(dst, b.Token.String()...)
	dst = append(dst, `","up_to_date":`...)
	dst = strconv.AppendBool(dst, b.UpToDate)
	dst = append(dst, `,"changes":[`...)
	for i, c := range b.Changes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, c.JSON...)
	}
	return append(dst, "]}\n"...)
}

// fail answers a feed error: 409 for must-refetch, 503 otherwise.
func (s *Server) fail(w http.ResponseWriter, mode string, err error) {
	var re *feeds.RefetchError
	if errors.As(err, &re) {
		s.met.request(mode, outcomeRefetch)
		s.met.refetch(re)
		writeJSON(w, http.StatusConflict, refetchBody(re, s.fs.Position()))
		return
	}
	s.met.request(mode, outcomeOverloaded)
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "overloaded", Detail: err.Error()})
}

func refetchBody(re *feeds.RefetchError, pos feeds.Token) apiError {
	return apiError{Error: "must-refetch", Reason: re.Reason, Detail: re.Detail, Position: pos.String()}
}

// sse streams batches as server-sent events: "changes" events whose id is
// the token after them, "up-to-date" once caught up (at once, without
// waiting for a new transaction), "must-refetch" and "error" (reason
// "slow", "expired" once until passes when it is set, or "shutdown")
// before closing, and keep-alives.
//
// Every keep-alive carries an id, the feed's token: the transactions up
// to it were scanned and none matched. An event stream block with an id
// and no data dispatches no event but sets the EventSource's last event
// ID, so a client that only waits still reconnects (after a restart, a
// load balancer's drain) from a recent position instead of its last match.
// When the server drains or closes, the stream ends with an error event
// (reason "shutdown") carrying the position reached, for the same reason.
func (s *Server) sse(ctx context.Context, w http.ResponseWriter, r *http.Request, f *feeds.Feed, until time.Time) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s.met.request(modeSSE, outcomeOK)
	write := func(b []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	// lost ends the stream after a failed write.
	lost := func(err error) {
		reason := writeFailure(err)
		s.met.disconnect(reason)
		if reason == disconnectWriteTimeout {
			s.log.Info("feeds: SSE client disconnected: too slow to take an event", "remote", r.RemoteAddr, "timeout", s.cfg.WriteTimeout)
		}
	}
	// shutdown ends the stream as the server stops, buf (maybe empty)
	// first.
	shutdown := func(buf []byte) {
		s.met.disconnect(disconnectError)
		body, _ := json.Marshal(apiError{Error: "unavailable", Reason: "shutdown", Detail: "the server is shutting down: reconnect with Last-Event-ID"})
		buf = appendID(buf, f.Token())
		_ = write(fmt.Appendf(buf, "event: error\ndata: %s\n\n", body))
	}
	if err := write([]byte(": feed\nretry: 1000\n\n")); err != nil {
		lost(err)
		return
	}
	upToDateSent := false
	var buf []byte
	for {
		wait := s.cfg.KeepAlive
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				s.met.disconnect(disconnectExpired)
				body, _ := json.Marshal(apiError{Error: "unauthorized", Reason: "expired", Detail: "the token has expired: reconnect with a new one and Last-Event-ID"})
				_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", body))
				return
			}
			wait = min(wait, left)
		}
		nctx, cancel := context.WithTimeout(ctx, wait)
		var b feeds.Batch
		var err error
		if upToDateSent {
			b, err = f.Next(nctx)
		} else {
			b, err = f.Poll(nctx) // up-to-date as soon as caught up
		}
		cancel()
		if r.Context().Err() != nil {
			s.met.disconnect(disconnectClientGone)
			return
		}
		var re *feeds.RefetchError
		switch {
		case errors.As(err, &re):
			s.met.refetch(re)
			s.met.disconnect(disconnectRefetch)
			body, _ := json.Marshal(refetchBody(re, s.fs.Position()))
			_ = write(fmt.Appendf(nil, "event: must-refetch\ndata: %s\n\n", body))
			return
		case errors.Is(err, feeds.ErrClosed):
			shutdown(nil)
			return
		case errors.Is(err, context.Canceled) && s.draining.Err() != nil:
			// Drained: b holds what was read, written below.
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			s.met.disconnect(disconnectError)
			body, _ := json.Marshal(apiError{Error: "overloaded", Detail: err.Error()})
			_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", body))
			return
		}
		buf = buf[:0]
		if len(b.Changes) > 0 {
			buf = appendID(buf, b.Token)
			buf = append(buf, "event: changes\ndata: "...)
			buf = appendBatch(buf, b) // ends with a newline
			buf = append(buf, '\n')
			upToDateSent = false
		}
		if b.UpToDate && !upToDateSent {
			buf = fmt.Appendf(buf, "id: %s\nevent: up-to-date\ndata: {\"token\":%q}\n\n", b.Token, b.Token)
			upToDateSent = true
		}
		if s.draining.Err() != nil {
			shutdown(buf)
			s.met.deliver(modeSSE, b, time.Now())
			return
		}
		if len(buf) == 0 {
			// A keep-alive: the comment keeps proxies from closing the
			// stream, the id moves the client's position.
			buf = append(buf, ": keep-alive\n"...)
			buf = appendID(buf, b.Token)
			buf = append(buf, '\n')
		}
		if err := write(buf); err != nil {
			lost(err)
			return
		}
		s.met.deliver(modeSSE, b, time.Now())
		if pos := s.fs.Position(); len(b.Changes) > 0 && pos.Seq > b.Token.Seq+s.cfg.MaxLag {
			s.met.disconnect(disconnectSlow)
			body, _ := json.Marshal(apiError{Error: "slow", Reason: "slow",
				Detail: fmt.Sprintf("%d messages behind the stream; reconnect with Last-Event-ID", pos.Seq-b.Token.Seq)})
			_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", body))
			s.log.Info("feeds: SSE client disconnected: too far behind", "remote", r.RemoteAddr, "behind", pos.Seq-b.Token.Seq)
			return
		}
	}
}

// appendID appends the id line of t; nothing for the zero token.
func appendID(dst []byte, t feeds.Token) []byte {
	if t.IsZero() {
		return dst
	}
	dst = append(dst, "id: "...)
	dst = append(dst, t.String()...)
	return append(dst, '\n')
}

// serveWherePath is the YAML path of the server's condition.
const serveWherePath = "serve.where"

// serveWhere parses serve.where, a feeds condition in its JSON form written
// as YAML; nil when empty. Errors are *config.FieldError at the offending
// path, e.g. serve.where.and[1].eq.
func serveWhere(m map[string]any) (*feeds.Cond, error) { return parseCondAt(serveWherePath, m) }

// parseCondAt parses the condition m at YAML path (serve.where,
// serve.auth.where); nil when empty.
func parseCondAt(path string, m map[string]any) (*feeds.Cond, error) {
	if len(m) == 0 {
		return nil, nil
	}
	if err := checkJSONValues(path, m); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, &config.FieldError{Path: path, Msg: err.Error()}
	}
	c, err := feeds.ParseCond(b)
	if err != nil {
		// ParseCond's errors start with the path from "where":
		// "where.and[1].eq: want [...]". It returns no typed error.
		msg := err.Error()
		if p, rest, ok := strings.Cut(msg, ": "); ok && (p == "where" || strings.HasPrefix(p, "where.")) {
			return nil, &config.FieldError{Path: path + strings.TrimPrefix(p, "where"), Msg: rest}
		}
		return nil, &config.FieldError{Path: path, Msg: msg}
	}
	return &c, nil
}

// checkJSONValues reports the first value under path that has no JSON form
// a condition can compare: a YAML timestamp, which would compare as Go's
// time format rather than Postgres's text, or a non-finite number.
func checkJSONValues(path string, v any) error {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if err := checkJSONValues(path+"."+k, x[k]); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if err := checkJSONValues(fmt.Sprintf("%s[%d]", path, i), e); err != nil {
				return err
			}
		}
	case time.Time:
		return &config.FieldError{Path: path, Msg: `a YAML timestamp: quote it to compare the text Postgres sends, e.g. "2024-01-31"`}
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return &config.FieldError{Path: path, Msg: fmt.Sprintf("%v has no JSON form; use a finite number", x)}
		}
	}
	return nil
}

// Validate checks what the config package leaves to the runtime:
// serve.where and serve.auth.where (the feeds condition syntax, claim
// templates only in values), and that the files of serve.tls and
// serve.auth.jwks_file load. Errors name their YAML path.
func Validate(cfg *config.Config) []error {
	var errs []error
	if _, err := serveWhere(cfg.Serve.Where); err != nil {
		errs = append(errs, err)
	}
	if _, err := parseWhereTemplate(cfg.Serve.Auth.Where); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, reload.Check("serve.tls", cfg.Serve.TLS)...)
	if f := cfg.Serve.Auth.JWKSFile; f != "" {
		if _, err := loadJWKS(f); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// FromConfig returns the feeds server's and the feeds library's
// configurations from bridge.yaml's serve section: the TLS files loaded
// and the authentication built (NewAuth; ctx bounds a jwks_url's refresh).
func FromConfig(ctx context.Context, s config.Serve, log *slog.Logger) (Config, feeds.Config, error) {
	where, err := serveWhere(s.Where)
	if err != nil {
		return Config{}, feeds.Config{}, err
	}
	auth, err := NewAuth(ctx, s, log)
	if err != nil {
		return Config{}, feeds.Config{}, err
	}
	sc := Config{
		Listen: s.Listen, Where: where, Tables: s.Tables, MaxConns: s.MaxConns, MaxPerClient: s.MaxPerClient,
		ClientHeader: s.ClientHeader, Hold: s.Hold, KeepAlive: s.KeepAlive, WriteTimeout: s.WriteTimeout, MaxLag: s.MaxLag,
		Auth: auth, ProtectMetrics: auth != nil && !config.IsLoopback(s.Listen),
		MaxHeaderBytes: s.MaxHeaderBytes, MaxQueryBytes: s.MaxQueryBytes, MaxFilterDepth: s.MaxFilterDepth,
		ReadHeaderTimeout: s.ReadHeaderTimeout, IdleTimeout: s.IdleTimeout, AllowedHosts: s.AllowedHosts,
	}
	if s.TLS.Enabled() {
		if sc.TLS, err = reload.NewServerTLS("serve.tls", s.TLS, log); err != nil {
			return Config{}, feeds.Config{}, err
		}
	}
	return sc, feeds.Config{Stream: s.Stream, Route: s.Route, WindowTxns: s.WindowTxns, Logger: log}, nil
}
