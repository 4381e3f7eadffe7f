package pgoutput_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/faultproxy"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/pgoutput"
)

// TestDeadReplicationConnection: a replication connection whose link goes
// silent for good (faultproxy.BlackHole: the server's and the bridge's
// sockets stay open, nothing crosses) is taken as lost after
// receive_timeout, and its walsender is ended, so the slot is free for
// the next run. The server runs with wal_sender_timeout = 0: only the
// bridge can free the slot.
func TestDeadReplicationConnection(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "0"}})
	pg.ExecT(t, `CREATE TABLE t (id int PRIMARY KEY)`)
	p, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", pg.Port))
	require.NoError(t, err)
	defer p.Close()
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port())
	block := map[string]any{"dsn": dsn, "tables": []any{"public.t"}, "status_interval": "200ms", "receive_timeout": "1s"}
	src, err := pgoutput.New((&config.Config{}).Decoder("sources.dc.config", block), sources.Env{Name: "dc", Logger: testLog(t)})
	require.NoError(t, err)
	defer src.Close(context.Background())
	require.NoError(t, openErr(t, src, 0))
	pg.ExecT(t, `INSERT INTO t VALUES (1)`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	txn, err := src.Read(ctx)
	require.NoError(t, err)
	require.Len(t, txn.Changes, 1)
	conn := pg.Conn(t, "")
	active := func() int {
		var pid int
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = 'bridge_dc'`).Scan(&pid))
		return pid
	}
	pid := active()
	require.NotZero(t, pid)

	require.Equal(t, 2, p.BlackHole(), "the catalog and replication connections")
	holed := time.Now()
	pg.ExecT(t, `INSERT INTO t VALUES (2)`) // decoded and sent into the void
	_, err = src.Read(ctx)
	t.Logf("after %s: %v", time.Since(holed).Round(time.Millisecond), err)
	require.ErrorContains(t, err, `replication connection on slot "bridge_dc" of database "postgres" silent for`)
	require.ErrorContains(t, err, "taking it as lost")
	require.Eventually(t, func() bool { return active() == 0 }, time.Minute, 50*time.Millisecond,
		"the walsender %d of the dead connection still holds the slot", pid)
	require.NoError(t, src.Close(context.Background()))

	// The next run, over a new connection, reads on from the slot.
	src2, err := pgoutput.New((&config.Config{}).Decoder("sources.dc.config", block), sources.Env{Name: "dc", Logger: testLog(t)})
	require.NoError(t, err)
	defer src2.Close(context.Background())
	require.NoError(t, openErr(t, src2, 0))
	// Nothing was acknowledged: the slot gives row 1 again, then row 2, which
	// was sent into the void.
	for _, want := range []int64{1, 2} {
		txn, err = src2.Read(ctx)
		require.NoError(t, err)
		require.Len(t, txn.Changes, 1)
		require.Equal(t, want, txn.Changes[0].After[0])
	}
}

// TestDeadReplicationLinkOnly: only the replication connection's link goes
// silent; the catalog connection still answers, and says that the
// walsender does not answer for want of work (it waits) or sends what
// never arrives: the connection is taken as lost, and the walsender ended
// over the catalog connection.
func TestDeadReplicationLinkOnly(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"wal_sender_timeout": "0"}})
	pg.ExecT(t, `CREATE TABLE t (id int PRIMARY KEY)`)
	p, err := faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", pg.Port))
	require.NoError(t, err)
	defer p.Close()
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port())
	block := map[string]any{"dsn": dsn, "tables": []any{"public.t"}, "status_interval": "200ms", "receive_timeout": "1s"}
	src, err := pgoutput.New((&config.Config{}).Decoder("sources.dc.config", block), sources.Env{Name: "dc", Logger: testLog(t)})
	require.NoError(t, err)
	defer src.Close(context.Background())
	require.NoError(t, openErr(t, src, 0))
	require.True(t, p.BlackHoleLatest(), "the replication connection, opened after the catalog one")
	pg.ExecT(t, `INSERT INTO t VALUES (1)`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = src.Read(ctx)
	t.Logf("%v", err)
	require.ErrorContains(t, err, "the link is dead; taking it as lost")
	conn := pg.Conn(t, "")
	require.Eventually(t, func() bool {
		var active bool
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT active FROM pg_replication_slots WHERE slot_name = 'bridge_dc'`).Scan(&active))
		return !active
	}, time.Minute, 50*time.Millisecond, "the walsender of the dead connection still holds the slot")
}

// TestBusyWalsenderCatalogClosed: while a walsender replays a large
// transaction it answers nothing, and with the catalog connection closed
// by the server meanwhile (idle_session_timeout) the source asks over a
// new connection, finds the walsender busy and waits: the next change
// arrives without the connection being taken as lost.
func TestBusyWalsenderCatalogClosed(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"idle_session_timeout": "'1s'"}})
	pg.ExecT(t, `CREATE TABLE t (id int PRIMARY KEY)`, `CREATE TABLE churn (id int, pad text)`)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		t.Log(strings.TrimRight(string(p), "\n"))
		return logs.Write(p)
	}), nil))
	block := map[string]any{"dsn": pg.DSN(""), "tables": []any{"public.t"}, "status_interval": "200ms", "receive_timeout": "1s"}
	src, err := pgoutput.New((&config.Config{}).Decoder("sources.dc.config", block), sources.Env{Name: "dc", Logger: log})
	require.NoError(t, err)
	defer src.Close(context.Background())
	require.NoError(t, openErr(t, src, 0))
	time.Sleep(2 * time.Second) // the server closes the idle catalog connection
	pg.ExecT(t, `INSERT INTO churn SELECT g, repeat('x', 40) FROM generate_series(1, 500000) g`, `INSERT INTO t VALUES (1)`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	txn, err := src.Read(ctx)
	require.NoError(t, err)
	require.Len(t, txn.Changes, 1)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, logs.String(), "its walsender is busy", "the walsender was never silent for receive_timeout: the test proves nothing")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// testLog logs through t.Log.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
