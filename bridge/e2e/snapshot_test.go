package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// snapConfig writes a config whose source snapshots in mode with chunks of
// chunk rows.
func (e *env) snapConfig(name, mode string, chunk int) string {
	return e.config(name, fmt.Sprintf("      snapshot:\n        mode: %s\n        chunk_size: %d\n        progress_interval: 1s\n        request_poll: 200ms", mode, chunk))
}

// snapState reads the snapshot state of source "app" of bridge name.
func (e *env) snapState(name string) (snapshot.State, bool) {
	e.t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(e.t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var st snapshot.State
	kv, err := js.KeyValue(ctx, "bridge_checkpoints")
	if err != nil {
		return st, false
	}
	en, err := kv.Get(ctx, snapshot.Key(name, "app"))
	if err != nil {
		return st, false
	}
	require.NoError(e.t, json.Unmarshal(en.Value(), &st))
	return st, true
}

// waitSnapshotDone waits until the snapshots of bridge name finished (the
// last one is st.Last and none runs or waits) and ok holds. It fails when
// the snapshot state has not moved for within: the bound is on a stall,
// not on the whole snapshot, whose length grows with the table (KILL_FACTOR
// multiplies it) and with the machine's load.
func (e *env) waitSnapshotDone(name string, within time.Duration, ok func(snapshot.State) bool) snapshot.State {
	e.t.Helper()
	deadline := time.Now().Add(within)
	var seen string
	for {
		st, found := e.snapState(name)
		if found && st.Current == nil && len(st.Queue) == 0 && st.Last != nil && (ok == nil || ok(st)) {
			return st
		}
		moved := st
		moved.UpdatedAt = time.Time{} // a save without progress moves only this
		if b, _ := json.Marshal(moved); string(b) != seen {
			seen, deadline = string(b), time.Now().Add(within)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("snapshot of %s made no progress for %s: %+v", name, within, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// snapWriter changes rows of table (id int key, v int, pad text) while it
// runs, each change its own transaction, and records every committed one.
type snapWriter struct {
	table  string
	nextID atomic.Int64
	seq    atomic.Int64
	mu     sync.Mutex
	events map[string]int // "op:id:v"
	stop   atomic.Bool
	wg     sync.WaitGroup
}

func startSnapWriter(t *testing.T, e *env, table string, firstNew int64, maxID int64, pace time.Duration) *snapWriter {
	w := &snapWriter{table: table, events: map[string]int{}}
	w.nextID.Store(firstNew)
	w.seq.Store(1_000_000)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, e.pg.DSN(""))
		if err != nil {
			t.Errorf("writer: %v", err)
			return
		}
		defer conn.Close(ctx)
		for !w.stop.Load() {
			v := w.seq.Add(1)
			var op string
			var id int64
			var sql string
			switch rand.N(10) {
			case 0:
				op, id = "insert", w.nextID.Add(1)
				sql = fmt.Sprintf("INSERT INTO %s VALUES (%d, %d, 'new')", table, id, v)
			case 1:
				op, id = "delete", 1+rand.Int64N(maxID)
				sql = fmt.Sprintf("DELETE FROM %s WHERE id = %d", table, id)
			default:
				op, id = "update", 1+rand.Int64N(maxID)
				sql = fmt.Sprintf("UPDATE %s SET v = %d, pad = 'upd' WHERE id = %d", table, v, id)
			}
			tag, err := conn.Exec(ctx, sql)
			if err != nil {
				t.Errorf("writer: %s: %v", sql, err)
				return
			}
			if tag.RowsAffected() == 1 {
				k := fmt.Sprintf("%s:%d:%d", op, id, v)
				if op == "delete" {
					k = fmt.Sprintf("delete:%d:", id)
				}
				w.mu.Lock()
				w.events[k]++
				w.mu.Unlock()
			}
			time.Sleep(pace)
		}
	}()
	return w
}

func (w *snapWriter) halt() { w.stop.Store(true); w.wg.Wait() }

// num reads a JSON number as int64.
func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// checkSnapshotStream checks the stream of bridge name against the tables:
// message ids are unique; the positions of streamed (not read) changes
// strictly increase; replaying the stream in order (read, insert and update
// set a row, delete removes it) gives exactly each table's rows; and, when
// w is given, every change w committed is in the stream exactly once.
func checkSnapshotStream(t *testing.T, e *env, name string, ms []msg, tables []string, w *snapWriter) {
	t.Helper()
	seen := map[string]uint64{}
	var last cdc.Pos
	state := map[string]map[int64]map[string]any{}
	got := map[string]int{}
	for i, m := range ms {
		if prev, dup := seen[m.ID]; dup {
			t.Fatalf("message id %s stored twice (stream seq %d and %d); around them:\n%s\n%s", m.ID, prev, m.Seq,
				around(ms, prev), around(ms, ms[i].Seq))
		}
		seen[m.ID] = m.Seq
		op, _ := m.Body["op"].(string)
		tbl, _ := m.Body["table"].(string)
		if op != "read" {
			require.NotContains(t, m.ID, ".snap-", "stream seq %d", m.Seq)
			require.True(t, last.Less(m.Pos), "stream seq %d: position %s:%d does not follow %s:%d", m.Seq, m.Pos.LSN, m.Pos.Seq, last.LSN, last.Seq)
			last = m.Pos
		} else {
			require.Contains(t, m.ID, ".snap-", "stream seq %d: a read change must carry a snapshot id", m.Seq)
			require.Equal(t, "read", m.Header.Get("Bridge-Op"))
		}
		if state[tbl] == nil {
			state[tbl] = map[int64]map[string]any{}
		}
		switch op {
		case "read", "insert", "update":
			after := m.Body["after"].(map[string]any)
			if op == "update" {
				if b, ok := m.Body["before"].(map[string]any); ok {
					delete(state[tbl], num(b["id"]))
				}
			}
			state[tbl][num(after["id"])] = after
			if w != nil && tbl == w.table && op != "read" && num(after["v"]) > 1_000_000 { // the writer's
				got[fmt.Sprintf("%s:%d:%d", op, num(after["id"]), num(after["v"]))]++
			}
		case "delete":
			id := num(m.Body["key"].(map[string]any)["id"])
			delete(state[tbl], id)
			if w != nil && tbl == w.table {
				got[fmt.Sprintf("delete:%d:", id)]++
			}
		case "truncate":
			state[tbl] = map[int64]map[string]any{}
		}
	}
	conn := e.pg.Conn(t, "")
	for _, tbl := range tables {
		rows, err := conn.Query(t.Context(), "SELECT row_to_json(x)::text FROM "+tbl+" x")
		require.NoError(t, err)
		want := map[int64]map[string]any{}
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			var row map[string]any
			require.NoError(t, json.Unmarshal([]byte(s), &row))
			want[num(row["id"])] = row
		}
		require.NoError(t, rows.Err())
		_, short, _ := strings.Cut(tbl, ".")
		have := state[short]
		require.Equal(t, len(want), len(have), "table %s: rows in the table vs rows the stream leaves", tbl)
		for id, row := range want {
			require.Equal(t, row, have[id], "table %s row %d: the stream leaves another state than the table's", tbl, id)
		}
	}
	if w != nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		for k, n := range w.events {
			require.Equal(t, n, got[k], "change %s: committed %d times, streamed %d times", k, n, got[k])
		}
		for k, n := range got {
			require.Equal(t, w.events[k], n, "change %s streamed %d times but committed %d times", k, n, w.events[k])
		}
	}
}

// countReads returns the number of read changes per table.
func countReads(ms []msg) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		if m.Body["op"] == "read" {
			out[m.Body["table"].(string)]++
		}
	}
	return out
}

