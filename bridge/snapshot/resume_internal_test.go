package snapshot

// Snapshot reads stay exactly once through kills: the real Wrap, Read,
// Checkpointed and worker of this package, their state in a real JetStream
// KV bucket, over a source of our own (a table in memory with a WAL) and
// model sinks that store what the test writes to them, as the pipeline's
// writer does (Held.Take per sink, positions past the checkpoint skipped).
// A kill is a run that stops at the step the test chose: nothing of it
// runs after.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sources"
)

// fakeDB is one table (id bigint key, v bigint) and its WAL.
type fakeDB struct {
	mu    sync.Mutex
	cond  *sync.Cond
	rows  map[int64]int64
	wal   []*cdc.Txn
	lsn   cdc.LSN
	rel   *cdc.Relation
	gate  chan struct{} // each ReadChunk takes one token
	highs chan cdc.LSN  // each ReadChunk's high watermark
	seq   int64
	// waiting is true while a ReadChunk waits for its token.
	waiting atomic.Bool
}

func newFakeDB(n int) *fakeDB {
	d := &fakeDB{rows: map[int64]int64{}, lsn: 0x1000, gate: make(chan struct{}), highs: make(chan cdc.LSN, 16), seq: 1000,
		rel: &cdc.Relation{ID: 1, Schema: "public", Table: "t", Columns: []cdc.Column{{Name: "id", Type: "int8", Key: true}, {Name: "v", Type: "int8"}}}}
	d.cond = sync.NewCond(&d.mu)
	for i := int64(1); i <= int64(n); i++ {
		d.rows[i] = i
	}
	return d
}

// commitLocked appends a transaction of cs to the WAL. Called with d.mu held.
func (d *fakeDB) commitLocked(cs ...cdc.Change) cdc.LSN {
	d.lsn += 0x100
	for i := range cs {
		cs[i].Source, cs[i].CommitLSN, cs[i].Seq, cs[i].TxSize = "app", d.lsn, uint32(i), uint32(len(cs))
	}
	d.wal = append(d.wal, &cdc.Txn{CommitLSN: d.lsn, Changes: cs})
	d.cond.Broadcast()
	return d.lsn
}

func (d *fakeDB) watermark(kind, id string) cdc.LSN {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.commitLocked(cdc.Change{Op: cdc.OpMessage, Prefix: sources.SnapshotPrefix, Content: []byte(sources.WatermarkContent(kind, id))})
}

// write commits a random insert, update or delete.
func (d *fakeDB) write(rng *rand.Rand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	c := cdc.Change{Schema: "public", Table: "t", Rel: d.rel}
	switch id := rng.Int64N(d.seq-1000+60) + 1; {
	case rng.IntN(4) == 0:
		id = d.seq // a new key, past every other
		c.Op, c.After = cdc.OpInsert, []any{id, d.seq}
		d.rows[id] = d.seq
	case d.rows[id] != 0 && rng.IntN(3) == 0:
		c.Op, c.Before = cdc.OpDelete, []any{id, nil}
		delete(d.rows, id)
	case d.rows[id] != 0:
		c.Op, c.After = cdc.OpUpdate, []any{id, d.seq}
		d.rows[id] = d.seq
	default:
		c.Op, c.After = cdc.OpInsert, []any{id, d.seq}
		d.rows[id] = d.seq
	}
	d.commitLocked(c)
}

// fakeSrc is one run's connection to the fakeDB: a sources.Source and
// sources.Snapshotter of our own.
type fakeSrc struct {
	db    *fakeDB
	next  int
	chunk int
}

func (s *fakeSrc) Open(_ context.Context, from cdc.LSN) error {
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	for s.next < len(s.db.wal) && s.db.wal[s.next].CommitLSN <= from {
		s.next++
	}
	return nil
}

func (s *fakeSrc) Read(ctx context.Context) (*cdc.Txn, error) {
	d := s.db
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for s.next >= len(d.wal) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d.cond.Wait()
	}
	t := *d.wal[s.next]
	t.Changes = slices.Clone(t.Changes)
	s.next++
	return &t, nil
}

func (s *fakeSrc) Ack(context.Context, cdc.LSN) error { return nil }
func (s *fakeSrc) Close(context.Context) error        { return nil }

func (s *fakeSrc) SnapshotOptions() sources.SnapshotOptions {
	return sources.SnapshotOptions{Mode: sources.SnapshotInitial, ChunkSize: s.chunk}
}

