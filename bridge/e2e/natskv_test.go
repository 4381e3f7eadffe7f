package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/sinks/natskv"
)

// kvConfig writes a bridge.yaml for source "app" → sink "kv" (nats_kv,
// bucket ROWS_<name>, history 64) with the route's format, and returns
// its path: e.config's, with a data directory of its own (bridges of
// several names run side by side). source is added to the pgoutput config
// block, checkpoint to the checkpoint section.
func (e *env) kvConfig(name, format, source, checkpoint string) string {
	e.t.Helper()
	p := e.config(name, source)
	b, err := os.ReadFile(p)
	require.NoError(e.t, err)
	y := string(b)
	y = strings.Replace(y, "data_dir: "+filepath.Join(e.dir, "data")+"\n", "data_dir: "+filepath.Join(e.dir, "data-"+name)+"\n", 1)
	if checkpoint != "" {
		y = strings.Replace(y, "  interval: 200ms\n", "  interval: 200ms\n"+checkpoint+"\n", 1)
	}
	i := strings.Index(y, "sinks:\n")
	require.Positive(e.t, i, "no sinks section in %s", p)
	y = y[:i] + fmt.Sprintf("sinks:\n  kv:\n    type: nats_kv\n    config:\n      bucket: ROWS_%s\n      history: 64\nroutes:\n  - sinks: [kv]\n    format: %s\n", name, format)
	require.NoError(e.t, os.WriteFile(p, []byte(y), 0o644))
	return p
}

// kvMsg is one message of a bucket's stream: a value, or a delete or
// purge marker (Op "DEL", "PURGE").
type kvMsg struct {
	Seq      uint64
	Key      string
	Op       string
	Header   nats.Header
	Body     map[string]any
	Producer string
	Pos      cdc.Pos
}

