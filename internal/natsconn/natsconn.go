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
// credentials (Events). Every connection pings its server
// (ping_interval, max_pings_outstanding: Conn.Options), so a link that
// goes silent without a reset is taken as dead within seconds rather than
// nats.go's default of minutes; Alive checks a connection a sink is about
// to use again and reconnects it when it went silent.
package natsconn

import (
	"context"
	"errors"
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
		Events(log),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS async error", "error", err)
		}),
	)
}

// Events returns the option that logs a connection's losses and
// reconnections, naming the connection (its nats.Name). A connection
// taken as dead for want of pong answers (nats.ErrStaleConnection) is
// logged as such, with its ping settings: the link went silent without a
// reset.
func Events(log *slog.Logger) nats.Option {
	return func(o *nats.Options) error {
		o.DisconnectedErrCB = func(nc *nats.Conn, err error) {
			switch {
			case err == nil:
			case errors.Is(err, nats.ErrStaleConnection):
				log.Warn("NATS connection is dead: the server answered none of the last pings; reconnecting",
					"connection", nc.Opts.Name, "ping_interval", nc.Opts.PingInterval.String(), "max_pings_outstanding", nc.Opts.MaxPingsOut, "error", err)
			default:
				log.Warn("disconnected from NATS", "connection", nc.Opts.Name, "error", err)
			}
		}
		o.ReconnectedCB = func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "connection", nc.Opts.Name, "server", nc.ConnectedUrlRedacted())
		}
		return nil
	}
}

// Alive checks that nc's server answers a ping within timeout (bounded by
// ctx), which a healthy server does however busy its JetStream is. When
// it does not, the link is taken as dead before the pings would declare
// it stale: Alive logs it, forces a reconnect and waits for it within
// ctx. Call it when a run starts again after a failure, so that a
// pipeline does not restart over and over on a connection that went
// silent. A nil error means nc is connected and answered (or reconnected).
// A ctx that ends before timeout bounds the ping but does not judge the
// link: no answer by then is ctx's error, not a dead connection (a server
// may take up to timeout), and nothing is reconnected.
func Alive(ctx context.Context, nc *nats.Conn, timeout time.Duration, log *slog.Logger) error {
	short := false
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout, short = time.Until(d), true
	}
	if timeout <= 0 {
		return ctx.Err()
	}
	err := nc.FlushTimeout(timeout)
	if short && errors.Is(err, nats.ErrTimeout) {
		<-ctx.Done()
		return fmt.Errorf("pinging %s: no answer before the deadline, too soon to judge the link: %w", nc.Opts.Name, ctx.Err())
	}
	if err == nil || !errors.Is(err, nats.ErrTimeout) {
		if err != nil && !nc.IsConnected() {
			return WaitConnected(ctx, nc)
		}
		return err
	}
	log.Warn("NATS connection is dead: no answer to a ping; reconnecting", "connection", nc.Opts.Name, "waited", timeout.String())
	if err := nc.ForceReconnect(); err != nil {
		return fmt.Errorf("reconnecting %s: %w", nc.Opts.Name, err)
	}
	return WaitConnected(ctx, nc)
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
