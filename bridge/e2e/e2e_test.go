package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"
)

func waitReady(t *testing.T, r *running) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, p := range r.app.Pipelines() {
			if !p.Ready() {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "pipeline never became ready")
}

func TestEachOperation(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY, name text, qty int)`)
	r := e.start(e.config("ops", ""))
	waitReady(t, r)
	e.pg.ExecT(t,
		`INSERT INTO items VALUES (1, 'apple', 1), (2, 'pear', 2)`,
		`UPDATE items SET qty = 5 WHERE id = 1`,
		`UPDATE items SET id = 3 WHERE id = 2`,
		`DELETE FROM items WHERE id = 1`,
		`BEGIN; INSERT INTO items VALUES (4, 'fig', 4); SELECT pg_logical_emit_message(true, 'app', 'in-tx'); SELECT pg_logical_emit_message(true, 'other', 'filtered'); COMMIT`,
		`SELECT pg_logical_emit_message(false, 'app', 'outside')`,
		`TRUNCATE items`,
	)
	ms := e.waitCount("CDC_ops", 9, 30*time.Second)
	require.Len(t, ms, 9)
	checkOrdered(t, ms)
	ops := make([]string, len(ms))
	for i, m := range ms {
		ops[i] = m.Body["op"].(string)
		require.Equal(t, m.Body["op"], m.Header.Get("Bridge-Op"))
		require.NotContains(t, m.Body, "id", "the id is Nats-Msg-Id's")
	}
	require.Equal(t, []string{"insert", "insert", "update", "update", "delete", "insert", "message", "message", "truncate"}, ops)

	// The two inserts share one transaction: same commit LSN, ordinals 0 and 1, tx_size 2.
	require.Equal(t, ms[0].Pos.LSN, ms[1].Pos.LSN)
	require.Equal(t, []uint32{0, 1}, []uint32{ms[0].Pos.Seq, ms[1].Pos.Seq})
	require.EqualValues(t, 2, ms[0].Body["tx_size"])
	require.Equal(t, "2", ms[1].Header.Get("Bridge-Tx-Size"))
	require.Equal(t, "cdc.ops.public.items", ms[0].Subject)
	require.Equal(t, map[string]any{"id": float64(1), "name": "apple", "qty": float64(1)}, ms[0].Body["after"])
	require.Nil(t, ms[0].Body["before"])
	require.Equal(t, map[string]any{"id": float64(1)}, ms[0].Body["key"])

	// Update without key change: no old row with the default identity.
	require.Nil(t, ms[2].Body["before"])
	require.Equal(t, float64(5), ms[2].Body["after"].(map[string]any)["qty"])
	// Key change: the old key comes along, other columns absent.
	require.Equal(t, map[string]any{"id": float64(2)}, ms[3].Body["before"])
	require.Equal(t, float64(3), ms[3].Body["after"].(map[string]any)["id"])
	// Delete: the old key only.
	require.Equal(t, map[string]any{"id": float64(1)}, ms[4].Body["before"])
	require.Nil(t, ms[4].Body["after"])
	require.Equal(t, map[string]any{"id": float64(1)}, ms[4].Body["key"])

	// Transactional message inside the insert's transaction, after it.
	require.Equal(t, ms[5].Pos.LSN, ms[6].Pos.LSN)
	require.Equal(t, map[string]any{"prefix": "app", "transactional": true, "content": "in-tx"}, ms[6].Body["message"])
	require.Equal(t, "cdc.ops._message.app", ms[6].Subject)
	require.Equal(t, map[string]any{"prefix": "app", "transactional": false, "content": "outside"}, ms[7].Body["message"])
	require.Equal(t, map[string]any{"cascade": false, "restart_identity": false}, ms[8].Body["truncate"])
	require.Equal(t, "items", ms[8].Body["table"])

	// Commit metadata.
	require.Regexp(t, `^[0-9A-F]+/[0-9A-F]+$`, ms[0].Body["commit_lsn"])
	require.Equal(t, ms[0].Pos.LSN.String(), ms[0].Body["commit_lsn"])
	ct, err := time.Parse(time.RFC3339Nano, ms[0].Body["commit_time"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), ct, time.Minute)
	require.NotZero(t, ms[0].Body["xid"])
}

func TestUnchangedToastIsFlaggedNotNulled(t *testing.T) {
	defer parallel(t)()
	eachMajor(t, unchangedToastIsFlaggedNotNulled)
}

func unchangedToastIsFlaggedNotNulled(t *testing.T, major int) {
	e := newEnvMajor(t, major)
	e.pg.ExecT(t, `CREATE TABLE docs (id int PRIMARY KEY, body text, n int)`,
		`ALTER TABLE docs ALTER body SET STORAGE EXTERNAL`)
	r := e.start(e.config("toast", ""))
	waitReady(t, r)
	big := randText(20000)
	e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO docs VALUES (1, '%s', 0)`, big), `UPDATE docs SET n = 1 WHERE id = 1`)
	ms := e.waitCount("CDC_toast", 2, 30*time.Second)
	require.Equal(t, big, ms[0].Body["after"].(map[string]any)["body"])
	after := ms[1].Body["after"].(map[string]any)
	_, has := after["body"]
	require.False(t, has, "unchanged TOAST column must not appear as a value: %v", after)
	require.Equal(t, []any{"body"}, ms[1].Body["unchanged_toast"])
	require.Equal(t, float64(1), after["n"])
}

