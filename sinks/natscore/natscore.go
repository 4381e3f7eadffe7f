package natscore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/bridgecdc/bridge/internal/natsconn"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/natsjs"
)

func init() {
	sinks.MustRegister("nats_core", sinks.Plugin{
		New:    New,
		Config: DefaultConfig(),
		Doc:    "core NATS publish plus one flush per batch: at most once, in order, Nats-Msg-Id for consumer-side dedupe",
	})
}

var (
	errClosed = errors.New("natscore: sink closed")
	// errSkipped marks changes a Write did not publish because an earlier
	// one failed: publishing them would reorder the subject.
	errSkipped = errors.New("natscore: not published: an earlier change of the batch failed")
)

// Sink publishes changes to core NATS. It implements sinks.Sink and
// sinks.AtMostOnce. Write is never called concurrently with itself; Close
// may be called at any time, more than once.
type Sink struct {
	cfg  Config
	conn natsconn.Conn // cfg's connection, resolved
	name string
	log  *slog.Logger

	mu     sync.Mutex // guards the fields below
	nc     *nats.Conn
	closed bool
}

// New builds a sink from its config block: it fills the defaults, decodes
// (the decoder validates), takes url, credentials and TLS from env.NATS
// when url and context are empty (natsconn.ForSink), and does no network
// I/O.
func New(decode config.Decoder, env sinks.Env) (sinks.Sink, error) {
	cfg := DefaultConfig()
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	conn, err := natsconn.ForSink("sinks."+env.Name+".config", cfg.URL, cfg.NATSClient, env.NATS)
	if err != nil {
		return nil, err
	}
	cfg.URL = conn.URL
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{cfg: cfg, conn: conn, name: env.Name, log: log}, nil
}

// AtMostOnce returns true: the pipeline does not hold back the checkpoint
// for this sink, and drops a batch it failed to write.
func (s *Sink) AtMostOnce() bool { return true }

// Connect dials the servers unless already connected. After a Write failed
// with sinks.ErrNotConnected it waits, within ctx, for the client's own
// reconnection. Idempotent and cheap to call again; ctx bounds dialling.
func (s *Sink) Connect(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sinks.Permanent(errClosed)
	}
	nc := s.nc
	s.mu.Unlock()

	if nc != nil && !nc.IsClosed() {
		if err := natsconn.WaitConnected(ctx, nc); err != nil {
			return fmt.Errorf("connecting to %s: %w: %w", config.Redact(s.cfg.URL), sinks.ErrNotConnected, err)
		}
		if err := natsconn.Alive(ctx, nc, min(s.cfg.FlushTimeout, s.conn.PingWindow()), s.log); err != nil {
			return fmt.Errorf("connecting to %s: %w: %w", config.Redact(s.cfg.URL), sinks.ErrNotConnected, err)
		}
		return nil
	}
	nc, err := s.dial(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		nc.Close()
		return sinks.Permanent(errClosed)
	}
	s.nc = nc
	return nil
}

func (s *Sink) dial(ctx context.Context) (*nats.Conn, error) {
	return natsconn.Dial(ctx, natsconn.Settings{Conn: s.conn, Sink: s.name, FlusherTimeout: s.cfg.FlushTimeout}, s.log)
}

// Write publishes the batch in order, then flushes once, bounded by ctx and
// flush_timeout.
//
// nil means the server received every change. A *sinks.BatchError lists
// the changes that were not published: the first that failed and every
// one after it (Write stops there, so nothing is published out of order);
// the changes before it were published and flushed. That first failure is
// sinks.Permanent when the change can never be published: larger than the
// server's max_payload, or an invalid subject. Any other error means the
// whole batch failed: nothing is known to have reached the server, though
// some of it may have. Errors wrap sinks.ErrNotConnected when the
// connection is down (the pipeline calls Connect). A Write on a closed sink
// fails with a Permanent error, one before Connect with ErrNotConnected.
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	if len(batch) == 0 {
		return nil
	}
	s.mu.Lock()
	nc, closed := s.nc, s.closed
	s.mu.Unlock()
	doing := fmt.Sprintf("writing %d changes to %s", len(batch), config.Redact(s.cfg.URL))
	switch {
	case closed:
		return sinks.Permanent(fmt.Errorf("%s: %w", doing, errClosed))
	case nc == nil || !nc.IsConnected():
		return fmt.Errorf("%s: %w", doing, sinks.ErrNotConnected)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", doing, ctx.Err())
	}

	var berr sinks.BatchError
	stop := len(batch) // first index not published
	for i := range batch {
		c := &batch[i]
		if !validSubject(c.Subject) {
			berr.Fail(i, sinks.Permanent(fmt.Errorf("publishing %s: invalid subject %q", c.ID(), c.Subject)))
			stop = i
			break
		}
		msg := s.toMsg(c)
		if err := nc.PublishMsg(msg); err != nil {
			berr.Fail(i, s.publishErr(nc, c, len(msg.Data)+natsconn.HeaderSize(msg.Header), err))
			stop = i
			break
		}
	}
	for i := stop + 1; i < len(batch); i++ {
		berr.Fail(i, fmt.Errorf("not publishing %s after #%d failed: %w", batch[i].ID(), stop, errSkipped))
	}
	if stop > 0 {
		fctx, cancel := context.WithTimeout(ctx, s.cfg.FlushTimeout)
		err := nc.FlushWithContext(fctx)
		cancel()
		if err != nil {
			if isConnErr(err) || !nc.IsConnected() {
				return fmt.Errorf("%s: flushing: %w: %w", doing, sinks.ErrNotConnected, err)
			}
			return fmt.Errorf("%s: flushing: %w", doing, err)
		}
		// The server refuses a publish apart from it, before the flush's
		// answer: a subject of this batch it refused was not delivered.
		if subject, denied := natsconn.LastRefusal(nc); denied != nil && slices.ContainsFunc(batch[:stop], func(c cdc.Change) bool { return c.Subject == subject }) {
			return fmt.Errorf("%s: %w", doing, denied)
		}
	}
	return berr.Err()
}

