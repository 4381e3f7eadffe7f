package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// txnWorkload commits transactions of many inserts (one statement each) from
// several writers and records every committed (writer, n) pair, so a test
// can check that each committed change is stored exactly once.
type txnWorkload struct {
	dsn     string
	table   string
	mu      sync.Mutex
	events  map[string]int
	total   atomic.Int64
	stopped atomic.Bool
	sizes   func() int // rows of the next transaction
}

func newTxnWorkload(t *testing.T, e *env, table string, sizes func() int) *txnWorkload {
	e.pg.ExecT(t, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (id bigserial PRIMARY KEY, w int NOT NULL, n int NOT NULL, pad text)`, table))
	return &txnWorkload{dsn: e.pg.DSN(""), table: table, events: map[string]int{}, sizes: sizes}
}

// run starts writers that stop after target changes in total or when
// stopped is set; it returns a function waiting for them.
func (w *txnWorkload) run(writers, target int, pace time.Duration) func() {
	var wg sync.WaitGroup
	for wi := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.writer(wi, target, pace)
		}()
	}
	return wg.Wait
}

func (w *txnWorkload) writer(wi, target int, pace time.Duration) {
	ctx := context.Background()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	n := 0
	for int(w.total.Load()) < target && !w.stopped.Load() {
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, w.dsn)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			conn = c
		}
		size := w.sizes()
		_, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (w, n, pad) SELECT $1, g, repeat('x', 40) FROM generate_series($2::int, $3::int) g`, w.table),
			wi, n+1, n+size)
		if err != nil {
			// Ambiguous only when Postgres died during the commit; these
			// tests do not restart Postgres.
			conn.Close(ctx)
			conn = nil
			continue
		}
		w.mu.Lock()
		for k := n + 1; k <= n+size; k++ {
			w.events[fmt.Sprintf("%d:%d", wi, k)]++
		}
		w.mu.Unlock()
		n += size
		w.total.Add(int64(size))
		if pace > 0 {
			time.Sleep(pace)
		}
	}
}