// marker commits a row in table marks and waits until the stream has it,
// so that everything committed before is in the stream too.
func (e *env) marker(stream string) []msg {
	e.t.Helper()
	e.pg.ExecT(e.t, `CREATE TABLE IF NOT EXISTS marks (id serial PRIMARY KEY, at timestamptz DEFAULT now())`)
	var id int
	require.NoError(e.t, e.pg.Conn(e.t, "").QueryRow(context.Background(), `INSERT INTO marks DEFAULT VALUES RETURNING id`).Scan(&id))
	deadline := time.Now().Add(2 * time.Minute)
	var ms []msg
	for {
		var after uint64
		if len(ms) > 0 {
			after = ms[len(ms)-1].Seq
		}
		more := e.messagesAfter(stream, after) // what came since the last look
		ms = append(ms, more...)
		for _, m := range more {
			if m.Body["table"] == "marks" && m.Body["op"] == "insert" && num(m.Body["after"].(map[string]any)["id"]) == int64(id) {
				return ms
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("marker %d never reached stream %s", id, stream)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSnapshotInitialWithConcurrentWrites takes the initial snapshot of two
// tables while a writer updates, deletes and inserts rows of one of them,
// and checks with an oracle that the stream leaves each table's exact rows
// and carries every committed change exactly once.
func TestSnapshotInitialWithConcurrentWrites(t *testing.T) {
	defer parallel(t)()
	eachMajor(t, snapshotInitialWithConcurrentWrites)
}

func snapshotInitialWithConcurrentWrites(t *testing.T, major int) {
	e := newEnvMajor(t, major)
	n := int64(3000)
	if major != pgtest.DefaultMajor {
		n = 1000 // the matrix's extra majors: a smaller table, the same checks
	}
	e.pg.ExecT(t, `CREATE TABLE snap_a (id bigint PRIMARY KEY, v bigint NOT NULL, pad text)`,
		fmt.Sprintf(`INSERT INTO snap_a SELECT g, g, repeat('x', 50) FROM generate_series(1, %d) g`, n),
		`CREATE TABLE snap_b (id int PRIMARY KEY, name text, born date, tags text[])`,
		`INSERT INTO snap_b SELECT g, 'n' || g, date '2000-01-01' + g, ARRAY['a', g::text] FROM generate_series(1, 450) g`,
		`CREATE TABLE snap_empty (id int PRIMARY KEY)`)
	r := e.start(e.snapConfig("sinit", "initial", 200))
	waitSlotActive(t, e, "slot_sinit") // changes before the slot exists are not streamed
	w := startSnapWriter(t, e, "snap_a", 1_000_000, n, time.Millisecond)
	st := e.waitSnapshotDone("sinit", 3*time.Minute, nil)
	w.halt()
	require.Equal(t, "initial", st.Last.Reason)
	require.Empty(t, st.Last.Error)
	require.Len(t, st.Last.Tables, 3)
	for _, tb := range st.Last.Tables {
		require.True(t, tb.Done, "table %s", tb.Table)
	}
	ms := e.marker("CDC_sinit")
	reads := countReads(ms)
	require.Equal(t, 450, reads["snap_b"], "snap_b has no writer: every row is read once")
	require.Positive(t, reads["snap_a"])
	w.mu.Lock()
	t.Logf("rows read: %v; changes committed by the writer during the snapshot: %d kinds", reads, len(w.events))
	w.mu.Unlock()
	checkSnapshotStream(t, e, "sinit", ms, []string{"public.snap_a", "public.snap_b", "public.snap_empty"}, w)

	// The progress shows in /metrics.
	fams := scrape(t, "http://"+r.app.HTTPAddr())
	v, ok := metricValue(fams, "bridge_snapshot_rows", map[string]string{"source": "app", "table": "public.snap_b"})
	require.True(t, ok)
	require.Equal(t, 450.0, v)
	v, ok = metricValue(fams, "bridge_snapshot_running", map[string]string{"source": "app"})
	require.True(t, ok)
	require.Equal(t, 0.0, v)
}

// TestSnapshotOnDemandWhileStreaming asks a running bridge (mode never) for
// a snapshot with `bridge snapshot`, while a writer keeps changing the same
// rows; the stream must leave the table's exact rows. A second request for
// the same table is a new snapshot: its rows are published again.
func TestSnapshotOnDemandWhileStreaming(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	const n = 2000
	e.pg.ExecT(t, `CREATE TABLE od (id bigint PRIMARY KEY, v bigint NOT NULL, pad text)`,
		fmt.Sprintf(`INSERT INTO od SELECT g, g, 'p' FROM generate_series(1, %d) g`, n))
	cfg := e.snapConfig("sod", "never", 150)
	e.start(cfg)
	waitSlotActive(t, e, "slot_sod")
	e.pg.ExecT(t, `UPDATE od SET v = v + 1 WHERE id <= 10`)
	e.waitStored("CDC_sod", 10, time.Minute)
	st, _ := e.snapState("sod")
	require.Nil(t, st.Current, "mode never takes no snapshot by itself")
	require.Nil(t, st.Last)

	w := startSnapWriter(t, e, "od", 1_000_000, n, time.Millisecond)
	var out bytes.Buffer
	code := cli.Execute([]string{"snapshot", "-c", cfg, "--tables", "public.od", "--timeout", "3m", "--progress", "plain"}, &out, &out)
	w.halt()
	require.Equal(t, 0, code, out.String())
	require.Contains(t, out.String(), "complete")
	t.Log(out.String())
	ms := e.marker("CDC_sod")
	checkSnapshotStream(t, e, "sod", ms, []string{"public.od"}, w)
	first := countReads(ms)["od"]

	// Again: new snapshot id, so the rows are published again, not deduplicated.
	out.Reset()
	require.Equal(t, 0, cli.Execute([]string{"snapshot", "-c", cfg, "--tables", "od", "--timeout", "3m", "--progress", "bar"}, &out, &out), out.String())
	require.Contains(t, out.String(), "public.od")
	require.Contains(t, out.String(), "100%", "the bar reaches the end: %s", out.String())
	ms = e.marker("CDC_sod")
	var rows int64
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT count(*) FROM od`).Scan(&rows))
	require.Equal(t, first+int(rows), countReads(ms)["od"])
	checkSnapshotStream(t, e, "sod", ms, []string{"public.od"}, nil)

	// bridge status shows the same figures.
	out.Reset()
	require.Equal(t, 0, cli.Execute([]string{"status", "-c", cfg, "-o", "json"}, &out, &out), out.String())
	var rep status.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	snap := rep.Sources[0].Snapshot
	require.NotNil(t, snap)
	require.False(t, snap.Running)
	require.Len(t, snap.Tables, 1)
	require.Equal(t, "public.od", snap.Tables[0].Table)
	require.Equal(t, rows, snap.Tables[0].Rows)
	require.True(t, snap.Tables[0].Done)
	require.Positive(t, snap.Tables[0].RowsPerS)
}

// TestSnapshotTableWithoutKey: the initial snapshot refuses a table with
// neither primary key nor replica identity index, naming it and the fix; a
// replica identity index is enough.
func TestSnapshotTableWithoutKey(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE nokey (a int, b text)`, `INSERT INTO nokey VALUES (1, 'x')`,
		`CREATE TABLE ri (a int NOT NULL, b text)`, `CREATE UNIQUE INDEX ri_a ON ri (a)`, `ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_a`,
		`INSERT INTO ri SELECT g, 'r' FROM generate_series(1, 30) g`)
	r := e.start(e.snapConfig("snokey", "initial", 7))
	err := r.stopped(t, 2*time.Minute, "on a table without a key")
	require.Error(t, err)
	require.Contains(t, err.Error(), "public.nokey has no primary key")
	require.Contains(t, err.Error(), `ALTER TABLE "public"."nokey" ADD PRIMARY KEY`)
	require.NotContains(t, err.Error(), "public.ri ")

	// Without the keyless table, the replica identity index pages the other.
	e.pg.ExecT(t, `DROP TABLE nokey`)
	e.start(e.snapConfig("snokey", "initial", 7))
	st := e.waitSnapshotDone("snokey", 2*time.Minute, nil)
	require.Equal(t, []string{"a"}, st.Last.Tables[0].Key)
	ms := e.marker("CDC_snokey")
	require.Equal(t, 30, countReads(ms)["ri"])
}

// TestSnapshotModes: initial_only stops the pipeline once the snapshot is
// checkpointed (without error), and a restart does not snapshot again.
func TestSnapshotModes(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE m (id int PRIMARY KEY, v int)`, `INSERT INTO m SELECT g, g FROM generate_series(1, 100) g`)
	cfg := e.snapConfig("smodes", "initial_only", 30)
	r := e.start(cfg)
	select {
	case err := <-r.done:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatal("initial_only did not stop after its snapshot")
	}
	r.cancel()
	r.cancel = nil
	require.Equal(t, 100, countReads(e.messages("CDC_smodes"))["m"])
	st, _ := e.snapState("smodes")
	require.Equal(t, "initial", st.Last.Reason)

	// Restart in mode initial: the checkpoint exists, so no new snapshot.
	r = e.start(e.snapConfig("smodes", "initial", 30))
	waitSlotActive(t, e, "slot_smodes")
	ms := e.marker("CDC_smodes")
	require.Equal(t, 100, countReads(ms)["m"])
	st2, _ := e.snapState("smodes")
	require.Equal(t, st.Last.ID, st2.Last.ID)
	r.stop(t)

	// when_needed on a new bridge name (new checkpoint): snapshots at first start.
	e.start(e.snapConfig("swhen", "when_needed", 1000))
	e.waitSnapshotDone("swhen", 2*time.Minute, nil)
	require.Equal(t, 100, countReads(e.marker("CDC_swhen"))["m"])
	var out bytes.Buffer
	require.Equal(t, 0, cli.Execute([]string{"snapshot", "-c", e.snapConfig("swhen", "when_needed", 1000), "--follow"}, &out, &out), out.String())
	require.Contains(t, out.String(), "no snapshot running")
	require.Contains(t, out.String(), "(initial)")
}

// chunkQuery is a snapshot chunk query of table public.big as Postgres
// logged it (log_statement = all): the backend that ran it and the key
// the chunk starts after ("" for the table's first row).
type chunkQuery struct {
	pid   string
	after string
}

var (
	// SELECT <columns> FROM "public"."big" [WHERE ("id") > ($1::bigint) [AND ...]] ORDER BY "id" LIMIT $n,
	// as sources/internal/pgrepl reads a chunk; log_line_prefix '[%p] '.
	chunkExecRE   = regexp.MustCompile(`^\[(\d+)\] LOG:  execute [^:]*: SELECT .* FROM "public"\."big"( WHERE \("id"\) > \(\$1::bigint\))?.* ORDER BY "id" LIMIT \$\d+$`)
	chunkParamsRE = regexp.MustCompile(`^\[(\d+)\] DETAIL:  parameters: \$1 = '([^']*)'`)
)

// chunkLog follows a Postgres server log for chunkQuery entries.
type chunkLog struct {
	path    string
	off     int64
	partial string
	wait    map[string]bool // pid → its execute line awaits its parameters; true: the chunk has an after
	got     []chunkQuery
}

// queries reads what the log gained and returns every chunk query so far,
// in the log's order.
func (l *chunkLog) queries(t *testing.T) []chunkQuery {
	t.Helper()
	f, err := os.Open(l.path)
	require.NoError(t, err)
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, l.off, 1<<40))
	require.NoError(t, err)
	l.off += int64(len(b))
	text := l.partial + string(b)
	i := strings.LastIndexByte(text, '\n')
	if i < 0 {
		l.partial = text
		return l.got
	}
	l.partial = text[i+1:]
	if l.wait == nil {
		l.wait = map[string]bool{}
	}
	for _, line := range strings.Split(text[:i], "\n") {
		if m := chunkExecRE.FindStringSubmatch(line); m != nil {
			if m[2] == "" {
				l.got = append(l.got, chunkQuery{pid: m[1]}) // from the start: its parameter is the limit
			} else {
				l.wait[m[1]] = true
			}
			continue
		}
		if m := chunkParamsRE.FindStringSubmatch(line); m != nil && l.wait[m[1]] {
			delete(l.wait, m[1])
			l.got = append(l.got, chunkQuery{pid: m[1], after: m[2]})
		}
	}
	return l.got
}

