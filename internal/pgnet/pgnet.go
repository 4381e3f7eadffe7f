// Package pgnet gives the bridge's PostgreSQL connections the TCP
// settings of libpq's connection parameters keepalives, keepalives_idle,
// keepalives_interval, keepalives_count and tcp_user_timeout, which pgx
// does not implement: it sends them to the server as run-time settings,
// where the keepalives ones are refused (`unrecognized configuration
// parameter "keepalives"`) and tcp_user_timeout sets the server's own
// socket, not the bridge's. Where a DSN sets none, the bridge's defaults
// apply: keepalive probes after 10 s of silence, every 5 s, and a TCP user
// timeout of 20 s.
//
// These act in the kernel. TCP_USER_TIMEOUT ends a connection whose sent
// data (a status update, a query, a keepalive probe) the other host has
// not acknowledged for that long: a host or network path that stopped
// answering, as when a firewall or NAT entry is lost. It cannot notice a
// peer whose TCP stack still acknowledges while nothing comes back (a
// userspace proxy or load balancer that lost its upstream, a server
// process that hangs); the application's own timeouts cover those (the
// replication connection's receive_timeout). TCP_USER_TIMEOUT is Linux's;
// elsewhere only the keepalives apply.
package pgnet

import (
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The bridge's defaults, for a DSN that does not set libpq's parameters.
const (
	DefaultKeepaliveIdle     = 10 * time.Second
	DefaultKeepaliveInterval = 5 * time.Second
	DefaultKeepaliveCount    = 3
	DefaultUserTimeout       = 20 * time.Second
)

// Settings are a connection's TCP settings. A zero duration or count
// leaves the operating system's value, as 0 does in libpq.
type Settings struct {
	// Keepalives turns TCP keepalive probes on (libpq's keepalives=1).
	Keepalives bool
	// KeepaliveIdle is the silence before the first probe (keepalives_idle).
	KeepaliveIdle time.Duration
	// KeepaliveInterval is the time between probes (keepalives_interval).
	KeepaliveInterval time.Duration
	// KeepaliveCount is how many unanswered probes end the connection
	// (keepalives_count).
	KeepaliveCount int
	// UserTimeout is how long sent data may stay unacknowledged before the
	// kernel ends the connection (tcp_user_timeout, TCP_USER_TIMEOUT).
	UserTimeout time.Duration
}

// Defaults returns the bridge's settings.
func Defaults() Settings {
	return Settings{Keepalives: true, KeepaliveIdle: DefaultKeepaliveIdle, KeepaliveInterval: DefaultKeepaliveInterval,
		KeepaliveCount: DefaultKeepaliveCount, UserTimeout: DefaultUserTimeout}
}

// Take removes libpq's TCP parameters from params (a pgconn.Config's
// RuntimeParams, where pgx leaves them) and returns Defaults with the
// values they set, in libpq's units: keepalives 0 or 1, keepalives_idle
// and keepalives_interval in seconds, keepalives_count a count,
// tcp_user_timeout in milliseconds. An error names the parameter and what
// it must be; params is then unchanged.
func Take(params map[string]string) (Settings, error) {
	s := Defaults()
	num := func(name string) (int, bool, error) {
		v, ok := params[name]
		if !ok {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, false, fmt.Errorf("%s=%q: must be a whole number >= 0 (%s)", name, v, units[name])
		}
		return n, true, nil
	}
	for _, p := range []struct {
		name string
		set  func(int)
	}{
		{"keepalives", func(n int) { s.Keepalives = n != 0 }},
		{"keepalives_idle", func(n int) { s.KeepaliveIdle = time.Duration(n) * time.Second }},
		{"keepalives_interval", func(n int) { s.KeepaliveInterval = time.Duration(n) * time.Second }},
		{"keepalives_count", func(n int) { s.KeepaliveCount = n }},
		{"tcp_user_timeout", func(n int) { s.UserTimeout = time.Duration(n) * time.Millisecond }},
	} {
		n, ok, err := num(p.name)
		if err != nil {
			return Settings{}, err
		}
		if ok {
			p.set(n)
		}
	}
	for name := range units {
		delete(params, name)
	}
	return s, nil
}

// units says what each of libpq's parameters counts, for messages.
var units = map[string]string{
	"keepalives":          "0 turns keepalive probes off, 1 on",
	"keepalives_idle":     "seconds of silence before the first probe; 0: the system's",
	"keepalives_interval": "seconds between probes; 0: the system's",
	"keepalives_count":    "unanswered probes that end the connection; 0: the system's",
	"tcp_user_timeout":    "milliseconds sent data may stay unacknowledged; 0: the system's",
}

// Apply takes libpq's TCP parameters out of cfg.RuntimeParams (Take) and
// sets cfg.DialFunc to dial with them; cfg.ConnectTimeout (the DSN's
// connect_timeout) still bounds dialling.
func Apply(cfg *pgconn.Config) error {
	s, err := Take(cfg.RuntimeParams)
	if err != nil {
		return err
	}
	cfg.DialFunc = s.Dialer(cfg.ConnectTimeout).DialContext
	return nil
}

// Dialer returns a dialer that applies s to TCP connections (Unix sockets
// have no such settings), its timeout connectTimeout (0: none).
func (s Settings) Dialer(connectTimeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: connectTimeout, KeepAlive: -1}
	if s.Keepalives {
		sys := func(v time.Duration) time.Duration {
			if v <= 0 {
				return -1 // the system's
			}
			return v
		}
		count := s.KeepaliveCount
		if count <= 0 {
			count = -1
		}
		d.KeepAliveConfig = net.KeepAliveConfig{Enable: true, Idle: sys(s.KeepaliveIdle), Interval: sys(s.KeepaliveInterval), Count: count}
	}
	if s.UserTimeout > 0 {
		ms := int(s.UserTimeout / time.Millisecond)
		d.Control = func(network, _ string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil
			}
			var serr error
			if err := c.Control(func(fd uintptr) { serr = setUserTimeout(fd, ms) }); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("setting TCP_USER_TIMEOUT: %w", serr)
			}
			return nil
		}
	}
	return d
}
