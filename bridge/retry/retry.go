// Package retry holds the bridge's retry curves and its test of whether an
// error means a lost connection (DESIGN.md §5).
package retry

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/sinks"
)

// Backoff is the retry curve of DESIGN.md §5: a lost connection is redialled
// at once, then after 250ms doubling to 2s; other failures wait 1s doubling
// to 30s. Both use equal jitter and reset on progress. The zero value is ready.
type Backoff struct {
	attempt int
}

// Attempt returns the number of failures since the last reset.
func (b *Backoff) Attempt() int { return b.attempt }

// Reset starts the curve again.
func (b *Backoff) Reset() { b.attempt = 0 }

// Next returns the delay before the next try after err.
func (b *Backoff) Next(err error) time.Duration {
	b.attempt++
	base, ceil := time.Second, 30*time.Second
	if IsConnectionLoss(err) {
		if b.attempt == 1 {
			return 0
		}
		base, ceil = 250*time.Millisecond, 2*time.Second
	}
	d := base
	for i := 1; i < b.attempt && d < ceil; i++ {
		d *= 2
	}
	if d > ceil {
		d = ceil
	}
	half := d / 2
	return half + rand.N(half+1)
}

// IsConnectionLoss reports whether err means a connection was lost or
// refused, as opposed to a failure that a redial will not fix.
func IsConnectionLoss(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		case "55006": // the slot is active elsewhere: a standby retries on the short curve to take over fast
			return true
		}
		return false
	}
	if errors.Is(err, sinks.ErrNotConnected) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrStaleConnection) {
		return true
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}
