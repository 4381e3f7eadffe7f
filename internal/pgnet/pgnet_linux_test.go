package pgnet_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// sockopts are a TCP socket's keepalive and user timeout options.
type sockopts struct{ keepalive, idle, interval, count, userTimeout int }

func readSockopts(t *testing.T, c net.Conn) sockopts {
	t.Helper()
	tc, ok := c.(*net.TCPConn)
	require.True(t, ok, "%T", c)
	rc, err := tc.SyscallConn()
	require.NoError(t, err)
	var o sockopts
	var errs []error
	require.NoError(t, rc.Control(func(fd uintptr) {
		get := func(level, opt int, dst *int) {
			v, err := unix.GetsockoptInt(int(fd), level, opt)
			errs = append(errs, err)
			*dst = v
		}
		get(unix.SOL_SOCKET, unix.SO_KEEPALIVE, &o.keepalive)
		get(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, &o.idle)
		get(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, &o.interval)
		get(unix.IPPROTO_TCP, unix.TCP_KEEPCNT, &o.count)
		get(unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, &o.userTimeout)
	}))
	for _, err := range errs {
		require.NoError(t, err)
	}
	return o
}
