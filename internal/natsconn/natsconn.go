// Package natsconn holds the bridge's NATS connections: a section of
// bridge.yaml (nats, or a NATS sink's block) resolved with the nats CLI
// context it names (Resolve, Conn), its files checked at start (Check),
// its nats.go options (credentials, TLS), connection failures turned into
// one line with the fix (Explain, PermissionDenied), Connect for the
// runtime and the helper commands, and Dial, which dials NATS the way the
// NATS sinks need it: no reconnect buffer (a publish during an outage
// fails instead of being sent later behind a gap), unbounded reconnects on
// DESIGN.md §5's curve, a flusher timeout so a server that stopped
// reading cannot hang a write, and connection events logged without
// credentials.
package natsconn

import (
	"context"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// Connect connects to c.URL as name, with c's credentials and TLS and the
// extra options (timeouts, reconnects, handlers). An error names the URL
// (redacted) and, for what retrying cannot cure, is a permanent *Error
// with the fix (Explain).
func Connect(c Conn, name string, extra ...nats.Option) (*nats.Conn, error) {
	o, err := c.Options()
	if err != nil {
		return nil, sinks.Permanent(&Error{What: err.Error(), Fix: "correct the file, or the key that names it", Err: err})
	}
	opts := append(append([]nats.Option{nats.Name(name)}, extra...), o...)
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", config.Redact(c.URL), c.Explain(err))
	}
	return nc, nil
}

// Settings is one sink's connection.
type Settings struct {
	Conn
	// Sink names the connection ("bridge sink <name>").
	Sink string
	// FlusherTimeout bounds a write to the socket.
	FlusherTimeout time.Duration
}

// Dial connects; ctx's deadline (at most 5s) bounds the first connection.
// It logs a warning when st turns TLS verification off.
func Dial(ctx context.Context, st Settings, log *slog.Logger) (*nats.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", config.Redact(st.URL), err)
	}
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(d), time.Millisecond))
	}
	name := "bridge"
	if st.Sink != "" {
		name += " sink " + st.Sink
	}
	st.Warn(log)
	return Connect(st.Conn, name,
		nats.Timeout(timeout),
		nats.MaxReconnects(-1),
		// No reconnect buffer: a publish while disconnected fails at once
		// instead of being sent after the reconnect, behind a gap.
		nats.ReconnectBufSize(-1),
		nats.CustomReconnectDelay(ReconnectDelay),
		// Bounds a write to a server that stopped reading, Close included.
		nats.FlusherTimeout(st.FlusherTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS async error", "error", err)
		}),
	)
}

// ReconnectDelay is DESIGN.md §5's curve for a lost connection: the client
// redials at once, then waits 250ms doubling to 2s, with equal jitter.
func ReconnectDelay(attempts int) time.Duration {
	d := 2 * time.Second
	if attempts >= 1 && attempts <= 4 {
		d = 250 * time.Millisecond << (attempts - 1)
	}
	return d/2 + mrand.N(d/2+1)
}

// WaitConnected waits for a reconnecting nc until it is connected again, it
// is closed, or ctx ends.
func WaitConnected(ctx context.Context, nc *nats.Conn) error {
	ch := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(ch)
	for {
		switch nc.Status() {
		case nats.CONNECTED:
			return nil
		case nats.CLOSED:
			return nats.ErrConnectionClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ValidHeader rejects what would corrupt the header block, and "Nats-*"
// headers, which would steer JetStream (Nats-Expected-*, Nats-Rollup, ...).
func ValidHeader(k, v string) bool {
	if k == "" || strings.ContainsAny(k, ": \t\r\n") || strings.ContainsAny(v, "\r\n") {
		return false
	}
	return !strings.HasPrefix(strings.ToLower(k), "nats-")
}

// HeaderSize is the size of h on the wire.
func HeaderSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}