func (s *fakeSrc) SnapshotTables(context.Context, []string) ([]sources.SnapshotTable, error) {
	return []sources.SnapshotTable{{Schema: "public", Table: "t", Key: []string{"id"}, Estimate: 60}}, nil
}

func (s *fakeSrc) ReadChunk(ctx context.Context, t sources.SnapshotTable, after []string, limit int, id string) (*sources.Chunk, error) {
	d := s.db
	d.waiting.Store(true)
	select {
	case <-d.gate:
		d.waiting.Store(false)
	case <-ctx.Done():
		d.waiting.Store(false)
		return nil, ctx.Err()
	}
	d.watermark("low", id)
	bound := func(k []string) int64 {
		n, err := strconv.ParseInt(k[0], 10, 64)
		if err != nil {
			panic(err)
		}
		return n
	}
	d.mu.Lock()
	var ids []int64
	for k := range d.rows {
		if (after == nil || k > bound(after)) && (t.Until == nil || k <= bound(t.Until)) {
			ids = append(ids, k)
		}
	}
	slices.Sort(ids)
	ch := &sources.Chunk{Rel: d.rel}
	for _, k := range ids[:min(limit, len(ids))] {
		ch.Rows = append(ch.Rows, []any{k, d.rows[k]})
		ch.Last = []string{strconv.FormatInt(k, 10)}
	}
	d.mu.Unlock()
	d.highs <- d.watermark("high", id)
	return ch, nil
}

// modelSink stores message ids in order; its cursor is how many it holds.
type modelSink struct{ ids []string }

// delivered lists the positions of producer's ids after cursor, as
// natsjs's Delivered does.
func (k *modelSink) delivered(producer, cursor string) map[cdc.Pos]struct{} {
	from := 0
	if cursor != "" {
		from, _ = strconv.Atoi(cursor)
	}
	out := map[cdc.Pos]struct{}{}
	for _, id := range k.ids[from:] {
		if p, pos, err := cdc.ParseID(id); err == nil && p == producer {
			out[pos] = struct{}{}
		}
	}
	return out
}

// harness is the durable world: the bucket, the table, the sinks and the
// checkpoint (which lives in KV in the bridge; this package never reads it).
type harness struct {
	t      *testing.T
	kv     jetstream.KeyValue
	bridge string
	db     *fakeDB
	sinks  []*modelSink
	dests  [][]string // per sink: the destinations a change goes to ("" for one)
	epoch  string
	ckpt   struct {
		lsn     cdc.LSN
		cursors map[string]string
	}
	runs int
}

func sinkName(i int) string { return "s" + strconv.Itoa(i) }

func newHarness(t *testing.T, kv jetstream.KeyValue, bridge string, rows int, dests ...[]string) *harness {
	h := &harness{t: t, kv: kv, bridge: bridge, db: newFakeDB(rows), epoch: "e1", dests: dests}
	for range dests {
		h.sinks = append(h.sinks, &modelSink{})
	}
	m := New(bridge, "app", kv, sources.SnapshotOptions{Mode: sources.SnapshotInitial, ChunkSize: 10}, slog.New(slog.DiscardHandler))
	require.NoError(t, m.ScheduleInitial(t.Context(), h.epoch))
	return h
}

// modelRun is one pipeline run (one process).
type modelRun struct {
	h        *harness
	w        sources.Source
	stop     func()
	producer string
	held     []Held
	skip     []map[cdc.Pos]struct{}
	last     cdc.LSN
	mark     map[string]string // the sinks' cursors once last was written, as the writer marks them
	dead     bool
}

