package natsembed

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

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

// UserT makes a user nkey for a test: its public key, for the server's
// Options.Nkeys, and its seed, for the client.
func UserT(t testing.TB) (pub string, seed []byte) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	if seed, err = kp.Seed(); err != nil {
		t.Fatal(err)
	}
	return pub, seed
}

// CredsT returns the content of a .creds file of a user with every
// permission in a new operator's account, for tests that need credentials
// that parse.
func CredsT(t testing.TB) []byte {
	t.Helper()
	op, err := NewOperator("test")
	if err != nil {
		t.Fatal(err)
	}
	acct, err := op.NewAccount("A", true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := acct.Creds("bridge", jwt.Permissions{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
