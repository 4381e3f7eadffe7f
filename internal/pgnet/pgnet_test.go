package pgnet_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgnet"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// TestTake: libpq's parameters, in libpq's units, over the bridge's
// defaults; they leave the run-time parameters pgx would send the server.
func TestTake(t *testing.T) {
	params := map[string]string{"application_name": "x"}
	s, err := pgnet.Take(params)
	require.NoError(t, err)
	assert.Equal(t, pgnet.Defaults(), s)
	assert.Equal(t, pgnet.Settings{Keepalives: true, KeepaliveIdle: 10 * time.Second, KeepaliveInterval: 5 * time.Second,
		KeepaliveCount: 3, UserTimeout: 20 * time.Second}, s)

	params = map[string]string{"application_name": "x", "keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "0",
		"keepalives_count": "4", "tcp_user_timeout": "15000"}
	s, err = pgnet.Take(params)
	require.NoError(t, err)
	assert.Equal(t, pgnet.Settings{Keepalives: true, KeepaliveIdle: 30 * time.Second, KeepaliveCount: 4, UserTimeout: 15 * time.Second}, s)
	assert.Equal(t, map[string]string{"application_name": "x"}, params)

	s, err = pgnet.Take(map[string]string{"keepalives": "0", "tcp_user_timeout": "0"})
	require.NoError(t, err)
	assert.False(t, s.Keepalives)
	assert.Zero(t, s.UserTimeout, "0 is the system's, as in libpq")

	params = map[string]string{"tcp_user_timeout": "20s"}
	_, err = pgnet.Take(params)
	require.EqualError(t, err, `tcp_user_timeout="20s": must be a whole number >= 0 (milliseconds sent data may stay unacknowledged; 0: the system's)`)
	assert.Contains(t, params, "tcp_user_timeout", "unchanged on error")
	_, err = pgnet.Take(map[string]string{"keepalives_idle": "-1"})
	require.ErrorContains(t, err, `keepalives_idle="-1": must be a whole number >= 0`)
}

// TestApplyConnects: a DSN with libpq's TCP parameters connects to a real
// server (pgx alone fails on keepalives, and hands tcp_user_timeout to the
// server's socket), and a dialled socket carries them.
func TestApplyConnects(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	dsn := pg.DSN("") + "&keepalives=1&keepalives_idle=7&keepalives_interval=3&keepalives_count=2&tcp_user_timeout=9000&connect_timeout=5"
	_, err := pgx.Connect(t.Context(), dsn)
	require.ErrorContains(t, err, `unrecognized configuration parameter "keepalives`, "pgx sends libpq's parameters to the server")

	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	require.NoError(t, pgnet.Apply(&cfg.Config))
	var got sockopts
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		c, err = dial(ctx, network, addr)
		if err == nil {
			got = readSockopts(t, c)
		}
		return c, err
	}
	c, err := pgx.ConnectConfig(t.Context(), cfg)
	require.NoError(t, err)
	defer c.Close(context.Background())
	var server string
	require.NoError(t, c.QueryRow(t.Context(), `SHOW tcp_user_timeout`).Scan(&server))
	assert.Equal(t, "0", server, "the server's own socket is left alone")
	assert.Equal(t, sockopts{keepalive: 1, idle: 7, interval: 3, count: 2, userTimeout: 9000}, got)
}

// TestDefaultsOnSocket: a socket dialled with the defaults carries them.
func TestDefaultsOnSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := pgnet.Defaults().Dialer(5*time.Second).DialContext(t.Context(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, sockopts{keepalive: 1, idle: 10, interval: 5, count: 3, userTimeout: 20000}, readSockopts(t, c))

	off := pgnet.Settings{}
	c2, err := off.Dialer(5*time.Second).DialContext(t.Context(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	assert.Zero(t, readSockopts(t, c2).keepalive, "keepalives=0 turns them off")
	assert.Zero(t, readSockopts(t, c2).userTimeout)
}
