package bridge

// Snapshots (docs/snapshots.md): the current rows of tables, read in key
// order in bounded chunks, each chunk between a low and a high watermark
// written to the WAL (DBLog, as Debezium's incremental snapshots and Sequin's
// backfills do). The runtime wraps the source: it watches the stream for the
// watermarks, notes the keys of the rows that change between them, and at
// the high watermark puts the chunk's other rows into the stream as "read"
// changes. A row changed while its chunk was read is left out: the change
// itself, later in the stream, carries its newer state. So a consumer that
// applies the stream in order ends with every row's latest state, whatever
// writes run during the snapshot, and the stream never stops.
//
// Progress (per table: the last key whose chunk is checkpointed, rows,
// done) lives in the checkpoint bucket under "<bridge>.<source>.snapshot",
// written with compare-and-set once the chunk's position is checkpointed. A
// restart continues after the last checkpointed chunk. Read changes carry
// ids made of the snapshot id and the row's key, so a chunk read again
// after a crash is deduplicated by JetStream.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/sources"
)

// errSnapshotDone ends a run of a source whose snapshot.mode is
// initial_only once its snapshot is checkpointed; the pipeline then stops
// without error.
var errSnapshotDone = errors.New("snapshot complete; snapshot.mode is initial_only, so the pipeline stops")