// start begins a run from the checkpoint, as the pipeline does.
func (h *harness) start(chunk int) *modelRun {
	h.t.Helper()
	h.runs++
	log := slog.New(slog.NewTextHandler(h.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})).With("run", h.runs)
	m := New(h.bridge, "app", h.kv, sources.SnapshotOptions{Mode: sources.SnapshotInitial, ChunkSize: chunk, Poll: time.Hour}, log)
	src := &fakeSrc{db: h.db, chunk: chunk}
	require.NoError(h.t, src.Open(h.t.Context(), h.ckpt.lsn))
	r := &modelRun{h: h, producer: h.bridge + ".app." + h.epoch, held: make([]Held, len(h.sinks)), last: h.ckpt.lsn,
		mark: maps.Clone(h.ckpt.cursors)}
	for i, k := range h.sinks {
		r.skip = append(r.skip, k.delivered(r.producer, h.ckpt.cursors[sinkName(i)]))
	}
	held := func(_ context.Context, producer string, from map[string]string) error {
		for i, k := range h.sinks {
			if d := k.delivered(producer, from[sinkName(i)]); len(d) > 0 {
				r.held[i] = d
			}
		}
		return nil
	}
	w, stop, err := m.Wrap(h.t.Context(), src, r.producer, h.epoch, maps.Clone(h.ckpt.cursors), held)
	require.NoError(h.t, err)
	r.w, r.stop = w, stop
	h.t.Cleanup(r.kill)
	return r
}

// kill ends the run where it is.
func (r *modelRun) kill() {
	if !r.dead {
		r.dead = true
		r.stop()
	}
}

