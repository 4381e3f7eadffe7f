package natsembed

import (
	"context"
	"testing"
	"time"
)

// StartT starts a server for a test and shuts it down in t.Cleanup. An
// empty StoreDir becomes a fresh t.TempDir() and Port 0 a random port. To
// simulate a NATS restart, Shutdown the server and call
// StartT(t, srv.Options()): same port, same store.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	if o.Port == 0 {
		o.Port = -1
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
