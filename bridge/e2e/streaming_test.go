package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgtest"
)

// TestStreamedInProgressKill9 runs the pgoutput source with
// stream_in_progress against a Postgres that streams transactions before
// their commit (logical_decoding_work_mem at its 64 kB minimum, so most
// transactions here are streamed), while
// writers commit transactions of 1 to ~2,100 rows with savepoints, some
// rolled back to, and now and then roll a whole transaction back; the bridge
// is killed with SIGKILL at random moments. The stream must hold every
// committed row exactly once, in commit order, every transaction whole,
// nothing of a rolled-back subtransaction or transaction; transactions of
// more than 1000 changes carry the identity start of commit record + 1.
func TestStreamedInProgressKill9(t *testing.T) {
	defer parallelLong(t)()
	changes, kills := 40000, 8
	if testing.Short() {
		changes, kills = 12000, 4
	}
	bin := bridgeBinary(t)
	e := newEnvWith(t, pgtest.Options{Settings: map[string]string{"logical_decoding_work_mem": "64kB"}})
	w := newTxnWorkload(t, e, "sip", nil)
	cfg := e.config("sip", "      stream_in_progress: true")
	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_sip")

	done := make(chan struct{})
	var rolledBack, subAborts int64
	go func() {
		defer close(done)
		rolledBack, subAborts = savepointWriters(t, w, 3, changes)
	}()
	n := 0
	for writing := true; writing || n < kills; {
		time.Sleep(time.Duration(400+rand.N(1200)) * time.Millisecond)
		p.kill9(t)
		n++
		p = startProc(t, bin, cfg)
		select {
		case <-done:
			writing = false
		default:
		}
	}
	t.Logf("killed the bridge %d times while %d changes were committed (%d transactions rolled back, %d rollbacks to a savepoint)",
		n, w.total.Load(), rolledBack, subAborts)
	w.verify(t, e, "CDC_sip")

	// Postgres did stream, and transactions above 1000 changes that came
	// streamed (their size on every message) carry the start + 1 identity.
	var streamed int64
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(),
		`SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'slot_sip'`).Scan(&streamed))
	require.NotZero(t, streamed, "Postgres streamed no transaction before its commit")
	sizes := map[uint64]int{}
	withSize := map[uint64]int{}
	for _, m := range e.messages("CDC_sip") {
		sizes[uint64(m.Pos.LSN)]++
		if m.Header.Get("Bridge-Tx-Size") != "" {
			withSize[uint64(m.Pos.LSN)]++
		}
	}
	large, largeStreamed := 0, 0
	for lsn, count := range sizes {
		require.Equal(t, count > 1000, lsn%2 == 1, "transaction %X of %d changes: identity kind", lsn, count)
		if count > 1000 {
			large++
			if withSize[lsn] == count {
				largeStreamed++
			}
		}
	}
	t.Logf("Postgres streamed %d transactions; %d transactions above 1000 changes, %d of them published after arriving streamed", streamed, large, largeStreamed)
	require.NotZero(t, large)
	p.term(t)
}

// savepointWriters commits transactions made of up to three parts with a
// savepoint before the second, which is rolled back to one time in three;
// one transaction in ten is rolled back whole. Only committed rows count in
// w. It returns how many transactions and savepoints were rolled back.
func savepointWriters(t *testing.T, w *txnWorkload, writers, target int) (rolledBack, subAborts int64) {
	ctx := context.Background()
	type res struct{ rb, sa int64 }
	out := make(chan res, writers)
	for wi := range writers {
		go func() {
			var r res
			defer func() { out <- r }()
			conn, err := pgx.Connect(ctx, w.dsn)
			if err != nil {
				t.Errorf("writer %d: %v", wi, err)
				return
			}
			defer conn.Close(ctx)
			n := 0
			insert := func(tx pgx.Tx, from, rows int) error {
				if rows == 0 {
					return nil
				}
				_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (w, n, pad) SELECT $1, g, repeat('x', 40) FROM generate_series($2::int, $3::int) g`, w.table),
					wi, from, from+rows-1)
				return err
			}
			for int(w.total.Load()) < target {
				a, b, c := rand.N(700), rand.N(700), 1+rand.N(700)
				if rand.N(4) == 0 { // small ones too
					a, b, c = 0, rand.N(3), 1+rand.N(5)
				}
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Errorf("writer %d: %v", wi, err)
					return
				}
				kept := []int{}
				next := n + 1
				step := func(rows int) bool {
					if err := insert(tx, next, rows); err != nil {
						t.Errorf("writer %d: %v", wi, err)
						return false
					}
					for k := next; k < next+rows; k++ {
						kept = append(kept, k)
					}
					next += rows
					return true
				}
				if !step(a) {
					return
				}
				if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
					t.Errorf("writer %d: %v", wi, err)
					return
				}
				mark := len(kept)
				if !step(b) {
					return
				}
				sp := "RELEASE SAVEPOINT s"
				if rand.N(3) == 0 {
					sp = "ROLLBACK TO SAVEPOINT s"
					kept = kept[:mark]
					r.sa++
				}
				if _, err := tx.Exec(ctx, sp); err != nil {
					t.Errorf("writer %d: %v", wi, err)
					return
				}
				if !step(c) {
					return
				}
				n = next - 1 // numbers of rolled-back rows are not reused
				if rand.N(10) == 0 {
					if err := tx.Rollback(ctx); err != nil {
						t.Errorf("writer %d: %v", wi, err)
						return
					}
					r.rb++
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Errorf("writer %d: commit: %v", wi, err)
					return
				}
				w.mu.Lock()
				for _, k := range kept {
					w.events[fmt.Sprintf("%d:%d", wi, k)]++
				}
				w.mu.Unlock()
				w.total.Add(int64(len(kept)))
			}
		}()
	}
	for range writers {
		r := <-out
		rolledBack += r.rb
		subAborts += r.sa
	}
	return rolledBack, subAborts
}