// TestSnapshotKill9Resumes kills a bridge process mid-snapshot with
// SIGKILL, several times, while a writer changes rows; each restart goes on
// after the last checkpointed chunk, never re-reading a chunk before it, and
// the stream ends consistent with the table. Rows of chunks read again are
// deduplicated by their ids. Where each process reads is what it asked
// Postgres (the server's statement log: the chunk queries and their keys),
// not what it logs, since the bridge logs no keys.
func TestSnapshotKill9Resumes(t *testing.T) {
	defer parallel(t)()
	bin := bridgeBinary(t)
	e := newEnvPG(t, map[string]string{"log_statement": "all", "log_line_prefix": "'[%p] '"})
	pgLog := &chunkLog{path: filepath.Join(e.pg.Dir, "log")}
	n := 20000 * killFactor(t)
	e.pg.ExecT(t, `CREATE TABLE big (id bigint PRIMARY KEY, v bigint NOT NULL, pad text)`,
		fmt.Sprintf(`INSERT INTO big SELECT g, g, repeat('z', 200) FROM generate_series(1, %d) g`, n), `ANALYZE big`)
	cfg := e.snapConfig("skill", "initial", 250)
	var out *syncBuffer
	var outs []*syncBuffer // every process's log, shown when the test fails
	t.Cleanup(func() {
		if t.Failed() {
			for i, o := range outs {
				t.Logf("bridge process %d of %d:\n%s", i+1, len(outs), o.String())
			}
		}
	})
	start := func() *proc {
		out = &syncBuffer{}
		outs = append(outs, out)
		cmd := exec.Command(bin, "run", "-c", cfg, "--log-level", "debug")
		cmd.Stdout, cmd.Stderr = out, out
		cmd.Env = append(os.Environ(), "BRIDGE_LOG__FORMAT=text")
		require.NoError(t, cmd.Start())
		return &proc{cmd: cmd, out: out}
	}
	// A restarted process: the backends that read chunks before it (the
	// killed processes'), and the key it must resume after.
	type restart struct {
		before   map[string]bool
		resumeAt string
	}
	var restarts []restart
	kills := 0
	p := start()
	waitSlotActive(t, e, "slot_skill")
	w := startSnapWriter(t, e, "big", 1_000_000, int64(n), 2*time.Millisecond)
	for kills < 3*killFactor(t) {
		// Kill once the snapshot has made durable progress past the last kill.
		deadline := time.Now().Add(3 * time.Minute)
		var before snapshot.State
		for {
			st, ok := e.snapState("skill")
			if ok && st.Current != nil && len(st.Current.Tables) > 0 && st.Current.Tables[0].Chunks > int64(kills*8+3) {
				break
			}
			if ok && st.Current == nil && st.Last != nil {
				break // finished before we could kill again
			}
			require.False(t, time.Now().After(deadline), "no snapshot progress:\n%s", out.String())
			time.Sleep(50 * time.Millisecond)
		}
		p.kill9(t)
		kills++
		// What the dead process sent before it died (a snapshot state
		// saved, its ack never read) is still applied by the server after
		// the kill: read the state the next process will start from once
		// its connections are gone and the bucket is quiet.
		e.waitBridgeGone()
		e.waitQuiet("KV_bridge_checkpoints")
		before, _ = e.snapState("skill")
		if before.Current == nil {
			break
		}
		r := restart{before: map[string]bool{}, resumeAt: strings.Join(before.Current.Tables[0].After, ",")}
		for _, q := range pgLog.queries(t) {
			r.before[q.pid] = true
		}
		restarts = append(restarts, r)
		p = start()
		// The first chunk the new process reads starts at the checkpointed key.
		deadline = time.Now().Add(2 * time.Minute)
		for first := false; !first; {
			for _, q := range pgLog.queries(t) {
				if !r.before[q.pid] {
					require.Equal(t, r.resumeAt, q.after, "after kill %d the bridge must resume at the last checkpointed chunk (backend %s)", kills, q.pid)
					first = true
					break
				}
			}
			if st, _ := e.snapState("skill"); st.Current == nil {
				break
			}
			require.False(t, time.Now().After(deadline), "the restarted bridge read no chunk:\n%s", out.String())
			time.Sleep(50 * time.Millisecond)
		}
	}
	st := e.waitSnapshotDone("skill", 5*time.Minute, nil)
	w.halt()
	// And no restarted process ever read a chunk before it: its backends
	// are those that were not reading before its start, but were before
	// the next restart.
	qs := pgLog.queries(t)
	for i, r := range restarts {
		for _, q := range qs {
			if r.before[q.pid] || i+1 < len(restarts) && !restarts[i+1].before[q.pid] {
				continue
			}
			if q.after != "" && r.resumeAt != "" {
				require.GreaterOrEqual(t, atoi(q.after), atoi(r.resumeAt), "restart %d read a chunk before where it resumed (backend %s)", i+1, q.pid)
			}
		}
	}
	require.NotEmpty(t, qs, "the statement log holds the chunk queries")
	t.Logf("killed the bridge %d times during the snapshot; chunks per table: %d; chunk queries: %d", kills, st.Last.Tables[0].Chunks, len(qs))
	ms := e.marker("CDC_skill")
	checkSnapshotStream(t, e, "skill", ms, []string{"public.big"}, w)
	p.term(t)
}

