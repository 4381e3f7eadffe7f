package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/internal/reload"
)

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
		writeJSON(w, http.StatusOK, map[string]string{"token": s.tokenText(s.fs.Position())})
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