func randText(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.N(len(letters))]
	}
	return string(b)
}

// workload commits inserts, updates and deletes from several writers and
// records, per committed transaction, the events it must produce.
type workload struct {
	dsn     string
	mu      sync.Mutex
	events  map[string]int // event key → times committed
	total   atomic.Int64
	stopped atomic.Bool
	// bulk, when > 0, makes one transaction in four also insert 1 to bulk
	// rows with one statement: transactions of thousands of changes, which
	// the pipeline hands over in parts and the source spills to disk.
	bulk int
}

func newWorkload(t *testing.T, e *env) *workload {
	e.pg.ExecT(t, `CREATE TABLE IF NOT EXISTS kt (id bigserial PRIMARY KEY, w int NOT NULL, n int NOT NULL, v int NOT NULL DEFAULT 0, pad text)`)
	return &workload{dsn: e.pg.DSN(""), events: map[string]int{}}
}

// run starts writers that stop after target changes in total or when stop
// is called; it returns a function waiting for them.
func (w *workload) run(t *testing.T, writers, target int, pace time.Duration) func() {
	var wg sync.WaitGroup
	for wi := 0; wi < writers; wi++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.writer(t, wi, target, pace)
		}()
	}
	return wg.Wait
}

func (w *workload) writer(t *testing.T, wi, target int, pace time.Duration) {
	ctx := context.Background()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(ctx)
		}
	}()
	type row struct {
		id   int64
		n, v int
	}
	var mine []row
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
		var evs []string
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Close(ctx)
			conn = nil
			continue
		}
		size := 1 + rand.N(8)
		var pending []row
		updated := map[int]int{}
		deleted := map[int]bool{}
		ok := true
		for k := 0; k < size && ok; k++ {
			switch r := rand.N(10); {
			case r < 2 && len(mine) > 0:
				i := rand.N(len(mine))
				if deleted[i] {
					continue
				}
				nv := mine[i].v + 1
				if u, seen := updated[i]; seen {
					nv = u + 1
				}
				if _, err := tx.Exec(ctx, `UPDATE kt SET v = $1 WHERE id = $2`, nv, mine[i].id); err != nil {
					ok = false
					break
				}
				updated[i] = nv
				evs = append(evs, fmt.Sprintf("U:%d:%d:%d", wi, mine[i].n, nv))
			case r < 3 && len(mine) > 0:
				i := rand.N(len(mine))
				if deleted[i] {
					continue
				}
				if _, err := tx.Exec(ctx, `DELETE FROM kt WHERE id = $1`, mine[i].id); err != nil {
					ok = false
					break
				}
				deleted[i] = true
				evs = append(evs, fmt.Sprintf("D:%d", mine[i].id))
			default:
				n++
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO kt (w, n, pad) VALUES ($1, $2, $3) RETURNING id`, wi, n, randText(50+rand.N(200))).Scan(&id); err != nil {
					ok = false
					break
				}
				pending = append(pending, row{id: id, n: n})
				evs = append(evs, fmt.Sprintf("I:%d:%d", wi, n))
			}
		}
		if ok && w.bulk > 0 && rand.N(4) == 0 {
			k := 1 + rand.N(w.bulk)
			rows, err := tx.Query(ctx, `INSERT INTO kt (w, n, pad) SELECT $1, g, $3 FROM generate_series($2::int, $4::int) g ORDER BY g RETURNING id, n`, wi, n+1, randText(60), n+k)
			if err == nil {
				for rows.Next() {
					var r row
					if err = rows.Scan(&r.id, &r.n); err != nil {
						break
					}
					pending = append(pending, r)
					evs = append(evs, fmt.Sprintf("I:%d:%d", wi, r.n))
				}
				rows.Close()
				err = rows.Err()
			}
			if err != nil {
				ok = false
			} else {
				n += k
			}
		}
		if !ok {
			_ = tx.Rollback(ctx)
			conn.Close(ctx)
			conn = nil
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			// Ambiguous only when the server died during commit; the
			// tests that restart Postgres check against the table instead.
			conn.Close(ctx)
			conn = nil
			continue
		}
		for i, v := range updated {
			mine[i].v = v
		}
		// Deleted rows leave by swapping in the last one, highest index
		// first, so that no index still to go moves: a writer's rows are
		// picked at random, and copying all of them per transaction made
		// the writers themselves the busiest code of a long kill test.
		gone := make([]int, 0, len(deleted))
		for i := range deleted {
			gone = append(gone, i)
		}
		slices.Sort(gone)
		for _, i := range slices.Backward(gone) {
			last := len(mine) - 1
			mine[i] = mine[last]
			mine = mine[:last]
		}
		mine = append(mine, pending...)
		w.mu.Lock()
		for _, ev := range evs {
			w.events[ev]++
		}
		w.mu.Unlock()
		w.total.Add(int64(len(evs)))
		if pace > 0 {
			time.Sleep(pace)
		}
	}
}

// eventKey turns a stored kt message into the key the workload recorded.
func eventKey(t *testing.T, p *fastjson.Parser, m msg) string {
	require.NotEmpty(t, m.Raw, "stream seq %d: eventKey reads the raw payload; read the stream with env.messages or env.rawMessages", m.Seq)
	v, err := p.ParseBytes(m.Raw)
	require.NoError(t, err, "stream seq %d: %s", m.Seq, m.Raw)
	num := func(path ...string) string { return jsonText(v, path...) }
	switch string(v.GetStringBytes("op")) {
	case "insert":
		return "I:" + num("after", "w") + ":" + num("after", "n")
	case "update":
		return "U:" + num("after", "w") + ":" + num("after", "n") + ":" + num("after", "v")
	case "delete":
		return "D:" + num("before", "id")
	}
	t.Fatalf("stream seq %d: unexpected message %s", m.Seq, m.Raw)
	return ""
}

// verifyExactlyOnce checks that the stream holds every recorded event once
// and nothing else, in commit order.
func (w *workload) verifyExactlyOnce(t *testing.T, e *env, stream string) {
	t.Helper()
	want, total := w.expected()
	e.waitStored(stream, total, 3*time.Minute)
	ms := e.rawMessages(stream)
	checkOrdered(t, ms)
	checkEvents(t, "stream "+stream, ms, want, total)
	// Nothing arrives later either.
	time.Sleep(500 * time.Millisecond)
	require.EqualValues(t, total, storedCount(t, e, stream), "messages in %s, 500 ms after the last expected one", stream)
}

// expected returns the events the workload committed, and how many.
func (w *workload) expected() (map[string]int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	want := map[string]int{}
	total := 0
	for k, v := range w.events {
		want[k] = v
		total += v
	}
	return want, total
}

// checkEvents asserts that ms, the messages of what (a stream, a route's
// subjects), hold every event of want, total in all, once and nothing else.
func checkEvents(t *testing.T, what string, ms []msg, want map[string]int, total int) {
	t.Helper()
	got := map[string]int{}
	var p fastjson.Parser
	for _, m := range ms {
		got[eventKey(t, &p, m)]++
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
		t.Fatalf("%s holds %d messages for %d committed changes; missing %d (e.g. %v), duplicated or unexpected %d (e.g. %v)",
			what, len(ms), total, len(missing), head(missing), len(extra), head(extra))
	}
	require.Len(t, ms, total, what)
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

func TestGracefulRestartNoLossNoDuplicate(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg := e.config("graceful", "")
	r := e.start(cfg)
	waitReady(t, r)
	wait := w.run(t, 2, 6000, 2*time.Millisecond)
	for i := 0; i < 3; i++ {
		time.Sleep(time.Duration(300+rand.N(500)) * time.Millisecond)
		r.stop(t)
		time.Sleep(time.Duration(100+rand.N(400)) * time.Millisecond)
		r = e.start(cfg)
	}
	wait()
	w.verifyExactlyOnce(t, e, "CDC_graceful")
	// The checkpoint reached the end and Postgres was told.
	p := r.app.Pipelines()[0]
	require.Eventually(t, func() bool { return p.Checkpointed() > 0 }, 10*time.Second, 50*time.Millisecond)
}

func TestNATSRestartMidStream(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	w := newWorkload(t, e)
	r := e.start(e.config("natsrestart", ""))
	waitReady(t, r)
	wait := w.run(t, 2, 6000, 2*time.Millisecond)
	for i := 0; i < 2; i++ {
		time.Sleep(time.Duration(400+rand.N(400)) * time.Millisecond)
		e.stopNATS()
		time.Sleep(time.Duration(500+rand.N(1500)) * time.Millisecond)
		e.startNATS()
	}
	wait()
	w.verifyExactlyOnce(t, e, "CDC_natsrestart")
}

func TestPostgresRestartMidStream(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE ev (id bigserial PRIMARY KEY, w int, n int)`)
	r := e.start(e.config("pgrestart", ""))
	waitReady(t, r)
	insertAcrossRestarts(t, e, "CDC_pgrestart")
}