// SnapshotState is what the checkpoint bucket keeps about a source's
// snapshots, under SnapshotKey. Field names are stable (`nats kv get`).
type SnapshotState struct {
	// InitialEpoch is the epoch whose automatic snapshot (modes initial,
	// initial_only, when_needed) was scheduled.
	InitialEpoch string `json:"initial_epoch,omitempty"`
	// Current is the snapshot running, if any.
	Current *SnapshotRun `json:"current,omitempty"`
	// Queue holds requested snapshots waiting for Current to finish.
	Queue []SnapshotRequest `json:"queue,omitempty"`
	// Last is the last snapshot that finished or failed.
	Last *SnapshotRun `json:"last,omitempty"`
	// Handled are the ids of the last requests taken from the bucket.
	Handled   []string  `json:"handled,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SnapshotRequest asks for a snapshot of tables ("schema.table"; empty:
// every table the source streams). `bridge snapshot` writes it under
// SnapshotRequestKey.
type SnapshotRequest struct {
	ID     string    `json:"id"`
	Tables []string  `json:"tables,omitempty"`
	Reason string    `json:"reason"` // "initial" or "request"
	At     time.Time `json:"at"`
}

// SnapshotRun is one snapshot and its durable progress.
type SnapshotRun struct {
	ID       string      `json:"id"`
	Reason   string      `json:"reason"`
	Epoch    string      `json:"epoch"`
	Request  []string    `json:"request,omitempty"` // the tables asked for
	Resolved bool        `json:"resolved"`          // Tables holds the resolved tables
	Tables   []SnapTable `json:"tables"`
	Started  time.Time   `json:"started"`
	Finished *time.Time  `json:"finished,omitempty"`
	Error    string      `json:"error,omitempty"`
	// ScanFrom are sink cursors at or before the first message of every
	// chunk that Tables does not count yet: where a restart looks for the
	// rows the sinks already hold.
	ScanFrom map[string]string `json:"scan_from,omitempty"`
}

// SnapTable is one table's durable snapshot progress.
type SnapTable struct {
	Table    string     `json:"table"` // schema.table
	Key      []string   `json:"key"`
	After    []string   `json:"after,omitempty"` // key (text) of the last checkpointed row
	Rows     int64      `json:"rows"`            // rows published and checkpointed
	Chunks   int64      `json:"chunks"`
	Estimate int64      `json:"estimate"`
	Done     bool       `json:"done"`
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
}

func (t SnapTable) source() sources.SnapshotTable {
	s, n, _ := strings.Cut(t.Table, ".")
	return sources.SnapshotTable{Schema: s, Table: n, Key: t.Key, Estimate: t.Estimate}
}

// SnapshotKey returns the KV key of a source's snapshot state.
func SnapshotKey(bridge, source string) string { return checkpoint.Key(bridge, source) + ".snapshot" }

// SnapshotRequestKey returns the KV key of a snapshot request.
func SnapshotRequestKey(bridge, source, id string) string {
	return checkpoint.Key(bridge, source) + ".snapreq." + id
}

// snapMgr is a pipeline's snapshot runtime; nil when the source cannot
// snapshot. Its methods are nil-safe.
type snapMgr struct {
	bridge, source string
	kv             jetstream.KeyValue
	opts           sources.SnapshotOptions
	log            *slog.Logger

	// Live figures for metrics and logs.
	mu    sync.Mutex
	live  map[string]*snapLive // by table
	runID string
	done  int // tables done in the current snapshot
	total int
}

// snapLive is what this process has emitted of one table.
type snapLive struct {
	rows, estimate int64
	started        time.Time
	finished       time.Time
	chunkReads     int64
}

func (m *snapMgr) key() string { return SnapshotKey(m.bridge, m.source) }

// load reads the state and its revision (0: none yet).
func (m *snapMgr) load(ctx context.Context) (SnapshotState, uint64, error) {
	var st SnapshotState
	e, err := m.kv.Get(ctx, m.key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, 0, nil
	}
	if err != nil {
		return st, 0, fmt.Errorf("loading snapshot state %q: %w", m.key(), err)
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("decoding snapshot state %q (revision %d): %w", m.key(), e.Revision(), err)
	}
	return st, e.Revision(), nil
}

// save writes st with compare-and-set at rev and returns the new revision.
func (m *snapMgr) save(ctx context.Context, st *SnapshotState, rev uint64) (uint64, error) {
	st.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(st)
	if err != nil {
		return 0, err
	}
	var n uint64
	if rev == 0 {
		n, err = m.kv.Create(ctx, m.key(), b)
	} else {
		n, err = m.kv.Update(ctx, m.key(), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("saving snapshot state %q at revision %d: %w", m.key(), rev, checkpoint.ErrFenced)
	}
	if err != nil {
		return 0, fmt.Errorf("saving snapshot state %q: %w", m.key(), err)
	}
	return n, nil
}

// ckptCursors returns the sink cursors of the source's checkpoint.
func (m *snapMgr) ckptCursors(ctx context.Context) (map[string]string, error) {
	key := checkpoint.Key(m.bridge, m.source)
	e, err := m.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint %q: %w", key, err)
	}
	var st checkpoint.State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return nil, fmt.Errorf("decoding checkpoint %q: %w", key, err)
	}
	if st.Cursors == nil {
		return map[string]string{}, nil
	}
	return st.Cursors, nil
}

func newRun(id, reason, epoch string, tables []string) *SnapshotRun {
	return &SnapshotRun{ID: id, Reason: reason, Epoch: epoch, Request: tables, Started: time.Now().UTC()}
}

// scheduleInitial records, before the first checkpoint of a new epoch is
// written, that the epoch's initial snapshot is due (modes initial,
// initial_only, when_needed), so a crash between the two cannot lose it.
func (m *snapMgr) scheduleInitial(ctx context.Context, epoch string) error {
	if m == nil || m.opts.Mode == sources.SnapshotNever || m.opts.Mode == "" {
		return nil
	}
	st, rev, err := m.load(ctx)
	if err != nil {
		return err
	}
	if st.InitialEpoch == epoch {
		return nil
	}
	m.setInitial(&st, epoch)
	_, err = m.save(ctx, &st, rev)
	return err
}

// setInitial schedules the initial snapshot of epoch in st; a snapshot of
// an older epoch is dropped (its ids belong to the old producer).
func (m *snapMgr) setInitial(st *SnapshotState, epoch string) {
	st.InitialEpoch = epoch
	r := newRun("i"+checkpoint.NewEpoch(), "initial", epoch, nil)
	if st.Current != nil && st.Current.Epoch != epoch {
		st.Current = nil
	}
	if st.Current == nil {
		st.Current = r
		return
	}
	st.Queue = append([]SnapshotRequest{{ID: r.ID, Reason: "initial", At: r.Started}}, st.Queue...)
}

// snapRun is one pipeline run's snapshot work: the source wrapper that the
// pipeline reads from, and the worker that reads chunks.
type snapRun struct {
	sources.Source
	m        *snapMgr
	sn       sources.Snapshotter
	producer string
	epoch    string
	log      *slog.Logger

	mu      sync.Mutex
	st      SnapshotState
	rev     uint64
	cursor  []*[]string // per table of Current: next chunk starts after it (in memory)
	memDone []bool
	pending *pendingChunk
	emitted []emittedChunk
	fatal   error
	wake    chan struct{}
	abort   context.Context // done when the run must end (fatal, or initial_only complete)
	cancel  context.CancelFunc
	stopped bool

	// The context Read hands the wrapped source: the caller's, also done
	// when abort is. Made once per caller's context, not once per Read
	// (reader only).
	rparent context.Context
	rctx    context.Context
	rcancel context.CancelFunc
	rstop   func() bool

	keyIdx map[*cdc.Relation][]int
	held   map[cdc.Pos]struct{} // read rows of Current every sink holds (reader only)
}

// heldFunc returns the positions of producer's messages that every sink
// holds after the checkpoint; nil when some sink cannot tell.
type heldFunc func(ctx context.Context, producer string, from map[string]string) (map[cdc.Pos]struct{}, error)

// snapHeld returns the heldFunc of a run that starts from cursors.
func (p *Pipeline) snapHeld(cursors map[string]string) heldFunc {
	return func(ctx context.Context, producer string, from map[string]string) (map[cdc.Pos]struct{}, error) {
		if from == nil {
			from = cursors
		}
		var out map[cdc.Pos]struct{}
		for _, s := range p.sinks {
			if s.amo {
				continue
			}
			if s.resumer == nil {
				return nil, nil
			}
			d, err := s.resumer.Delivered(ctx, producer, from[s.name])
			if err != nil {
				return nil, fmt.Errorf("sink %q: %w", s.name, err)
			}
			if out == nil {
				out = d
				continue
			}
			for k := range out {
				if _, ok := d[k]; !ok {
					delete(out, k)
				}
			}
		}
		return out, nil
	}
}

// pendingChunk is a chunk between its watermarks.
type pendingChunk struct {
	id      string
	table   int
	tbl     sources.SnapshotTable
	open    bool // low watermark seen
	keys    map[string]struct{}
	dropAll bool // the table was truncated between the watermarks
	retry   bool // a change's key could not be read: read the chunk again
	ready   chan struct{}
	chunk   *sources.Chunk
	err     error
	emitted chan struct{}
	done    bool // set by the reader: the chunk ended its table
	started time.Time
}

// emittedChunk is a chunk in the stream, not yet checkpointed.
type emittedChunk struct {
	commit  cdc.LSN
	runID   string
	table   int
	last    []string
	rows    int64
	done    bool
	retry   bool
	started time.Time // when the chunk's read began
}

// wrap returns the source the run reads from and a stop function that ends
// the worker; src itself when snapshots are off for it.
func (m *snapMgr) wrap(ctx context.Context, src sources.Source, producer, epoch string, held heldFunc) (sources.Source, func(), error) {
	sn, ok := src.(sources.Snapshotter)
	if m == nil || !ok {
		return src, func() {}, nil
	}
	r := &snapRun{Source: src, m: m, sn: sn, producer: producer, epoch: epoch, log: m.log,
		wake: make(chan struct{}, 1), keyIdx: map[*cdc.Relation][]int{}}
	r.abort, r.cancel = context.WithCancel(context.Background())
	st, rev, err := m.load(ctx)
	if err != nil {
		return nil, nil, err
	}
	r.st, r.rev = st, rev
	changed := false
	if r.st.Current != nil && r.st.Current.Epoch != epoch {
		// The producer changed: positions and ids of the old snapshot mean nothing now.
		r.log.Warn("dropping a snapshot of an earlier epoch", "snapshot", r.st.Current.ID, "epoch", r.st.Current.Epoch)
		r.st.Current, changed = nil, true
	}
	if m.opts.Mode == sources.SnapshotWhenNeeded && r.st.InitialEpoch != epoch {
		m.setInitial(&r.st, epoch)
		changed = true
	}
	if changed {
		if r.rev, err = m.save(ctx, &r.st, r.rev); err != nil {
			return nil, nil, err
		}
	}
	if c := r.st.Current; c != nil && c.Resolved && held != nil {
		// Rows of chunks read again after a crash that the sinks already
		// hold are not sent again, even past the duplicate window.
		if r.held, err = held(ctx, producer+".snap-"+c.ID, c.ScanFrom); err != nil {
			return nil, nil, fmt.Errorf("reading which rows of snapshot %s the sinks hold: %w", c.ID, err)
		}
		if len(r.held) > 0 {
			r.log.Info("sinks already hold rows of the running snapshot; they will not be sent again", "snapshot", c.ID, "rows", len(r.held))
		}
	}
	r.resetCursors()
	r.checkStop()
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.work(wctx)
	}()
	return r, func() { cancel(); <-done; r.cancel() }, nil
}

// resetCursors starts the in-memory cursors at the durable progress.
// Called with r.mu held (or before the worker starts).
func (r *snapRun) resetCursors() {
	r.cursor, r.memDone = nil, nil
	if c := r.st.Current; c != nil {
		for i := range c.Tables {
			a := slices.Clone(c.Tables[i].After)
			r.cursor = append(r.cursor, &a)
			r.memDone = append(r.memDone, c.Tables[i].Done)
		}
	}
	r.m.setLive(r.st.Current)
}

// checkStop closes r.stop when the pipeline must stop: mode initial_only,
// and this epoch's initial snapshot is checkpointed. Called with r.mu held.
func (r *snapRun) checkStop() {
	if r.m.opts.Mode != sources.SnapshotInitialOnly || r.stopped {
		return
	}
	if r.st.InitialEpoch == r.epoch && r.st.Current == nil && r.st.Last != nil && r.st.Last.Reason == "initial" {
		r.stopped = true
		r.cancel()
	}
}

func (r *snapRun) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Read implements sources.Source: the inner source's transactions with the
// watermarks taken out and the chunks put in at their high watermarks.
func (r *snapRun) Read(ctx context.Context) (*cdc.Txn, error) {
	if err := r.ended(); err != nil {
		return nil, err
	}
	t, err := r.Source.Read(r.readCtx(ctx))
	if err != nil {
		if ctx.Err() == nil {
			if eerr := r.ended(); eerr != nil {
				return nil, eerr
			}
		}
		return nil, err
	}
	return r.filter(ctx, t)
}

// readCtx returns a context done when ctx or r.abort is. It keeps the one
// it made for the last ctx: Read is called once per transaction, always with
// the pipeline run's context, and a context with an AfterFunc per call cost
// 0.6 µs and five allocations per transaction. The last one made ends when
// its parent or abort does (the run's end cancels abort).
func (r *snapRun) readCtx(ctx context.Context) context.Context {
	if r.rctx != nil && r.rparent == ctx {
		return r.rctx
	}
	if r.rctx != nil {
		r.rstop()
		r.rcancel()
	}
	r.rctx, r.rcancel = context.WithCancel(ctx)
	r.rstop = context.AfterFunc(r.abort, r.rcancel)
	r.rparent = ctx
	return r.rctx
}

// Buffered forwards the wrapped source's count of transactions Read
// returns without blocking (see buffered in pipeline.go), so a snapshotting
// run still hands transactions over in runs.
func (r *snapRun) Buffered() int {
	if b, ok := r.Source.(buffered); ok {
		return b.Buffered()
	}
	return 0
}

// ended returns the error that ends the run: a fatal snapshot error, or
// errSnapshotDone.
func (r *snapRun) ended() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal != nil {
		return r.fatal
	}
	if r.stopped {
		return errSnapshotDone
	}
	return nil
}

// filter handles one transaction.
func (r *snapRun) filter(ctx context.Context, t *cdc.Txn) (*cdc.Txn, error) {
	r.mu.Lock()
	p := r.pending
	r.mu.Unlock()
	wmAt := -1
	for i := range t.Changes {
		c := &t.Changes[i]
		if c.Op == cdc.OpMessage && c.Prefix == sources.SnapshotPrefix {
			wmAt = i
			continue
		}
		if p != nil && p.open {
			r.note(p, c)
		}
	}
	if wmAt < 0 {
		if p != nil && p.open && t.Rest != nil {
			t.Rest = &noteIter{ChangeIter: t.Rest, r: r, p: p}
		}
		return t, nil
	}
	// A watermark is a transaction of its own; it leaves the stream.
	wm := &cdc.Change{}
	*wm = t.Changes[wmAt]
	t.Changes = slices.Delete(t.Changes, wmAt, wmAt+1)
	kind, id, _ := strings.Cut(string(wm.Content), ":")
	if p == nil || id != p.id {
		return t, nil // another bridge's, or one of an earlier run: ignore
	}
	if kind == "low" {
		p.open = true
		return t, nil
	}
	// High watermark: the chunk's rows were read between the two.
	select {
	case <-p.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.mu.Lock()
	r.pending = nil
	r.mu.Unlock()
	defer close(p.emitted)
	if p.err != nil || p.chunk == nil || !p.open {
		p.retry = true // the worker reads the same range again
		return t, nil
	}
	ch := p.chunk
	limit := r.m.opts.ChunkSize
	e := emittedChunk{commit: t.CommitLSN, runID: strings.SplitN(p.id, ".", 2)[0], table: p.table, last: ch.Last,
		done: len(ch.Rows) < limit && !ch.Partial, retry: p.retry, started: p.started}
	p.done = e.done
	out := &cdc.Txn{CommitLSN: t.CommitLSN, CommitTime: time.Now().UTC()}
	if !p.retry {
		keyIdx := r.keyIndexes(ch.Rel, p.tbl.Key)
		for _, row := range ch.Rows {
			k, ok := keyString(row, keyIdx)
			if !ok || p.dropAll {
				continue
			}
			if _, changed := p.keys[k]; changed {
				continue
			}
			pos := rowPos(ch.Rel.Schema, ch.Rel.Table, k)
			if _, ok := r.held[pos]; ok {
				delete(r.held, pos)
				e.rows++ // in the stream already
				continue
			}
			c := cdc.Change{Source: wm.Source, Database: wm.Database, CommitLSN: t.CommitLSN, LSN: wm.LSN,
				CommitTime: out.CommitTime, Schema: ch.Rel.Schema, Table: ch.Rel.Table, Op: cdc.OpRead, Rel: ch.Rel, After: row}
			c.MsgID = r.producer + ".snap-" + e.runID + ":" + pos.LSN.Hex() + ":" + strconv.FormatUint(uint64(pos.Seq), 10)
			out.Changes = append(out.Changes, c)
		}
	}
	for i := range out.Changes {
		out.Changes[i].Seq = uint32(i)
		out.Changes[i].TxSize = uint32(len(out.Changes))
	}
	e.rows += int64(len(out.Changes))
	r.mu.Lock()
	r.emitted = append(r.emitted, e)
	r.mu.Unlock()
	r.m.emittedRows(ch.Rel.Schema+"."+ch.Rel.Table, e.rows, e.done)
	return out, nil
}

// note records the key of a change to the pending chunk's table.
func (r *snapRun) note(p *pendingChunk, c *cdc.Change) {
	if c.Schema != p.tbl.Schema || c.Table != p.tbl.Table {
		return
	}
	switch c.Op {
	case cdc.OpTruncate:
		p.dropAll = true
		return
	case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete:
	default:
		return
	}
	idx := r.keyIndexes(c.Rel, p.tbl.Key)
	seen := false
	for _, row := range [][]any{c.Before, c.After} {
		if row == nil {
			continue
		}
		if k, ok := keyString(row, idx); ok {
			p.keys[k] = struct{}{}
			seen = true
		}
	}
	if !seen {
		p.retry = true
	}
}

// keyIndexes returns the indexes of key's columns in rel (cached per
// relation); nil when one is missing.
func (r *snapRun) keyIndexes(rel *cdc.Relation, key []string) []int {
	if rel == nil {
		return nil
	}
	if idx, ok := r.keyIdx[rel]; ok {
		return idx
	}
	var idx []int
	for _, k := range key {
		j := slices.IndexFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == k })
		if j < 0 {
			idx = nil
			break
		}
		idx = append(idx, j)
	}
	r.keyIdx[rel] = idx
	return idx
}

// keyString is the canonical form of a row's key values; ok is false when
// the row does not carry them.
func keyString(row []any, idx []int) (string, bool) {
	if len(idx) == 0 {
		return "", false
	}
	var b strings.Builder
	for _, j := range idx {
		if j >= len(row) {
			return "", false
		}
		switch v := row[j].(type) {
		case nil, cdc.AbsentValue, cdc.UnchangedToast:
			return "", false
		case []byte:
			fmt.Fprintf(&b, "%x", v)
		case time.Time:
			b.WriteString(v.UTC().Format(time.RFC3339Nano))
		default:
			fmt.Fprint(&b, v)
		}
		b.WriteByte(0)
	}
	return b.String(), true
}

// rowPos is the position part of a read change's id ("<16 hex>:<decimal>"
// once formatted, so it parses as an id): 96 bits of SHA-256 of the table
// and key.
func rowPos(schema, table, key string) cdc.Pos {
	h := sha256.Sum256([]byte(schema + "\x00" + table + "\x00" + key))
	return cdc.Pos{LSN: cdc.LSN(binary.BigEndian.Uint64(h[:8])), Seq: binary.BigEndian.Uint32(h[8:12])}
}

// noteIter records keys of a large transaction's spilled changes as the
// pipeline reads them.
type noteIter struct {
	cdc.ChangeIter
	r *snapRun
	p *pendingChunk
}

func (it *noteIter) Next(dst []cdc.Change) (int, error) {
	n, err := it.ChangeIter.Next(dst)
	for i := range dst[:n] {
		it.r.note(it.p, &dst[i])
	}
	return n, err
}

// Idle implements sources.Idler for sources that do: a chunk takes the
// place (and commit LSN) of its high watermark's transaction, so the inner
// source's positions hold.
func (r *snapRun) Idle() (safe, after cdc.LSN, ok bool) {
	if i, ok := r.Source.(sources.Idler); ok {
		return i.Idle()
	}
	return 0, 0, false
}

// Ack implements sources.Source: once a chunk's position is checkpointed,
// its progress is saved.
func (r *snapRun) Ack(ctx context.Context, upTo cdc.LSN) error {
	if err := r.Source.Ack(ctx, upTo); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.st.Current
	n := 0
	for n < len(r.emitted) && r.emitted[n].commit <= upTo {
		n++
	}
	if n == 0 || cur == nil {
		r.emitted = r.emitted[n:]
		return nil
	}
	now := time.Now().UTC()
	for _, e := range r.emitted[:n] {
		if e.runID != cur.ID || e.table >= len(cur.Tables) {
			continue
		}
		t := &cur.Tables[e.table]
		t.Chunks++
		if t.Started == nil {
			at := e.started.UTC()
			t.Started = &at
		}
		if e.retry {
			continue
		}
		t.Rows += e.rows
		if e.last != nil {
			t.After = e.last
		}
		if e.done && !t.Done {
			t.Done, t.Finished = true, &now
		}
	}
	r.emitted = r.emitted[n:]
	all := true
	for _, t := range cur.Tables {
		all = all && t.Done
	}
	if all && cur.Resolved {
		cur.Finished = &now
		r.st.Last, r.st.Current = cur, nil
		var rows int64
		for _, t := range cur.Tables {
			rows += t.Rows
		}
		r.log.Info("snapshot complete", "snapshot", cur.ID, "reason", cur.Reason, "tables", len(cur.Tables), "rows", rows,
			"took", now.Sub(cur.Started).Round(time.Millisecond).String())
		r.resetCursors()
		r.signal()
	}
	if r.st.Current != nil {
		// The checkpoint just written covers every chunk counted now; the
		// others start after its cursors.
		from, err := r.m.ckptCursors(ctx)
		if err != nil {
			return err
		}
		r.st.Current.ScanFrom = from
	}
	rev, err := r.m.save(ctx, &r.st, r.rev)
	if err != nil {
		return err
	}
	r.rev = rev
	r.checkStop()
	return nil
}

// work reads chunks one at a time, each after the previous one reached the
// stream, and takes requests from the bucket.
func (r *snapRun) work(ctx context.Context) {
	poll := time.NewTicker(r.m.opts.Poll)
	defer poll.Stop()
	prog := time.NewTicker(r.m.opts.ProgressInterval)
	defer prog.Stop()
	fails := 0
	for ctx.Err() == nil {
		if err := r.takeRequests(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reading snapshot requests", "err", err)
		}
		select {
		case <-prog.C:
			r.m.logProgress(r.log)
		default:
		}
		ti, tbl, after, ok, err := r.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("snapshot step failed; retrying", "err", err)
			fails++
			if !sleepCtx(ctx, time.Duration(min(fails, 10))*time.Second) {
				return
			}
			continue
		}
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
			case <-r.wake:
			case <-prog.C:
				r.m.logProgress(r.log)
			}
			continue
		}
		if err := r.readChunk(ctx, ti, tbl, after); err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			r.log.Warn("reading a snapshot chunk failed; retrying", "table", tbl.Name(), "err", err, "attempt", fails)
			if !sleepCtx(ctx, time.Duration(min(fails, 10))*time.Second) {
				return
			}
			continue
		}
		fails = 0
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// next returns the next chunk to read: the table index and where to start.
// It starts queued snapshots and resolves their tables. ok is false when
// there is nothing to read now.
func (r *snapRun) next(ctx context.Context) (int, sources.SnapshotTable, []string, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.st.Current == nil && len(r.st.Queue) > 0 {
		q := r.st.Queue[0]
		r.st.Queue = r.st.Queue[1:]
		r.st.Current = newRun(q.ID, q.Reason, r.epoch, q.Tables)
		rev, err := r.m.save(ctx, &r.st, r.rev)
		if err != nil {
			return 0, sources.SnapshotTable{}, nil, false, err
		}
		r.rev = rev
		r.resetCursors()
	}
	cur := r.st.Current
	if cur == nil {
		return 0, sources.SnapshotTable{}, nil, false, nil
	}
	if !cur.Resolved {
		// Resolving may count rows: not under the lock Ack needs.
		r.mu.Unlock()
		tables, err := r.sn.SnapshotTables(ctx, cur.Request)
		r.mu.Lock()
		if r.st.Current != cur {
			return 0, sources.SnapshotTable{}, nil, false, nil // replaced meanwhile; look again
		}
		if err != nil {
			if ctx.Err() != nil {
				return 0, sources.SnapshotTable{}, nil, false, err
			}
			if cur.Reason == "initial" && sources.IsSetup(err) {
				// The initial snapshot cannot be taken: stop with the fix.
				r.fatal = fmt.Errorf("initial snapshot: %w", err)
				r.cancel()
				return 0, sources.SnapshotTable{}, nil, false, nil
			}
			if sources.IsSetup(err) {
				now := time.Now().UTC()
				cur.Error, cur.Finished = err.Error(), &now
				r.st.Last, r.st.Current = cur, nil
				r.log.Error("snapshot request refused", "snapshot", cur.ID, "tables", cur.Request, "err", err)
				rev, serr := r.m.save(ctx, &r.st, r.rev)
				if serr != nil {
					return 0, sources.SnapshotTable{}, nil, false, serr
				}
				r.rev = rev
				r.resetCursors()
				return 0, sources.SnapshotTable{}, nil, false, nil
			}
			return 0, sources.SnapshotTable{}, nil, false, err
		}
		cur.Tables = cur.Tables[:0]
		for _, t := range tables {
			cur.Tables = append(cur.Tables, SnapTable{Table: t.Name(), Key: t.Key, Estimate: t.Estimate})
		}
		cur.Resolved = true
		// No chunk of this snapshot is in the stream yet: its rows all
		// come after the checkpoint's cursors.
		if cur.ScanFrom, err = r.m.ckptCursors(ctx); err != nil {
			return 0, sources.SnapshotTable{}, nil, false, err
		}
		if len(tables) == 0 {
			now := time.Now().UTC()
			cur.Finished = &now
			r.st.Last, r.st.Current = cur, nil
		}
		rev, err := r.m.save(ctx, &r.st, r.rev)
		if err != nil {
			return 0, sources.SnapshotTable{}, nil, false, err
		}
		r.rev = rev
		r.resetCursors()
		r.checkStop()
		names := make([]string, len(tables))
		for i, t := range tables {
			names[i] = t.Name()
		}
		r.log.Info("snapshot started", "snapshot", cur.ID, "reason", cur.Reason, "tables", names, "chunk_size", r.m.opts.ChunkSize)
		if r.st.Current == nil {
			return 0, sources.SnapshotTable{}, nil, false, nil
		}
	}
	for i := range cur.Tables {
		if !r.memDone[i] {
			return i, cur.Tables[i].source(), *r.cursor[i], true, nil
		}
	}
	return 0, sources.SnapshotTable{}, nil, false, nil
}

// readChunk reads one chunk and waits until the reader put it into the
// stream (or dropped it).
func (r *snapRun) readChunk(ctx context.Context, ti int, tbl sources.SnapshotTable, after []string) error {
	r.mu.Lock()
	runID := r.st.Current.ID
	r.mu.Unlock()
	p := &pendingChunk{id: runID + "." + checkpoint.NewEpoch(), table: ti, tbl: tbl, keys: map[string]struct{}{},
		ready: make(chan struct{}), emitted: make(chan struct{}), started: time.Now()}
	r.mu.Lock()
	r.pending = p
	r.mu.Unlock()
	r.m.chunkRead(tbl.Name(), tbl.Estimate, after)
	ch, err := r.sn.ReadChunk(ctx, tbl, after, r.m.opts.ChunkSize, p.id)
	p.chunk, p.err = ch, err
	close(p.ready)
	if err != nil {
		r.mu.Lock()
		if r.pending == p {
			r.pending = nil
		}
		r.mu.Unlock()
		return err
	}
	select {
	case <-p.emitted:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.retry || p.chunk == nil {
		return nil // same range again
	}
	r.mu.Lock()
	if len(ch.Last) > 0 {
		*r.cursor[ti] = ch.Last
	}
	if p.done {
		r.memDone[ti] = true
	}
	r.mu.Unlock()
	return nil
}

// takeRequests moves `bridge snapshot` requests from the bucket into the
// queue.
func (r *snapRun) takeRequests(ctx context.Context) error {
	prefix := checkpoint.Key(r.m.bridge, r.m.source) + ".snapreq."
	lister, err := r.m.kv.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	_ = lister.Stop()
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	for _, k := range keys {
		e, err := r.m.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		var req SnapshotRequest
		if err := json.Unmarshal(e.Value(), &req); err != nil || req.ID == "" {
			r.log.Warn("ignoring an unreadable snapshot request", "key", k, "err", err)
			_ = r.m.kv.Delete(ctx, k, jetstream.LastRevision(e.Revision()))
			continue
		}
		r.mu.Lock()
		if !slices.Contains(r.st.Handled, req.ID) {
			req.Reason = "request"
			r.st.Queue = append(r.st.Queue, req)
			r.st.Handled = append(r.st.Handled, req.ID)
			if len(r.st.Handled) > 50 {
				r.st.Handled = r.st.Handled[len(r.st.Handled)-50:]
			}
			rev, err := r.m.save(ctx, &r.st, r.rev)
			if err != nil {
				r.mu.Unlock()
				return err
			}
			r.rev = rev
			r.log.Info("snapshot requested", "snapshot", req.ID, "tables", req.Tables)
		}
		r.mu.Unlock()
		if err := r.m.kv.Delete(ctx, k, jetstream.LastRevision(e.Revision())); err != nil {
			return err
		}
	}
	return nil
}

// Live figures.

func (m *snapMgr) setLive(run *SnapshotRun) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if run == nil {
		m.runID = "" // keep the last figures
		return
	}
	m.live = map[string]*snapLive{}
	m.done, m.total = 0, 0
	m.runID, m.total = run.ID, len(run.Tables)
	for _, t := range run.Tables {
		l := &snapLive{rows: t.Rows, estimate: t.Estimate}
		if t.Done {
			m.done++
			l.finished = time.Now()
		}
		m.live[t.Table] = l
	}
}

func (m *snapMgr) chunkRead(table string, estimate int64, after []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[table]
	if l == nil {
		l = &snapLive{estimate: estimate}
		m.live[table] = l
	}
	if l.started.IsZero() {
		l.started = time.Now()
	}
	l.chunkReads++
	m.log.Debug("snapshot chunk read", "table", table, "after", strings.Join(after, ","))
}

func (m *snapMgr) emittedRows(table string, rows int64, done bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[table]
	if l == nil {
		return
	}
	l.rows += rows
	if done && l.finished.IsZero() {
		l.finished = time.Now()
		m.done++
		el := l.finished.Sub(l.started)
		m.log.Info("snapshot table read", "table", table, "rows", l.rows, "took", el.Round(time.Millisecond).String(),
			"rows_per_s", math.Round(rate(l.rows, el)))
	}
}

func rate(rows int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(rows) / d.Seconds()
}

// snapFigures is one table's live progress.
type snapFigures struct {
	Table          string
	Rows, Estimate int64
	PerSecond      float64
	ETA            time.Duration // -1 when unknown
	Done           bool
	ChunkReads     int64
}

func (m *snapMgr) figures() (running bool, out []snapFigures) {
	if m == nil {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, l := range m.live {
		f := snapFigures{Table: name, Rows: l.rows, Estimate: l.estimate, Done: !l.finished.IsZero(), ETA: -1, ChunkReads: l.chunkReads}
		if !l.started.IsZero() {
			end := time.Now()
			if f.Done {
				end = l.finished
			}
			f.PerSecond = rate(l.rows, end.Sub(l.started))
			if f.Done {
				f.ETA = 0
			} else if f.PerSecond > 0 && l.estimate > l.rows {
				f.ETA = time.Duration(float64(l.estimate-l.rows) / f.PerSecond * float64(time.Second))
			}
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b snapFigures) int { return strings.Compare(a.Table, b.Table) })
	return m.runID != "", out
}

func (m *snapMgr) logProgress(log *slog.Logger) {
	running, figs := m.figures()
	if !running {
		return
	}
	for _, f := range figs {
		if f.Done || f.ChunkReads == 0 {
			continue
		}
		eta := "unknown"
		if f.ETA >= 0 {
			eta = f.ETA.Round(time.Second).String()
		}
		log.Info("snapshot progress", "table", f.Table, "rows", f.Rows, "estimate", f.Estimate,
			"rows_per_s", math.Round(f.PerSecond), "eta", eta)
	}
}

// newSnapMgr returns the snapshot runtime of source name, or nil when the
// source cannot snapshot.
func (a *App) newSnapMgr(ctx context.Context, js jetstream.JetStream, name string, log *slog.Logger) (*snapMgr, error) {
	src, err := a.newSource(name)
	if err != nil {
		return nil, err
	}
	sn, ok := src.(sources.Snapshotter)
	if !ok {
		return nil, nil
	}
	kv, err := js.KeyValue(ctx, a.cfg.Checkpoint.Bucket)
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint bucket %q for snapshots: %w", a.cfg.Checkpoint.Bucket, err)
	}
	m := &snapMgr{bridge: a.cfg.Name, source: name, kv: kv, opts: sn.SnapshotOptions(), log: log, live: map[string]*snapLive{}}
	if m.opts.ChunkSize <= 0 {
		m.opts.ChunkSize = 10000
	}
	if m.opts.Poll <= 0 {
		m.opts.Poll = time.Second
	}
	if m.opts.ProgressInterval <= 0 {
		m.opts.ProgressInterval = 10 * time.Second
	}
	if a.snapCol == nil {
		a.snapCol = &snapCollector{}
		a.metrics.reg.MustRegister(a.snapCol)
	}
	a.snapCol.add(m)
	return m, nil
}