func atoi(s string) int64 {
	var n int64
	_, _ = fmt.Sscan(s, &n)
	return n
}

// TestSnapshotLarge measures the initial snapshot of a large table through a
// bridge process (rows/s, peak RSS from /usr/bin/time -v). It runs only
// with TEST_LONG=1; SNAP_ROWS sets the size (default 5,000,000).
//
// Serial: it measures rows/s.
func TestSnapshotLarge(t *testing.T) {
	if os.Getenv("TEST_LONG") == "" {
		t.Skip("set TEST_LONG=1 to snapshot a 5-million-row table")
	}
	rows := int64(5_000_000)
	if s := os.Getenv("SNAP_ROWS"); s != "" {
		rows = atoi(s)
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE huge (id bigint PRIMARY KEY, v bigint NOT NULL, name text, at timestamptz)`,
		fmt.Sprintf(`INSERT INTO huge SELECT g, g * 7, 'name-' || g, timestamptz '2020-01-01' + g * interval '1 second' FROM generate_series(1, %d) g`, rows),
		`ANALYZE huge`)
	cfg := e.config("slarge", "      snapshot:\n        mode: initial_only\n        chunk_size: 10000\n        progress_interval: 10s")
	// A real deployment's stream: the test default's 1s window is not needed here.
	var out bytes.Buffer
	cmd := exec.Command("/usr/bin/time", "-v", bin, "run", "-c", cfg)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "BRIDGE_LOG__FORMAT=text")
	began := time.Now()
	require.NoError(t, cmd.Start())
	require.NoError(t, cmd.Wait(), out.String()) // initial_only: exits when the snapshot is checkpointed
	took := time.Since(began)
	e.waitStored("CDC_slarge", int(rows), time.Minute)
	rss := regexp.MustCompile(`Maximum resident set size \(kbytes\): (\d+)`).FindStringSubmatch(out.String())
	require.NotNil(t, rss, out.String())
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "snapshot table read") || strings.Contains(l, "snapshot complete") {
			t.Log(l)
		}
	}
	t.Logf("%d rows in %s (process start to exit): %.0f rows/s; peak RSS %s kB", rows, took.Round(time.Millisecond), float64(rows)/took.Seconds(), rss[1])
	st, _ := e.snapState("slarge")
	require.Equal(t, rows, st.Last.Tables[0].Rows)
}

// TestSnapshotRepeatedChunkDeduplicated reads every chunk of a finished
// snapshot again under the same snapshot id (its progress rolled back in
// the bucket, as after a crash before the progress write): the rows carry
// the same ids, so JetStream stores none of them twice.
func TestSnapshotRepeatedChunkDeduplicated(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE rc (id int PRIMARY KEY, v int)`, `INSERT INTO rc SELECT g, g FROM generate_series(1, 500) g`)
	cfg := e.snapConfig("srep", "initial", 100)
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, bytes.Replace(b, []byte("duplicate_window: 1s"), []byte("duplicate_window: 10m"), 1), 0o644))
	r := e.start(cfg)
	st := e.waitSnapshotDone("srep", 2*time.Minute, nil)
	require.Equal(t, 500, countReads(e.marker("CDC_srep"))["rc"])
	r.stop(t)

	// Roll the progress back to the start of the same snapshot.
	run := st.Last
	run.Finished = nil
	for i := range run.Tables {
		run.Tables[i].After, run.Tables[i].Rows, run.Tables[i].Chunks, run.Tables[i].Done = nil, 0, 0, false
		run.Tables[i].Started, run.Tables[i].Finished = nil, nil
	}
	st.Current, st.Last = run, nil
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), "bridge_checkpoints")
	require.NoError(t, err)
	v, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), snapshot.Key("srep", "app"), v)
	require.NoError(t, err)

	r = e.start(cfg)
	st2 := e.waitSnapshotDone("srep", 2*time.Minute, nil)
	require.Equal(t, run.ID, st2.Last.ID)
	ms := e.marker("CDC_srep")
	fams := scrape(t, "http://"+r.app.HTTPAddr())
	reads, ok := metricValue(fams, "bridge_snapshot_chunk_reads_total", map[string]string{"source": "app", "table": "public.rc"})
	require.True(t, ok)
	require.GreaterOrEqual(t, reads, 5.0, "every chunk was read again")
	require.Equal(t, 500, countReads(ms)["rc"], "the rows read again were deduplicated by their ids")
	checkSnapshotStream(t, e, "srep", ms, []string{"public.rc"}, nil)
}

