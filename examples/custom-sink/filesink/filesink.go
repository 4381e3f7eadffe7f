// Package filesink is Acme's "acme_file" sink: it appends every change to a
// file as one JSON line, {"id", "subject", "headers", "payload"}, the
// payload embedded verbatim when it is JSON (base64 in "payload_base64"
// otherwise). It is an example of a sink written outside the bridge's
// module: a Config with koanf tags and a Validate method, a Factory that
// does no I/O, the sinks.Sink methods, and registration from init.
//
// Example (bridge.yaml):
//
//	sinks:
//	  audit:
//	    type: acme_file
//	    config:
//	      path: /var/lib/bridge/audit.jsonl   # required; created when missing
//	      sync: true                          # fsync after every batch; default true
package filesink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

func init() {
	sinks.MustRegister("acme_file", sinks.Plugin{
		New:    New,
		Config: DefaultConfig(),
		Doc:    "appends each change to a file as a JSON line (Acme)",
	})
}

// Config is the sink's `config:` block.
type Config struct {
	// Path of the file the lines are appended to. Required; created with
	// mode 0644 when missing, its directory must exist.
	Path string `koanf:"path"`
	// Sync fsyncs the file after every batch, so a Write that returned nil
	// survives a power cut. Default true.
	Sync bool `koanf:"sync"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{Sync: true} }

// Validate reports every invalid field, each naming its key.
func (c *Config) Validate() error {
	if c.Path == "" {
		return config.Field("path", "must be set")
	}
	return nil
}

var errClosed = errors.New("filesink: sink closed")

// Sink appends changes to a file. Write is never called concurrently with
// itself; Close may be called at any time, more than once.
type Sink struct {
	cfg Config

	mu     sync.Mutex
	f      *os.File
	closed bool
}

// New builds a sink from its config block. Like every Factory, it only
// decodes and validates: the file is opened by Connect.
func New(decode config.Decoder, env sinks.Env) (sinks.Sink, error) {
	cfg := DefaultConfig()
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	return &Sink{cfg: cfg}, nil
}

// Connect opens the file for appending, unless it is open already.
func (s *Sink) Connect(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return sinks.Permanent(errClosed)
	case s.f != nil:
		return nil
	}
	f, err := os.OpenFile(s.cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s: %w", s.cfg.Path, err)
	}
	s.f = f
	return nil
}

// Write appends one line per change with a single write, then fsyncs when
// sync is set. Any error means the whole batch failed (some lines may have
// been written: a retry appends them again, at least once).
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	if len(batch) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return sinks.Permanent(fmt.Errorf("writing %d changes to %s: %w", len(batch), s.cfg.Path, errClosed))
	case s.f == nil:
		return fmt.Errorf("writing %d changes to %s: %w", len(batch), s.cfg.Path, sinks.ErrNotConnected)
	}
	var buf bytes.Buffer
	for i := range batch {
		if err := appendLine(&buf, &batch[i]); err != nil {
			return sinks.Permanent(fmt.Errorf("encoding %s: %w", batch[i].ID(), err))
		}
	}
	if _, err := s.f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("writing %d changes to %s: %w", len(batch), s.cfg.Path, err)
	}
	if s.cfg.Sync {
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", s.cfg.Path, err)
		}
	}
	return nil
}

// Line is one line of the file; PayloadBase64 is base64 in JSON.
type Line struct {
	ID            string            `json:"id"`
	Subject       string            `json:"subject"`
	Headers       map[string]string `json:"headers,omitempty"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 []byte            `json:"payload_base64,omitempty"`
}

func appendLine(buf *bytes.Buffer, c *cdc.Change) error {
	l := Line{ID: c.ID(), Subject: c.Subject, Headers: c.Headers}
	if json.Valid(c.Payload) {
		l.Payload = c.Payload
	} else if len(c.Payload) > 0 {
		l.PayloadBase64 = c.Payload
	}
	enc := json.NewEncoder(buf) // one line, newline-terminated
	enc.SetEscapeHTML(false)
	return enc.Encode(l)
}

// Close syncs and closes the file. Idempotent.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.f == nil {
		return nil
	}
	f := s.f
	s.f = nil
	return errors.Join(f.Sync(), f.Close())
}

var _ sinks.Sink = (*Sink)(nil)