// verify checks that the stream holds every committed change exactly once,
// in commit order, and that every transaction is complete.
func (w *txnWorkload) verify(t *testing.T, e *env, stream string) {
	t.Helper()
	w.mu.Lock()
	want := map[string]int{}
	total := 0
	for k, v := range w.events {
		want[k] = v
		total += v
	}
	w.mu.Unlock()
	e.waitStored(stream, total, 3*time.Minute)
	ms := e.rawMessages(stream)
	dumpOnDup(t, ms)
	checkOrdered(t, ms)
	checkWholeTxns(t, ms, 0)
	got := map[string]int{}
	var p fastjson.Parser
	for _, m := range ms {
		v, err := p.ParseBytes(m.Raw)
		require.NoError(t, err, "stream seq %d: %s", m.Seq, m.Raw)
		got[jsonText(v, "after", "w")+":"+jsonText(v, "after", "n")]++
	}
	var missing, extra []string
	for k, v := range want {
		if got[k] < v {
			missing = append(missing, k)
		}
	}
	for k, v := range got {
		if v > want[k] {
			extra = append(extra, fmt.Sprintf("%s×%d", k, v))
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("stream holds %d messages for %d committed changes; missing %d (e.g. %v), duplicated or unexpected %d (e.g. %v)",
			len(ms), total, len(missing), head(missing), len(extra), head(extra))
	}
	require.Len(t, ms, total)
}

// checkWholeTxns checks that for every commit LSN the stream holds exactly
// Bridge-Tx-Size messages, ordinals 0 to size-1. Transactions larger than
// partialAbove may be incomplete (0: none may be). A transaction of more
// than 1000 changes, published while it arrives, carries the size on its
// last message only: without that one, its size is not known, and it
// counts as larger.
func checkWholeTxns(t *testing.T, ms []msg, partialAbove int) {
	t.Helper()
	type txn struct {
		size, count int
		first       uint64
		seqs        map[uint32]bool
	}
	txns := map[cdc.LSN]*txn{}
	var order []cdc.LSN
	for _, m := range ms {
		size := 0
		if v := m.Header.Get("Bridge-Tx-Size"); v != "" {
			var err error
			size, err = strconv.Atoi(v)
			require.NoError(t, err, "stream seq %d: Bridge-Tx-Size", m.Seq)
		} else {
			require.Equal(t, uint64(1), uint64(m.Pos.LSN)%2, "stream seq %d (%s): no Bridge-Tx-Size on a transaction not published while it arrived", m.Seq, m.ID)
		}
		x := txns[m.Pos.LSN]
		if x == nil {
			x = &txn{first: m.Seq, seqs: map[uint32]bool{}}
			txns[m.Pos.LSN] = x
			order = append(order, m.Pos.LSN)
		}
		x.size = max(x.size, size)
		x.count++
		x.seqs[m.Pos.Seq] = true
	}
	for _, lsn := range order {
		x := txns[lsn]
		if x.size > 0 && x.count == x.size && len(x.seqs) == x.size {
			continue
		}
		if partialAbove > 0 && (x.size > partialAbove || x.size == 0) {
			continue
		}
		for _, m := range ms {
			if m.Pos.LSN == lsn || (m.Seq+2 >= x.first && m.Seq <= x.first+2) {
				t.Logf("seq %d id %s batch %q size %s", m.Seq, m.ID, m.Header.Get("Nats-Batch-Id"), m.Header.Get("Bridge-Tx-Size"))
			}
		}
		t.Fatalf("transaction %s (from stream seq %d) has %d messages (%d distinct ordinals) in the stream, want all %d or none",
			lsn, x.first, x.count, len(x.seqs), x.size)
	}
}

// dumpOnDup logs the messages around the first duplicate id.
func dumpOnDup(t *testing.T, ms []msg) {
	seen := map[string]int{}
	for i, m := range ms {
		if j, dup := seen[m.ID]; dup {
			for _, k := range []int{j, i} {
				for x := max(0, k-3); x < min(len(ms), k+4); x++ {
					mm := ms[x]
					t.Logf("seq %d id %s size %s", mm.Seq, mm.ID, mm.Header.Get("Bridge-Tx-Size"))
				}
				t.Log("--")
			}
			return
		}
		seen[m.ID] = i
	}
}

// TestKillMidTransaction kills the bridge process with SIGKILL at random
// moments while writers commit transactions of 1 to 300 changes (and now
// and then one larger than an atomic batch may be), with a 1 s duplicate
// window so JetStream's dedupe alone cannot hide a replay. With atomic
// transactions, the stream must hold each transaction whole or not at all
// after every kill; in both modes it holds every committed change exactly
// once in the end. The last case restarts the NATS server instead.
func TestKillMidTransaction(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name   string
		atomic bool
		nats   bool // restart the NATS server instead of killing the bridge
	}{{"per_message", false, false}, {"atomic", true, false}, {"atomic_nats_restart", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			changes, kills := 60000, 12
			if testing.Short() {
				changes, kills = 15000, 6
			}
			bin := bridgeBinary(t)
			e := newEnv(t)
			w := newTxnWorkload(t, e, "at", func() int {
				if rand.N(40) == 0 {
					return 1001 + rand.N(600) // above the server's batch limit
				}
				return 1 + rand.N(300)
			})
			cfg := e.config("atx", "")
			if tc.atomic {
				setSinkOption(t, cfg, "atomic_transactions: true")
			}
			p := startProc(t, bin, cfg)
			waitSlotActive(t, e, "slot_atx")
			done := make(chan struct{})
			go func() {
				w.run(3, changes, 2*time.Millisecond)()
				close(done)
			}()
			n := 0
			for writing := true; writing || n < kills; {
				time.Sleep(time.Duration(300+rand.N(1200)) * time.Millisecond)
				if tc.nats {
					e.stopNATS()
					n++
					time.Sleep(time.Duration(rand.N(1500)) * time.Millisecond)
					e.startNATS()
					select {
					case <-done:
						writing = false
					default:
					}
					continue
				}
				p.kill9(t)
				n++
				if tc.atomic && e.streamExists("CDC_atx") {
					// Nothing half-stored once the server has applied what
					// the dead process sent (a consumer reading during a
					// batch's commit may see a prefix of it).
					e.waitQuiet("CDC_atx")
					checkWholeTxns(t, e.headers("CDC_atx"), 1000)
				}
				p = startProc(t, bin, cfg)
				select {
				case <-done:
					writing = false
				default:
				}
			}
			t.Logf("killed the bridge or restarted NATS %d times while %d changes were committed", n, w.total.Load())
			w.verify(t, e, "CDC_atx")
			p.term(t)
			if t.Failed() {
				t.Logf("last bridge output:\n%s", p.out.String())
			}
		})
	}
}

// setSinkOption adds a line to the js sink's config block of the bridge
// config at path.
func setSinkOption(t *testing.T, path, line string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := strings.Replace(string(b), "      duplicate_window: 1s\n", "      duplicate_window: 1s\n      "+line+"\n", 1)
	require.NotEqual(t, string(b), s, "no sink config block in %s", path)
	require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
}

// streamExists reports whether stream exists on the test's NATS server.
func (e *env) streamExists(stream string) bool {
	e.t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(e.t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.Stream(ctx, stream)
	return err == nil
}

// waitQuiet waits until stream's last sequence stays the same for half a
// second: nothing is being stored.
func (e *env) waitQuiet(stream string) {
	e.t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(e.t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	var last uint64
	same := 0
	deadline := time.Now().Add(time.Minute)
	for same < 5 {
		require.False(e.t, time.Now().After(deadline), "stream %s never stopped growing", stream)
		time.Sleep(100 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := js.Stream(ctx, stream)
		cancel()
		require.NoError(e.t, err)
		if seq := st.CachedInfo().State.LastSeq; seq == last {
			same++
		} else {
			last, same = seq, 0
		}
	}
}