// insertAcrossRestarts inserts rows into table ev (id bigserial, w int, n
// int) from two writers while Postgres restarts twice (fast, then
// immediate), and requires stream to hold every row of ev exactly once, in
// commit order.
func insertAcrossRestarts(t *testing.T, e *env, stream string) {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for wi := 0; wi < 2; wi++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			n := 0
			for !stop.Load() {
				c, err := pgx.Connect(ctx, e.pg.DSN(""))
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				for !stop.Load() {
					n++
					if _, err := c.Exec(ctx, `INSERT INTO ev (w, n) SELECT $1, $2 FROM generate_series(1, 3)`, wi, n); err != nil {
						break
					}
					time.Sleep(time.Millisecond)
				}
				c.Close(ctx)
			}
		}()
	}
	for _, mode := range []string{"fast", "immediate"} {
		time.Sleep(time.Duration(500+rand.N(500)) * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		require.NoError(t, e.pg.Restart(ctx, mode))
		cancel()
	}
	time.Sleep(700 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	// Ground truth from the table itself: an immediate shutdown makes some
	// commits' outcome unknown to the writer.
	conn := e.pg.Conn(t, "")
	rows, err := conn.Query(context.Background(), `SELECT id FROM ev`)
	require.NoError(t, err)
	want := map[string]bool{}
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		want[fmt.Sprint(id)] = true
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, want)
	ms := e.waitCount(stream, len(want), 2*time.Minute)
	checkOrdered(t, ms)
	got := map[string]bool{}
	for _, m := range ms {
		id := fmt.Sprint(m.Body["after"].(map[string]any)["id"])
		require.False(t, got[id], "row %s published twice", id)
		got[id] = true
	}
	require.Equal(t, len(want), len(got))
	for id := range want {
		require.True(t, got[id], "row %s missing", id)
	}
}

var _ = json.Valid

func TestReplicaIdentityFull(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE f (id int PRIMARY KEY, a text, b int)`, `ALTER TABLE f REPLICA IDENTITY FULL`,
		`CREATE TABLE nopk (a text, b int)`, `ALTER TABLE nopk REPLICA IDENTITY FULL`)
	r := e.start(e.config("full", ""))
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO f VALUES (1, 'x', 1)`, `UPDATE f SET b = 2`, `DELETE FROM f`,
		`INSERT INTO nopk VALUES ('y', 1)`, `UPDATE nopk SET b = 3`)
	ms := e.waitCount("CDC_full", 5, 30*time.Second)
	require.Equal(t, map[string]any{"id": float64(1)}, ms[1].Body["key"], "the key is the primary key, not every column")
	require.Equal(t, map[string]any{"id": float64(1), "a": "x", "b": float64(1)}, ms[1].Body["before"], "FULL gives the whole old row")
	require.Equal(t, map[string]any{"id": float64(1), "a": "x", "b": float64(2)}, ms[2].Body["before"])
	require.Nil(t, ms[4].Body["key"], "a table without a primary key has no key")
	require.Equal(t, map[string]any{"a": "y", "b": float64(1)}, ms[4].Body["before"])
}