// canRead reports whether the worker has a chunk to read: a snapshot
// runs and not every table of it is read (and waiting to be counted).
func (r *modelRun) canRead() bool {
	sr := r.w.(*snapRun)
	for range 1000 {
		if r.h.db.waiting.Load() {
			return true
		}
		sr.mu.Lock()
		idle := sr.st.Current == nil || (sr.st.Current.Resolved && !slices.Contains(sr.memDone, false))
		sr.mu.Unlock()
		if idle {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// allow lets the worker read one chunk and returns its high watermark.
func (r *modelRun) allow() cdc.LSN {
	r.h.t.Helper()
	select {
	case r.h.db.gate <- struct{}{}:
	case <-time.After(10 * time.Second):
		r.h.t.Fatal("the worker read no chunk")
	}
	select {
	case hw := <-r.h.db.highs:
		return hw
	case <-time.After(10 * time.Second):
		r.h.t.Fatal("the chunk did not end")
	}
	return 0
}

// read returns the run's next transaction.
func (r *modelRun) read() *cdc.Txn {
	r.h.t.Helper()
	ctx, cancel := context.WithTimeout(r.h.t.Context(), 10*time.Second)
	defer cancel()
	t, err := r.w.Read(ctx)
	require.NoError(r.h.t, err)
	return t
}

// write stores the first n changes of t (all when n < 0) in the sinks
// listed (all when none), leaving out what each holds already.
func (r *modelRun) write(t *cdc.Txn, n int, sinks ...int) {
	if len(sinks) == 0 {
		for i := range r.h.sinks {
			sinks = append(sinks, i)
		}
	}
	cs := t.Changes
	if n >= 0 && n < len(cs) {
		cs = cs[:n]
	}
	wrote := map[int]bool{}
	for _, si := range sinks {
		for _, c := range cs {
			c.Producer = r.producer
			for _, dest := range r.h.dests[si] {
				c.Dest = dest
				if _, ok := r.skip[si][c.Pos()]; ok && c.MsgID == "" {
					delete(r.skip[si], c.Pos())
					continue
				}
				if r.held[si].Take(&c) {
					continue
				}
				r.h.sinks[si].ids = append(r.h.sinks[si].ids, c.ID())
				wrote[si] = true
			}
		}
	}
	if n < 0 || n >= len(t.Changes) {
		r.last = t.CommitLSN
		// As the pipeline's writer: a sink given nothing keeps its cursor.
		if r.mark == nil {
			r.mark = map[string]string{}
		}
		for si := range wrote {
			r.mark[sinkName(si)] = strconv.Itoa(len(r.h.sinks[si].ids))
		}
	}
}

// deliver reads and writes whole transactions up to and including upTo.
func (r *modelRun) deliver(upTo cdc.LSN) {
	for r.last < upTo {
		r.write(r.read(), -1)
	}
}

// checkpoint saves the checkpoint at the last transaction written whole,
// then tells the snapshot, as the pipeline's checkpointer does.
func (r *modelRun) checkpoint() {
	r.h.t.Helper()
	r.saveOnly()
	cp, ok := r.w.(Checkpointer)
	require.True(r.h.t, ok)
	require.NoError(r.h.t, cp.Checkpointed(r.h.t.Context(), r.last, maps.Clone(r.h.ckpt.cursors)))
}

// saveOnly saves the checkpoint but does not tell the snapshot (a kill
// between the two).
func (r *modelRun) saveOnly() {
	r.h.ckpt.lsn, r.h.ckpt.cursors = r.last, maps.Clone(r.mark)
}

func (h *harness) state() State {
	h.t.Helper()
	st, _, err := Load(h.t.Context(), h.kv, h.bridge, "app")
	require.NoError(h.t, err)
	return st
}

// finish runs the snapshot to its end without a kill.
func (h *harness) finish(chunk int) *modelRun {
	h.t.Helper()
	r := h.start(chunk)
	for i := 0; h.state().Current != nil; i++ {
		require.Less(h.t, i, 1000, "the snapshot does not end")
		r.deliver(r.allow())
		r.checkpoint()
	}
	r.h.db.mu.Lock()
	end := r.h.db.lsn
	r.h.db.mu.Unlock()
	r.deliver(end)
	r.checkpoint()
	return r
}

// check verifies every sink: no id stored twice, and applying what it
// stored (per destination) in order leaves the table's rows.
func (h *harness) check() {
	h.t.Helper()
	for si, k := range h.sinks {
		seen := map[string]int{}
		for i, id := range k.ids {
			if j, dup := seen[id]; dup {
				h.t.Fatalf("sink %d: id %s stored twice (at %d and %d) after %d runs", si, id, j, i, h.runs)
			}
			seen[id] = i
		}
	}
	// The ids say which row each read is (their position is a hash of the
	// key): rebuild the expected ids of the rows and check each is read or
	// changed after being read.
	h.db.mu.Lock()
	defer h.db.mu.Unlock()
	st := h.state()
	require.NotNil(h.t, st.Last)
	snapProducer := h.bridge + ".app." + h.epoch + ".snap-" + st.Last.ID
	for si, k := range h.sinks {
		for _, dest := range h.dests[si] {
			ids := map[string]bool{}
			for _, id := range k.ids {
				ids[id] = true
			}
			for key := range h.db.rows {
				pos := rowPos("public", "t", fmt.Sprint(key)+"\x00")
				id := (&cdc.Change{MsgID: snapProducer + ":" + pos.LSN.Hex() + ":" + strconv.FormatUint(uint64(pos.Seq), 10), Dest: dest}).ID()
				if !ids[id] && !h.changedLocked(key) {
					h.t.Fatalf("sink %d dest %q: row %d is in the table but neither read (%s) nor changed in the stream", si, dest, key, id)
				}
			}
		}
	}
}

// changedLocked reports whether the WAL holds a change of key.
func (h *harness) changedLocked(key int64) bool {
	for _, t := range h.db.wal {
		for _, c := range t.Changes {
			for _, row := range [][]any{c.Before, c.After} {
				if len(row) > 0 && row[0] == key {
					return true
				}
			}
		}
	}
	return false
}

func kvT(t *testing.T) jetstream.KeyValue {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "ckpt"})
	require.NoError(t, err)
	return kv
}

// TestResumeAfterPredecessorsCopies: run 1 counts chunk 1, sends chunks 2
// and 3 and is killed; a row is updated; run 2 streams the update (past
// run 1's copies), reads chunk 2 again (its rows held: nothing sent),
// counts it and is killed. The copies run 1 made of chunk 3 must still be
// found by run 3, or it sends them again.
func TestResumeAfterPredecessorsCopies(t *testing.T) {
	h := newHarness(t, kvT(t), "a", 30, []string{""})
	r := h.start(10)
	r.deliver(r.allow())
	r.checkpoint()
	r.deliver(r.allow())
	r.deliver(r.allow())
	r.kill()
	require.EqualValues(t, 1, h.state().Current.Tables[0].Chunks)
	h.db.mu.Lock()
	h.db.rows[5] = 500
	h.db.commitLocked(cdc.Change{Schema: "public", Table: "t", Rel: h.db.rel, Op: cdc.OpUpdate, After: []any{int64(5), int64(500)}})
	h.db.mu.Unlock()

	r = h.start(10)
	r.deliver(r.allow())
	r.checkpoint()
	require.EqualValues(t, 2, h.state().Current.Tables[0].Chunks)
	r.kill()

	h.finish(10)
	h.check()
}

// TestResumeAfterShiftedChunks: as above, but rows deleted and inserted
// between the runs move the chunk boundaries, so no chunk run 2 reads
// matches one of run 1.
func TestResumeAfterShiftedChunks(t *testing.T) {
	h := newHarness(t, kvT(t), "b", 40, []string{""})
	r := h.start(10)
	r.deliver(r.allow())
	r.checkpoint()
	r.deliver(r.allow())
	r.deliver(r.allow())
	r.deliver(r.allow())
	r.kill()

	h.db.mu.Lock()
	for _, k := range []int64{12, 13, 14, 25} {
		delete(h.db.rows, k)
		h.db.commitLocked(cdc.Change{Schema: "public", Table: "t", Rel: h.db.rel, Op: cdc.OpDelete, Before: []any{k, nil}})
	}
	h.db.mu.Unlock()

	for range 3 {
		r = h.start(7)
		r.deliver(r.allow())
		r.checkpoint()
		r.deliver(r.allow())
		r.kill()
	}
	h.finish(7)
	h.check()
}

// TestResumeCheckpointWithoutCursors: the snapshot starts before any sink
// holds anything (a checkpoint without cursors); a run sends a chunk,
// saves a checkpoint past it and is killed before it counts the chunk.
// The next run must look for the rows from the sinks' start, not from its
// own checkpoint's cursors.
func TestResumeCheckpointWithoutCursors(t *testing.T) {
	h := newHarness(t, kvT(t), "c", 25, []string{""})
	r := h.start(10)
	r.deliver(r.allow())
	r.saveOnly()
	r.kill()
	b, err := json.Marshal(h.state().Current)
	require.NoError(t, err)
	require.Contains(t, string(b), `"scan_from":{}`, "a snapshot begun without sink cursors scans the sinks from their start")

	h.finish(10)
	h.check()
}

// TestResumePerSink: a chunk reached one sink and not the other when the
// run was killed. The next run sends it to the other only; with routes
// that publish each change twice into one sink (fan-out, ids with a
// destination) each copy is told apart.
func TestResumePerSink(t *testing.T) {
	h := newHarness(t, kvT(t), "d", 25, []string{"a", "b"}, []string{""})
	r := h.start(10)
	r.deliver(r.allow())
	r.checkpoint()
	hw := r.allow()
	for r.last < hw {
		tx := r.read()
		if tx.CommitLSN == hw {
			r.write(tx, -1, 0) // sink 0 only
			r.write(tx, 3, 1)  // three rows into sink 1
			break
		}
		r.write(tx, -1)
	}
	r.kill()
	h.finish(10)
	h.check()
}

// TestResumeRandomKills kills runs at random steps (between or inside
// writes, between a checkpoint and its count) while rows change, into two
// sinks, one with fan-out routes, and checks after each snapshot that no
// sink stored an id twice and every row reached every destination.
func TestResumeRandomKills(t *testing.T) {
	kv := kvT(t)
	iterations := 40
	if testing.Short() {
		iterations = 10
	}
	base := uint64(time.Now().UnixNano())
	if s := os.Getenv("SNAP_SEED"); s != "" {
		base, _ = strconv.ParseUint(s, 10, 64) // to run a failed case again: its name
		iterations = 1
	}
	for it := range iterations {
		seed := base + uint64(it)
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0))
			h := newHarness(t, kv, fmt.Sprintf("r%d", it), 30+rng.IntN(40), []string{"a", "b"}, []string{""})
			for kills := 0; kills < 8 && h.state().Current != nil; kills++ {
				r := h.start(3 + rng.IntN(8))
				randomRun(t, rng, r)
			}
			h.finish(3 + rng.IntN(8))
			h.check()
		})
	}
}

// randomRun takes random steps and ends with a kill somewhere.
func randomRun(t *testing.T, rng *rand.Rand, r *modelRun) {
	t.Helper()
	defer r.kill()
	for step := 0; step < 40; step++ {
		switch rng.IntN(10) {
		case 0, 1:
			r.h.db.write(rng)
		case 2, 3, 4:
			if !r.canRead() {
				continue
			}
			hw := r.allow()
			for r.last < hw {
				tx := r.read()
				if rng.IntN(8) == 0 {
					// Killed while writing: a prefix of the transaction
					// reached one sink or both.
					r.write(tx, rng.IntN(len(tx.Changes)+1), rng.IntN(len(r.h.sinks)))
					return
				}
				r.write(tx, -1)
			}
		case 5, 6:
			r.checkpoint()
		case 7:
			r.saveOnly()
			return
		default:
			if rng.IntN(3) == 0 {
				return
			}
		}
	}
}
