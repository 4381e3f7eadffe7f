package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, s string, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(s + "\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func TestProxyForwardsStallsAndCuts(t *testing.T) {
	p, err := Start(echoServer(t))
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	got, err := roundTrip(c, r, "hello", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "hello\n", got)

	// Stalled: nothing comes back, the socket stays open.
	p.Stall()
	_, err = roundTrip(c, r, "held", 300*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "a stalled link times out rather than failing: %v", err)
	// Resumed: the held bytes arrive.
	p.Resume()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err = r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", got)

	// Cut: the connection is reset; a new one works.
	p.Cut()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = r.ReadString('\n')
	require.Error(t, err)
	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c2.Close()
	got, err = roundTrip(c2, bufio.NewReader(c2), "again", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "again\n", got)
}
