// The server's configuration: Config and its defaults, and FromConfig and
// Validate, which read bridge.yaml's serve section.

package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

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
	// MaxColumns bounds the distinct columns of a request's columns=: 400
	// beyond. Default 256 (feeds.Config.MaxColumns bounds the library).
	MaxColumns int
	// TokenSecret, when set, signs every resume token the server hands
	// out (HMAC-SHA256) and refuses tokens without a valid signature (400):
	// a client can then only resume from a position a server with the
	// same secret returned. Give every process behind one load balancer
	// the same secret. nil: tokens are unsigned positions.
	TokenSecret []byte
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
	if c.MaxColumns <= 0 {
		c.MaxColumns = 256
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
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
		MaxColumns: s.MaxColumns,
	}
	if s.TokenSecret != "" {
		sc.TokenSecret = []byte(s.TokenSecret)
	}
	if s.TLS.Enabled() {
		if sc.TLS, err = reload.NewServerTLS("serve.tls", s.TLS, log); err != nil {
			return Config{}, feeds.Config{}, err
		}
	}
	return sc, feeds.Config{Stream: s.Stream, Route: s.Route, WindowTxns: s.WindowTxns, WindowBytes: s.WindowBytes, Logger: log,
		MaxProjections: s.MaxProjections, MaxColumns: s.MaxColumns, ProjectionIdle: s.ProjectionIdle}, nil
}
