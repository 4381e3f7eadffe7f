package faultproxy

import (
	"bufio"
	"errors"
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

// TestBlackHoleSilencesOpenConnectionsOnly: after BlackHole the open
// connection stays open on both sides but carries nothing either way, a
// close on one side is not passed on, and a new connection works.
func TestBlackHoleSilencesOpenConnectionsOnly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	p, err := Start(ln.Addr().String())
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	var srv net.Conn
	select {
	case srv = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not connect to the target")
	}
	defer srv.Close()
	// Forwarded both ways before.
	send := func(w net.Conn, s string) {
		t.Helper()
		_ = w.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, err := w.Write([]byte(s))
		require.NoError(t, err, "writing to a black-holed connection fails nowhere: the proxy takes the bytes")
	}
	recv := func(r net.Conn, within time.Duration) (string, error) {
		buf := make([]byte, 64)
		_ = r.SetReadDeadline(time.Now().Add(within))
		n, err := r.Read(buf)
		return string(buf[:n]), err
	}
	send(c, "up")
	got, err := recv(srv, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "up", got)
	send(srv, "down")
	got, err = recv(c, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "down", got)

	require.Equal(t, 1, p.BlackHole())
	require.Zero(t, p.BlackHole(), "already black-holed")
	silent := func(r net.Conn) {
		t.Helper()
		got, err := recv(r, 300*time.Millisecond)
		var ne net.Error
		require.ErrorAs(t, err, &ne, "got %q", got)
		require.True(t, ne.Timeout(), "a black-holed connection times out rather than failing: %v", err)
	}
	send(c, "lost up")
	silent(srv)
	send(srv, "lost down")
	silent(c)

	// A new connection is forwarded.
	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c2.Close()
	var srv2 net.Conn
	select {
	case srv2 = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not connect a new connection")
	}
	defer srv2.Close()
	send(c2, "new")
	got, err = recv(srv2, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "new", got)

	// The client gives the dead connection up: the server is not told.
	require.NoError(t, c.Close())
	silent(srv)
	send(srv, "still open")
	// Close ends it.
	require.NoError(t, p.Close())
	_, err = recv(srv, 5*time.Second)
	require.Error(t, err)
	var ne net.Error
	if errors.As(err, &ne) {
		require.False(t, ne.Timeout(), "Close ends the black-holed connection")
	}
}

// TestBlackHoleLatest black-holes the last connection opened and leaves
// the earlier one alone.
func TestBlackHoleLatest(t *testing.T) {
	p, err := Start(echoServer(t))
	require.NoError(t, err)
	defer p.Close()
	require.False(t, p.BlackHoleLatest(), "no connection yet")
	c1, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c1.Close()
	r1 := bufio.NewReader(c1)
	_, err = roundTrip(c1, r1, "one", 5*time.Second)
	require.NoError(t, err)
	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	_, err = roundTrip(c2, r2, "two", 5*time.Second)
	require.NoError(t, err)

	require.True(t, p.BlackHoleLatest())
	_, err = roundTrip(c2, r2, "lost", 300*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "the latest connection is silent: %v", err)
	got, err := roundTrip(c1, r1, "still", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "still\n", got, "the earlier connection is forwarded")
}