// publishErr classifies a publish failure of c.
func (s *Sink) publishErr(nc *nats.Conn, c *cdc.Change, size int, err error) error {
	doing := fmt.Sprintf("publishing %s to %q", c.ID(), c.Subject)
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return sinks.Permanent(fmt.Errorf("%s: the message is %d bytes, over the server's max_payload of %d: %w",
			doing, size, nc.MaxPayload(), err))
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrHeadersNotSupported):
		return sinks.Permanent(fmt.Errorf("%s: %w", doing, err))
	case isConnErr(err) || !nc.IsConnected():
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// isConnErr reports errors that mean the connection is unavailable.
func isConnErr(err error) bool {
	for _, e := range []error{
		nats.ErrConnectionClosed, nats.ErrDisconnected, nats.ErrReconnectBufExceeded,
		nats.ErrConnectionDraining, nats.ErrConnectionReconnecting, nats.ErrNoServers,
		nats.ErrStaleConnection,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// toMsg builds the message of c: its subject and payload as the router set
// them, the change's own headers (except "Nats-*" ones) and the bridge's,
// named as nats_jetstream names them.
func (s *Sink) toMsg(c *cdc.Change) *nats.Msg {
	h := make(nats.Header, len(c.Headers)+4)
	for k, v := range c.Headers {
		if !natsconn.ValidHeader(k, v) {
			s.log.Warn("dropping an invalid or reserved header", "change", c.ID(), "header", k)
			continue
		}
		h[k] = []string{v}
	}
	h[nats.MsgIdHdr] = []string{c.ID()} // "Nats-Msg-Id", as nats_jetstream sets it
	if c.TxSize > 0 {
		h[natsjs.HeaderTxSize] = []string{strconv.FormatUint(uint64(c.TxSize), 10)}
	}
	if c.Op != cdc.OpMessage && c.Table != "" {
		h[natsjs.HeaderTable] = []string{c.Schema + "." + c.Table}
	}
	h[natsjs.HeaderOp] = []string{string(c.Op)}
	return &nats.Msg{Subject: c.Subject, Data: c.Payload, Header: h}
}

// validSubject reports whether s can be published to: non-empty tokens, no
// whitespace, no wildcards.
func validSubject(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	for _, t := range strings.Split(s, ".") {
		if t == "" || t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// Close flushes what was published and closes the connection. It returns
// by ctx's deadline even if the server hangs, closing the connection
// without waiting any more. Idempotent; Write and Connect fail once it has
// been called.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	nc := s.nc
	s.mu.Unlock()
	if nc == nil || nc.IsClosed() {
		return nil
	}
	var err error
	if nc.IsConnected() {
		fctx, cancel := context.WithTimeout(ctx, s.cfg.FlushTimeout)
		if ferr := nc.FlushWithContext(fctx); ferr != nil {
			err = fmt.Errorf("closing: flushing: %w", ferr)
		}
		cancel()
	}
	done := make(chan struct{})
	go func() {
		nc.Close() // flushes; bounded by the FlusherTimeout (flush_timeout)
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		if err == nil {
			err = fmt.Errorf("closing: %w", ctx.Err())
		}
	}
	return err
}

// Interface guards.
var (
	_ sinks.Sink       = (*Sink)(nil)
	_ sinks.AtMostOnce = (*Sink)(nil)
)