// TestSnapshotWideRows: chunks end at snapshot.chunk_bytes, so rows of
// hundreds of kilobytes stay bounded in memory, and arrive whole.
func TestSnapshotWideRows(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE wide (id int PRIMARY KEY, body text, n int)`,
		`INSERT INTO wide SELECT g, (SELECT string_agg(md5(random()::text || g || i), '') FROM generate_series(1, 6000) i), g FROM generate_series(1, 7) g`)
	cfg := e.config("swide", "      snapshot:\n        mode: initial\n        chunk_size: 1000\n        chunk_bytes: 300000\n        request_poll: 200ms")
	e.start(cfg)
	st := e.waitSnapshotDone("swide", 2*time.Minute, nil)
	require.GreaterOrEqual(t, st.Last.Tables[0].Chunks, int64(4), "7 rows of 192 kB in chunks of at most ~300 kB")
	ms := e.marker("CDC_swide")
	require.Equal(t, 7, countReads(ms)["wide"])
	checkSnapshotStream(t, e, "swide", ms, []string{"public.wide"}, nil)
}

// TestSnapshotWal2JSON: a wal2json source snapshots the same way. On
// PostgreSQL 15 only, where wal2json exists (TestParityPgoutputWal2json).
func TestSnapshotWal2JSON(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE wj (id int PRIMARY KEY, v numeric, pad text)`,
		`INSERT INTO wj SELECT g, g / 4.0, 'p' || g FROM generate_series(1, 120) g`)
	cfg := e.snapConfig("swj", "initial", 25)
	usePlugin(t, cfg, "wal2json")
	e.start(cfg)
	waitSlotActive(t, e, "slot_swj")
	w := startSnapWriter(t, e, "wj", 1_000_000, 120, 2*time.Millisecond)
	e.waitSnapshotDone("swj", 2*time.Minute, nil)
	w.halt()
	ms := e.marker("CDC_swj")
	require.Positive(t, countReads(ms)["wj"])
	checkSnapshotStream(t, e, "swj", ms, []string{"public.wj"}, nil)
}
