package pgtypes

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/bridgecdc/bridge/internal/pgtest"
)

// One private cluster serves every test in the package that needs one; it
// starts on first use and is destroyed by TestMain.
var (
	pgOnce sync.Once
	pgSrv  *pgtest.Server
	pgErr  error
)

func server(t *testing.T) *pgtest.Server {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgSrv, pgErr = pgtest.Start(ctx, pgtest.Options{})
	})
	if pgErr != nil {
		t.Fatalf("starting postgres: %v", pgErr)
	}
	return pgSrv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pgSrv != nil {
		pgSrv.Destroy()
	}
	os.Exit(code)
}