// kvMessages reads every message the stream of bucket holds, in order.
func (e *env) kvMessages(bucket string) []kvMsg {
	e.t.Helper()
	ctx, st, done := e.openStream("KV_" + bucket)
	defer done()
	info, err := st.Info(ctx)
	require.NoError(e.t, err)
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(e.t, err)
	prefix := "$KV." + bucket + "."
	var out []kvMsg
	// In batches, as env.messages reads: one message per request took
	// minutes for a bucket of tens of thousands of revisions once the
	// machine was loaded, and waitKT reads the bucket again and again.
	last := time.Now() // a message within 10 s, or the read fails
	for {
		batch, err := c.FetchNoWait(1000)
		require.NoError(e.t, err, "reading bucket %s", bucket)
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			last = time.Now()
			md, err := m.Metadata()
			require.NoError(e.t, err)
			km := kvMsg{Seq: md.Sequence.Stream, Key: strings.TrimPrefix(m.Subject(), prefix), Op: m.Headers().Get("KV-Operation"),
				Header: m.Headers(), Producer: m.Headers().Get(natskv.HeaderProducer)}
			lsn, err := cdc.ParseLSN(m.Headers().Get(natskv.HeaderCommitLSN))
			require.NoError(e.t, err, "stream seq %d: %s", km.Seq, natskv.HeaderCommitLSN)
			sq, err := strconv.ParseUint(m.Headers().Get(natskv.HeaderSeq), 10, 32)
			require.NoError(e.t, err, "stream seq %d: %s", km.Seq, natskv.HeaderSeq)
			km.Pos = cdc.Pos{LSN: lsn, Seq: uint32(sq)}
			require.NoError(e.t, json.Unmarshal(m.Data(), &km.Body), "stream seq %d: %s", km.Seq, m.Data())
			out = append(out, km)
			done = md.NumPending == 0
		}
		require.NoError(e.t, batch.Error(), "reading bucket %s", bucket)
		if done {
			return out
		}
		if n == 0 {
			if time.Since(last) > 10*time.Second {
				e.t.Fatalf("reading bucket %s: no message for 10s after %d of them", bucket, len(out))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// lastPerKey is each key's last message.
func lastPerKey(ms []kvMsg) map[string]kvMsg {
	out := map[string]kvMsg{}
	for _, m := range ms {
		out[m.Key] = m
	}
	return out
}

// checkRevisions asserts that no stored value ever went back in commit
// order: every revision of a row's key is a later change of its producer
// than the one before it (a table's own key records a truncate twice, at
// one position).
func checkRevisions(t testing.TB, ms []kvMsg) {
	t.Helper()
	last := map[string]kvMsg{}
	for _, m := range ms {
		if prev, ok := last[m.Key]; ok && prev.Producer == m.Producer {
			table := m.Header.Get(natskv.HeaderTruncate) != ""
			if !prev.Pos.Less(m.Pos) && !(table && prev.Pos == m.Pos) {
				t.Fatalf("key %q: stream seq %d (%s:%d, %s) follows seq %d (%s:%d, %s): a change was written over a later one, or again",
					m.Key, m.Seq, m.Pos.LSN, m.Pos.Seq, m.Header.Get(natskv.HeaderID), prev.Seq, prev.Pos.LSN, prev.Pos.Seq, prev.Header.Get(natskv.HeaderID))
			}
		}
		last[m.Key] = m
	}
}

// rowImage is the row a value carries, in the route's format.
func rowImage(t testing.TB, format string, body map[string]any) map[string]any {
	t.Helper()
	if format == "cloudevents" {
		body, _ = body["data"].(map[string]any)
	}
	row, ok := body["after"].(map[string]any)
	require.True(t, ok, "no row image in %v", body)
	return row
}

// TestKVMirror runs one bridge per format, each into its own bucket, over
// the same tables: composite keys with non-ASCII, dotted, slashed and
// empty text, rows taken by the initial snapshot, updates, an update
// that changes the key, deletes, a transaction updating one row twice, a
// TRUNCATE and rows after it. Every bucket must end holding exactly the
// tables' rows (an oracle: SELECT), deleted rows as delete markers, the
// truncated rows gone entirely, and no value ever replaced by an older
// one; the debezium route sends tombstones, which write nothing.
// Consumers Get one row and Watch a table.
func TestKVMirror(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE kv_items (order_id int, note text, sku text, qty int, PRIMARY KEY (order_id, sku))`)
	e.pg.ExecT(t, `CREATE TABLE kv_plain (id bigint PRIMARY KEY, v text)`)
	// Read by the initial snapshot.
	e.pg.ExecT(t, `INSERT INTO kv_items VALUES (1, 'a', 'München', 1), (1, 'b', 'a.b c', 2), (2, 'c', '', 3), (3, 'd', '日本', 4), (5, 'e', 'x/y', 5)`)

	formats := []string{"native", "debezium", "cloudevents"}
	for _, f := range formats {
		cfg := e.kvConfig("kv"+f, f, "      snapshot:\n        mode: initial", "")
		if f == "debezium" {
			// As Debezium's users run it: a tombstone after each delete,
			// which the KV mirror does not write (the delete's marker ends
			// the row).
			edit(t, cfg, "    format: debezium\n", "    format: debezium\n    debezium: { tombstones_on_delete: true }\n")
		}
		e.start(cfg)
		waitSlotActive(t, e, "slot_kv"+f)
	}
	for _, q := range []string{
		`INSERT INTO kv_plain SELECT g, 'v' || g FROM generate_series(1, 20) g`,
		`UPDATE kv_items SET qty = qty + 10 WHERE order_id = 1`,
		`UPDATE kv_items SET order_id = 4 WHERE sku = '日本'`,
		`DELETE FROM kv_items WHERE sku = ''`,
		`BEGIN; UPDATE kv_plain SET v = 'x' WHERE id = 1; UPDATE kv_plain SET v = 'y' WHERE id = 1; COMMIT`,
		`TRUNCATE kv_plain`,
		`INSERT INTO kv_plain VALUES (100, 'after')`,
		`BEGIN; DELETE FROM kv_plain WHERE id = 100; INSERT INTO kv_plain VALUES (100, 'again'); COMMIT`,
	} {
		e.pg.ExecT(t, q)
	}

	// The oracle: the rows, under the keys this test works out by hand.
	token := map[string]string{"München": "M=C3=BCnchen", "a.b c": "a=2Eb=20c", "": "=", "日本": "=E6=97=A5=E6=9C=AC", "x/y": "x=2Fy"}
	want := map[string]map[string]any{} // key → row
	rows, err := e.pg.Conn(t, "").Query(t.Context(), `SELECT order_id, note, sku, qty FROM kv_items`)
	require.NoError(t, err)
	for rows.Next() {
		var id, qty int
		var note, sku string
		require.NoError(t, rows.Scan(&id, &note, &sku, &qty))
		want[fmt.Sprintf("public.kv_items.%d.%s", id, token[sku])] = map[string]any{"order_id": float64(id), "note": note, "sku": sku, "qty": float64(qty)}
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 4)
	want["public.kv_plain.100"] = map[string]any{"id": float64(100), "v": "again"}
	deleted := []string{"public.kv_items.2.=", "public.kv_items.3.=E6=97=A5=E6=9C=AC"} // deleted, and moved to another key

	for _, f := range formats {
		t.Run(f, func(t *testing.T) {
			bucket := "ROWS_kv" + f
			var last map[string]kvMsg
			var ms []kvMsg
			deadline := time.Now().Add(2 * time.Minute)
			for {
				ms = e.kvMessages(bucket)
				last = lastPerKey(ms)
				if kvMatches(t, f, last, want, deleted) == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			require.NoError(t, kvMatches(t, f, last, want, deleted))
			checkRevisions(t, ms)
			for _, k := range deleted {
				// The marker is the delete's (or the key-moving update's),
				// with its payload, never a tombstone.
				require.NotContains(t, last[k].Header.Get(natskv.HeaderID), "~tombstone", k)
				require.NotEmpty(t, last[k].Body, "%s: the marker carries the change's payload", k)
			}
			require.Equal(t, "read", last["public.kv_items.5.x=2Fy"].Header.Get(natskv.HeaderOp), "the untouched row is the snapshot's")
			mark := last["public.kv_plain"]
			require.Equal(t, "done", mark.Header.Get(natskv.HeaderTruncate), "the table's key records the truncate")
			for k := range last {
				require.False(t, strings.HasPrefix(k, "public.kv_plain.") && k != "public.kv_plain.100", "truncated row %s is still in the bucket", k)
			}

			// Consumers: Get a row, Watch a table.
			nc, err := nats.Connect(e.natsURL())
			require.NoError(t, err)
			defer nc.Close()
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			kv, err := js.KeyValue(t.Context(), bucket)
			require.NoError(t, err)
			en, err := kv.Get(t.Context(), "public.kv_items.1.M=C3=BCnchen")
			require.NoError(t, err)
			var body map[string]any
			require.NoError(t, json.Unmarshal(en.Value(), &body))
			require.Equal(t, float64(11), rowImage(t, f, body)["qty"])
			_, err = kv.Get(t.Context(), "public.kv_items.2.=")
			require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
			w, err := kv.Watch(t.Context(), "public.kv_items.>", jetstream.IgnoreDeletes())
			require.NoError(t, err)
			defer func() { _ = w.Stop() }()
			var watched []string
			for en := range w.Updates() {
				if en == nil {
					break // the current values are all there
				}
				watched = append(watched, en.Key())
			}
			var items []string
			for k := range want {
				if strings.HasPrefix(k, "public.kv_items.") {
					items = append(items, k)
				}
			}
			require.ElementsMatch(t, items, watched)
		})
	}
}

// kvMatches says how the bucket's last values (last) differ from the
// oracle: want's rows live under their keys with their values, the
// deleted keys hold delete markers, nothing else holds a row.
func kvMatches(t testing.TB, format string, last map[string]kvMsg, want map[string]map[string]any, deleted []string) error {
	for k, row := range want {
		m, ok := last[k]
		if !ok || m.Op != "" {
			return fmt.Errorf("key %q: no value (op %q)", k, m.Op)
		}
		got := rowImage(t, format, m.Body)
		for col, v := range row {
			if fmt.Sprint(got[col]) != fmt.Sprint(v) {
				return fmt.Errorf("key %q: %s is %v, the table has %v", k, col, got[col], v)
			}
		}
	}
	for _, k := range deleted {
		if m := last[k]; m.Op != "DEL" {
			return fmt.Errorf("key %q: want a delete marker, has %q (%v)", k, m.Op, m.Body)
		}
	}
	var extra []string
	for k, m := range last {
		if _, ok := want[k]; !ok && m.Op == "" && m.Header.Get(natskv.HeaderTruncate) == "" {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return fmt.Errorf("keys holding rows the tables do not have: %v", extra)
	}
	return nil
}

// ktOracle returns kt's rows as their keys and values (w, n, v).
func ktOracle(t *testing.T, e *env) map[string][3]int {
	t.Helper()
	rows, err := e.pg.Conn(t, "").Query(t.Context(), `SELECT id, w, n, v FROM kt`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string][3]int{}
	for rows.Next() {
		var id int64
		var w, n, v int
		require.NoError(t, rows.Scan(&id, &w, &n, &v))
		out["public.kt."+strconv.FormatInt(id, 10)] = [3]int{w, n, v}
	}
	require.NoError(t, rows.Err())
	return out
}

// ktDiff says how the bucket's last values differ from kt's rows.
func ktDiff(last map[string]kvMsg, want map[string][3]int) error {
	var missing, wrong, extra []string
	for k, r := range want {
		m, ok := last[k]
		if !ok || m.Op != "" {
			missing = append(missing, k)
			continue
		}
		a, _ := m.Body["after"].(map[string]any)
		if got := fmt.Sprint(a["w"], a["n"], a["v"]); got != fmt.Sprint(float64(r[0]), float64(r[1]), float64(r[2])) {
			wrong = append(wrong, fmt.Sprintf("%s holds w n v %s, the row has %v (%s)", k, got, r, m.Header.Get(natskv.HeaderID)))
		}
	}
	for k, m := range last {
		if _, ok := want[k]; !ok && m.Op == "" {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(wrong)+len(extra) > 0 {
		return fmt.Errorf("%d rows; missing %d (e.g. %v), wrong %d (e.g. %v), deleted rows still there %d (e.g. %v)",
			len(want), len(missing), head(missing), len(wrong), head(wrong), len(extra), head(extra))
	}
	return nil
}

// waitKT waits until bucket holds exactly kt's rows and returns its messages.
func (e *env) waitKT(t *testing.T, bucket string, within time.Duration) []kvMsg {
	t.Helper()
	want := ktOracle(t, e)
	deadline := time.Now().Add(within)
	for {
		ms := e.kvMessages(bucket)
		err := ktDiff(lastPerKey(ms), want)
		if err == nil {
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("bucket %s after %s: %v", bucket, within, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestKVKill9MidStream kills the bridge process with SIGKILL at random
// moments while four writers insert, update and delete rows, restarting
// it each time: the bucket must end equal to the table, and no key's
// value may ever have been replaced by an older change (every revision in
// the bucket's history is later in commit order than the one before).
func TestKVKill9MidStream(t *testing.T) {
	defer parallel(t)()
	changes := 20000
	if testing.Short() {
		changes = 6000
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg := e.kvConfig("kvkill", "native", "", "")
	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_kvkill")
	p, _ = killWhileWriting(t, p, bin, cfg, w, changes, 10)
	ms := e.waitKT(t, "ROWS_kvkill", 3*time.Minute)
	checkRevisions(t, ms)
	t.Logf("the bucket holds %d rows after %d stored revisions", len(ktOracle(t, e)), len(ms))
	p.term(t)
}

// TestKVReplayFromOlderCheckpoint rewinds the checkpoint to the start
// (the slot keeps the WAL: confirm_delay) and restarts the bridge, which
// then sends every change again: the bucket must not change at all, and
// what comes after is written.
func TestKVReplayFromOlderCheckpoint(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	newWorkload(t, e) // its table, kt; the test writes the rows itself
	cfg := e.kvConfig("kvreplay", "native", "", "  confirm_delay: 1h")
	r := e.start(cfg)
	waitReady(t, r)
	waitSlotActive(t, e, "slot_kvreplay")
	ck := e.openCheckpoints(t)
	key := checkpoint.Key("kvreplay", "app")
	start, _, err := ck.Load(t.Context(), key)
	require.NoError(t, err)

	// Rows changed many times, so that a replayed change has later ones
	// to overwrite: inserts, updates, deletes, and rows inserted again.
	for i := range 30 {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO kt (id, w, n) VALUES (%d, 0, %d)`, i+1, i))
	}
	for round := 1; round <= 5; round++ {
		e.pg.ExecT(t, fmt.Sprintf(`UPDATE kt SET v = %d WHERE id %% 3 <> 0`, round))
		e.pg.ExecT(t, fmt.Sprintf(`DELETE FROM kt WHERE id %% 5 = %d`, round%5))
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO kt (id, w, n, v) SELECT g, 1, g, %d FROM generate_series(1, 30) g WHERE g %% 5 = %d`, 100+round, round%5))
	}
	ms := e.waitKT(t, "ROWS_kvreplay", time.Minute)
	checkRevisions(t, ms)
	p := r.app.Pipelines()[0]
	require.Eventually(t, func() bool { return p.Checkpointed() > start.LSN }, time.Minute, 50*time.Millisecond)
	r.stop(t)
	before := len(ms)

	// The checkpoint goes back to where the stream started.
	st, rev, err := ck.Load(t.Context(), key)
	require.NoError(t, err)
	reached := st.LSN
	require.Greater(t, uint64(reached), uint64(start.LSN))
	st.LSN, st.UpdatedAt = start.LSN, time.Time{}
	_, err = ck.Save(t.Context(), key, st, rev)
	require.NoError(t, err)

	r = e.start(cfg)
	waitReady(t, r)
	p = r.app.Pipelines()[0]
	require.Eventually(t, func() bool { return p.Checkpointed() >= reached }, time.Minute, 50*time.Millisecond,
		"the replay never reached the earlier checkpoint")
	require.Greater(t, p.Delivered(), uint64(100), "the changes were not sent again: the test proves nothing")
	require.Equal(t, before, len(e.kvMessages("ROWS_kvreplay")), "the replay wrote to the bucket")
	e.pg.ExecT(t, `UPDATE kt SET v = 999 WHERE id = 1`)
	ms = e.waitKT(t, "ROWS_kvreplay", time.Minute)
	checkRevisions(t, ms)
}

// openCheckpoints opens the bridge's checkpoint bucket on the test's NATS.
func (e *env) openCheckpoints(t *testing.T) *checkpoint.Store {
	t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	return st
}

// TestKVRefusesDeadLetter: a route with on_schema_change: dead_letter sets
// a held table's changes aside on another subject, which a KV mirror does
// not look at: `bridge validate` (and start) refuse such a route to a
// nats_kv sink, naming the route, the sink and the fix; pause is fine.
func TestKVRefusesDeadLetter(t *testing.T) {
	defer parallel(t)()
	p := filepath.Join(t.TempDir(), "bridge.yaml")
	write := func(policy string) {
		require.NoError(t, os.WriteFile(p, []byte(`name: kvdl
sources:
  app: { type: pgoutput, config: { dsn: "postgres://localhost/x", slot: s, publication: p } }
sinks:
  js: { type: nats_jetstream, config: { stream: S, subjects: ["cdc.>"] } }
  rows: { type: nats_kv, config: { bucket: ROWS } }
schemas: { enabled: true }
routes:
  - sinks: [js, rows]
    on_schema_change: `+policy+`
`), 0o644))
	}
	write("dead_letter")
	code, out, errs := execCLI(t, "validate", "-c", p)
	require.Equal(t, 1, code, "%s\n%s", out, errs)
	require.Contains(t, errs, `routes[0].on_schema_change: dead_letter sets a held table's changes aside on another subject, but sink "rows" (nats_kv) files changes by their row's key, not their subject: it would take them as if accepted; use pause for this route, or give "rows" a route of its own with on_schema_change: pause`)
	require.NotContains(t, errs, `sink "js"`, "a JetStream sink takes the dead-letter subject")
	write("pause")
	code, out, errs = execCLI(t, "validate", "-c", p)
	require.Equal(t, 0, code, "%s\n%s", out, errs)
}
