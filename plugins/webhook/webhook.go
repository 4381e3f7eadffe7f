package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

func init() {
	sinks.MustRegister("webhook", sinks.Plugin{
		New:    New,
		Config: DefaultConfig(),
		Doc:    "HTTP POST of each batch (a JSON array) or each change to a URL, with an Idempotency-Key; 2xx delivered, 4xx permanent, 408/429/5xx retried",
	})
}

// HeaderIdempotencyKey carries the change's id, or "<first id>..<last id>"
// for a batch.
const HeaderIdempotencyKey = "Idempotency-Key"

// Envelope is the JSON form of one change in a request body: the body is
// one Envelope (batch: false) or a JSON array of them (batch: true).
// Receivers in Go can decode into it.
type Envelope struct {
	// ID is the change's id, "<producer>:<commit LSN, 16 hex>:<seq>": the
	// same for a change sent again, so receivers can drop duplicates.
	ID string `json:"id"`
	// Subject is the subject the route gave the change.
	Subject string `json:"subject"`
	// Headers are the change's own headers (W3C traceparent etc.).
	Headers map[string]string `json:"headers,omitempty"`
	// Payload is the change in the route's format, verbatim, when it is
	// JSON; otherwise PayloadBase64 holds it.
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
}

var (
	errClosed = errors.New("webhook: sink closed")
	// errSkipped marks changes a Write did not send because an earlier
	// one failed: sending them would reorder them.
	errSkipped = errors.New("webhook: not sent: an earlier change of the batch failed")
)

// Sink POSTs changes to a URL. It implements sinks.Sink. Write is never
// called concurrently with itself; Close may be called at any time, more
// than once. Each instance has its own connection pool.
type Sink struct {
	cfg    Config
	log    *slog.Logger
	target string // the URL without secrets, for messages
	tr     *http.Transport
	client *http.Client

	mu     sync.Mutex
	closed bool
}

// New builds a sink from its config block; it does no network I/O.
func New(decode config.Decoder, env sinks.Env) (sinks.Sink, error) {
	cfg := DefaultConfig()
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if u, err := url.Parse(cfg.URL); err == nil && u.Scheme == "http" && !loopback(u.Hostname()) {
		log.Warn("webhook url is http:// to a host beyond this machine: every row, and the configured headers (an Authorization), cross the network in clear; use https",
			"sink", env.Name, "url", redact(cfg.URL))
	}
	return &Sink{
		cfg:    cfg,
		log:    log,
		target: redact(cfg.URL),
		tr:     tr,
		client: &http.Client{
			Transport: tr,
			// A POST redirected with 301-303 would become a GET and
			// "succeed" without delivering anything.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// Connect does nothing but refuse after Close: HTTP needs no session, and
// Write reports an unreachable receiver.
func (s *Sink) Connect(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return sinks.Permanent(errClosed)
	}
	return nil
}

// Write POSTs the batch: as one request (batch: true) or one request per
// change, in order (batch: false), each bounded by timeout and ctx.
//
// nil means the receiver answered 2xx to everything. With batch: false a
// failure is a *sinks.BatchError listing the change that failed and every
// later one (not sent, so nothing arrives out of order); the earlier ones
// were delivered. With batch: true any error means the whole batch failed.
// A failure is sinks.Permanent when the receiver answered 3xx or 4xx
// other than 408 and 429; anything else is worth retrying. A Write on a
// closed sink fails with a Permanent error.
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	if len(batch) == 0 {
		return nil
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return sinks.Permanent(fmt.Errorf("posting %d changes to %s: %w", len(batch), s.target, errClosed))
	}

	if s.cfg.Batch {
		body := []byte{'['}
		for i := range batch {
			if i > 0 {
				body = append(body, ',')
			}
			body = appendEnvelope(body, &batch[i])
		}
		body = append(body, ']')
		key := batch[0].ID()
		if len(batch) > 1 {
			key += ".." + batch[len(batch)-1].ID()
		}
		if err := s.post(ctx, body, key, nil); err != nil {
			return fmt.Errorf("posting %d changes (first %s) to %s: %w", len(batch), batch[0].ID(), s.target, err)
		}
		return nil
	}

	var berr sinks.BatchError
	for i := range batch {
		c := &batch[i]
		if err := s.post(ctx, appendEnvelope(nil, c), c.ID(), c.Headers); err != nil {
			berr.Fail(i, fmt.Errorf("posting %s to %s: %w", c.ID(), s.target, err))
			for j := i + 1; j < len(batch); j++ {
				berr.Fail(j, fmt.Errorf("not posting %s after #%d failed: %w", batch[j].ID(), i, errSkipped))
			}
			break
		}
	}
	return berr.Err()
}

// post sends one request and classifies its outcome.
func (s *Sink) post(ctx context.Context, body []byte, key string, extra map[string]string) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return sinks.Permanent(fmt.Errorf("building the request: %w", unwrapURLError(err)))
	}
	for k, v := range s.cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderIdempotencyKey, key)
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "bridge-webhook")
	}
	for k, v := range extra {
		if validHeaderName(k) && validHeaderValue(v) && !reserved[canonical(k)] && req.Header.Get(k) == "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		err = unwrapURLError(err)
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("no response within timeout %s: %w", s.cfg.Timeout, err)
		}
		return err
	}
	defer func() {
		// Drain a little so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	err = fmt.Errorf("the receiver answered %s%s", resp.Status, quoteBody(s.scrub(snippet)))
	switch {
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests:
		return err
	case code >= 300 && code <= 399:
		return sinks.Permanent(fmt.Errorf("%w (redirects are not followed: set url to the final location)", err))
	case code >= 400 && code <= 499:
		return sinks.Permanent(err)
	}
	return err
}

