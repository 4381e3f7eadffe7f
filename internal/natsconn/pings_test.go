package natsconn_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/faultproxy"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/syncbuf"
	"github.com/bridgecdc/bridge/sinks"
)

// TestPingOptions: every connection pings with config's defaults unless
// its section sets its own; a sink without its own ping keys takes the
// bridge's, whatever its url.
func TestPingOptions(t *testing.T) {
	c, err := natsconn.Resolve("nats", "nats://n:4222", config.NATSClient{})
	require.NoError(t, err)
	ping, pings := c.Pings()
	assert.Equal(t, config.DefaultNATSPingInterval, ping)
	assert.Equal(t, config.DefaultNATSMaxPingsOutstanding, pings)
	assert.Equal(t, 9*time.Second, c.PingWindow(), "the defaults take a silent link as dead after 9 to 12 s")
	var o nats.Options
	opts, err := c.Options()
	require.NoError(t, err)
	for _, f := range opts {
		require.NoError(t, f(&o))
	}
	assert.Equal(t, config.DefaultNATSPingInterval, o.PingInterval)
	assert.Equal(t, config.DefaultNATSMaxPingsOutstanding, o.MaxPingsOut)

	bridge := sinks.NATSEnv{URL: "nats://n:4222", NATSClient: config.NATSClient{PingInterval: 2 * time.Second, MaxPingsOutstanding: 4}}
	for _, url := range []string{"", "nats://elsewhere:4222"} {
		c, err = natsconn.ForSink("sinks.s.config", url, config.NATSClient{}, bridge)
		require.NoError(t, err)
		ping, pings = c.Pings()
		assert.Equal(t, 2*time.Second, ping, "url %q", url)
		assert.Equal(t, 4, pings, "url %q", url)
		c, err = natsconn.ForSink("sinks.s.config", url, config.NATSClient{PingInterval: time.Second}, bridge)
		require.NoError(t, err)
		ping, pings = c.Pings()
		assert.Equal(t, time.Second, ping, "the sink's own wins; url %q", url)
		assert.Equal(t, 4, pings, "url %q", url)
	}
}

// logBuf is a logger whose lines a test can search.
type logBuf struct {
	syncbuf.Buffer
}

func (l *logBuf) has(s string) bool { return strings.Contains(l.String(), s) }

// blackHoled connects through a proxy with pings of ping × pings, and
// returns the connection, the proxy and the connection's log.
func blackHoled(t *testing.T, ping time.Duration, pings int) (*nats.Conn, *faultproxy.Proxy, *logBuf) {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	p, err := faultproxy.Start(strings.TrimPrefix(srv.URL(), "nats://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	c, err := natsconn.Resolve("nats", "nats://"+p.Addr(), config.NATSClient{PingInterval: ping, MaxPingsOutstanding: pings})
	require.NoError(t, err)
	lb := &logBuf{}
	nc, err := natsconn.Connect(c, "test conn", nats.Timeout(5*time.Second), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), natsconn.Events(slog.New(slog.NewTextHandler(lb, nil))))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.FlushTimeout(5*time.Second))
	return nc, p, lb
}

// TestPingsNoticeBlackHole: a connection whose link goes silent for good
// (faultproxy.BlackHole) is taken as dead by its pings, logged as such
// with its name, and reconnected over a new link, which works.
func TestPingsNoticeBlackHole(t *testing.T) {
	nc, p, lb := blackHoled(t, 200*time.Millisecond, 2)
	require.Equal(t, 1, p.BlackHole())
	holed := time.Now()
	require.Eventually(t, func() bool { return lb.has("NATS connection is dead") }, 10*time.Second, 10*time.Millisecond,
		"the pings never noticed the black hole")
	t.Logf("noticed after %s", time.Since(holed).Round(time.Millisecond))
	assert.True(t, lb.has(`connection="test conn"`), "the log names the connection: %s", lb.String())
	assert.True(t, lb.has("ping_interval=200ms"))
	require.Eventually(t, func() bool { return nc.IsConnected() && nc.Stats().Reconnects == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, nc.FlushTimeout(5*time.Second), "the new link works")
	require.Eventually(t, func() bool { return lb.has("reconnected to NATS") }, 10*time.Second, 10*time.Millisecond,
		"the reconnection is logged (by nats.go's callback goroutine)")
}

// TestAliveReconnectsSilentConnection: with pings too slow to have noticed
// yet, Alive finds the black-holed connection dead, reconnects it, and
// leaves a healthy one alone, and a link it had too little time to judge.
func TestAliveReconnectsSilentConnection(t *testing.T) {
	nc, p, lb := blackHoled(t, time.Hour, 2)
	log := slog.New(slog.NewTextHandler(lb, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, natsconn.Alive(ctx, nc, 500*time.Millisecond, log))
	require.Zero(t, nc.Stats().Reconnects, "a healthy connection is left alone")

	p.BlackHole()
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	require.ErrorIs(t, natsconn.Alive(short, nc, 500*time.Millisecond, log), context.DeadlineExceeded)
	require.Zero(t, nc.Stats().Reconnects, "a deadline shorter than the timeout does not judge the link")
	require.NoError(t, natsconn.Alive(ctx, nc, 500*time.Millisecond, log))
	assert.True(t, lb.has("NATS connection is dead: no answer to a ping"), lb.String())
	assert.Equal(t, uint64(1), nc.Stats().Reconnects)
	require.NoError(t, nc.FlushTimeout(5*time.Second), "the new link works")
}
