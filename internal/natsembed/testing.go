package natsembed

import (
	"context"
	"testing"
	"time"

	"github.com/bridgecdc/bridge/internal/testport"
)

// StartT starts a server for a test and shuts it down in t.Cleanup. An
// empty StoreDir becomes a fresh t.TempDir() and Port 0 a port from Ports.
// To simulate a NATS restart, Shutdown the server and call StartT(t,
// srv.Options()) or Restart: same port, same store.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	if o.Port == 0 {
		o.Port = Ports(t, 1)[0]
	}
	s, err := Restart(o, 30*time.Second) // a restart's port may take a moment to come free
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

// Ports returns n distinct loopback ports for servers a test stops and
// starts again on the same port. Each stays free while its server is down
// until the test ends; see testport.Claim for how.
func Ports(t testing.TB, n int) []int {
	t.Helper()
	var out []int
	seen := map[int]bool{}
	for len(out) < n {
		p, release, err := testport.Claim()
		if err != nil {
			t.Fatalf("natsembed: %v", err)
		}
		t.Cleanup(release)
		if !seen[p] { // the kernel's fallback ports may repeat
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}
