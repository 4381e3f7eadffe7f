package natsembed

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStartSaysWhyPortIsTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	_, err = Start(Options{Port: port, StoreDir: t.TempDir()})
	require.Error(t, err)
	// The server's own reason, not a timeout, and who holds the port.
	require.ErrorContains(t, err, "address already in use")
	require.NotContains(t, err.Error(), "not ready after")
	require.ErrorContains(t, err, "held by LISTEN")
}

func TestRestartWaitsForThePort(t *testing.T) {
	p := Ports(t, 1)[0]
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	require.NoError(t, err)
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = l.Close()
	}()
	s, err := Restart(Options{Port: p, StoreDir: t.TempDir()}, 20*time.Second)
	require.NoError(t, err)
	require.Equal(t, p, s.Options().Port)
	require.NoError(t, s.Shutdown(t.Context()))
}

func TestPortsAreDistinct(t *testing.T) {
	ps := Ports(t, 6)
	require.Len(t, ps, 6)
	seen := map[int]bool{}
	for _, p := range ps {
		require.False(t, seen[p], "port %d twice", p)
		seen[p] = true
	}
}

func TestHexAddr(t *testing.T) {
	require.Equal(t, "127.0.0.1:4222", hexAddr("0100007F:107E"))
	require.Equal(t, "00000000000000000000000001000000:80", hexAddr("00000000000000000000000001000000:0050"))
	require.Equal(t, "junk", hexAddr("junk"))
}