// unwrapURLError drops the *url.Error around err: its message would
// repeat the URL, secrets included.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// quoteBody renders the start of a response body for an error message.
func quoteBody(b []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
	if s == "" {
		return ""
	}
	if len(b) == 256 {
		s += "..."
	}
	return fmt.Sprintf(": %q", s)
}

// appendEnvelope appends c's Envelope to dst, the payload verbatim.
func appendEnvelope(dst []byte, c *cdc.Change) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendJSON(dst, c.ID())
	dst = append(dst, `,"subject":`...)
	dst = appendJSON(dst, c.Subject)
	if len(c.Headers) > 0 {
		dst = append(dst, `,"headers":`...)
		dst = appendJSON(dst, c.Headers)
	}
	switch {
	case len(c.Payload) == 0:
	case json.Valid(c.Payload):
		dst = append(dst, `,"payload":`...)
		dst = append(dst, c.Payload...)
	default:
		dst = append(dst, `,"payload_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, c.Payload)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// appendJSON appends v, a string or a map of strings, as JSON.
func appendJSON(dst []byte, v any) []byte {
	b, _ := json.Marshal(v) // strings and string maps always marshal
	return append(dst, b...)
}

func canonical(k string) string { return http.CanonicalHeaderKey(k) }

// Close refuses further Writes and closes idle connections; a Write under
// way is bounded by its own ctx and timeout. Idempotent.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.tr.CloseIdleConnections()
	return nil
}

// Interface guard.
var _ sinks.Sink = (*Sink)(nil)

// scrub replaces in a receiver's answer what it may echo of the request's
// secrets: the configured headers' values (an Authorization, and the
// token in it) and the URL's password, so that they reach no error or log.
func (s *Sink) scrub(b []byte) []byte {
	var secrets []string
	for _, v := range s.cfg.Headers {
		secrets = append(secrets, v)
		for _, f := range strings.Fields(v) {
			if len(f) >= 6 {
				secrets = append(secrets, f)
			}
		}
	}
	if u, err := url.Parse(s.cfg.URL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			secrets = append(secrets, p)
		}
	}
	out := string(b)
	for _, v := range secrets {
		if v != "" {
			out = strings.ReplaceAll(out, v, "xxxxx")
		}
	}
	return []byte(out)
}

// loopback reports whether host is this machine: localhost or a loopback
// address.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
