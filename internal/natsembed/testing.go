package natsembed

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartT starts a server for a test and shuts it down in t.Cleanup. An
// empty StoreDir becomes a fresh t.TempDir() and Port 0 a free port below
// the kernel's ephemeral range (see restartablePort). To simulate a NATS
// restart, Shutdown the server and call StartT(t, srv.Options()): same
// port, same store.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	if o.Port == 0 {
		o.Port = restartablePort()
	}
	s, err := Start(o)
	if err != nil {
		t.Fatalf("natsembed: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("natsembed: %v", err)
		}
	})
	return s
}

// restartablePort returns a free port below the kernel's ephemeral range,
// or -1 (any free port) when none is found. A test that restarts a server
// on its port needs the port to stay free while the server is down. A port
// the kernel handed out can meanwhile become the local port of some other
// test's outgoing connection, and the restart then fails for as long as
// that connection lives: TestConformance/break_during_write in
// sinks/natscore once waited 200 s for it. Ports below the ephemeral range
// are never handed out that way.
func restartablePort() int {
	low := 32768 // Linux's default start of net.ipv4.ip_local_port_range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	const from = 10000
	if low <= from+1000 {
		return -1
	}
	for range 50 {
		p := from + rand.IntN(low-from)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	return -1
}
