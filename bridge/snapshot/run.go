package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources"
)

// A pipeline run's snapshot work: the source wrapper that notes the keys
// changed between watermarks and emits the chunk's other rows.

// snapRun is one pipeline run's snapshot work: the source wrapper that the
// pipeline reads from, and the worker that reads chunks.
type snapRun struct {
	sources.Source
	m        *Manager
	sn       sources.Snapshotter
	producer string
	epoch    string
	log      *slog.Logger

	mu      sync.Mutex
	st      State
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

	// The resume scan's bound (see Checkpointed): cursors of the run's
	// last checkpoint, and the tables whose rows an earlier run put into
	// the stream past their After (index: Sent when the run started).
	// While debt is not empty, ScanFrom stays where it is.
	cursors map[string]string
	debt    map[int][]string
	until   map[int][]string // debt's tables the worker has not read up to Sent yet
	pinAll  bool             // a snapshot without Tracked: ScanFrom stays until it completes
}

// HeldFunc is called once per run, before the run's first Read, when a
// snapshot is under way: it reads which messages of producer (the
// snapshot's) the sinks hold after the cursors from (by sink name; a sink
// without one from its beginning), so that the run does not send them
// again (the pipeline leaves them out per sink, see Held).
type HeldFunc func(ctx context.Context, producer string, from map[string]string) error

// Held is a sink's set of a running snapshot's reads that it holds
// already, by their positions (cdc.ParseID of the read's id, destination
// included). The writer of a run leaves out the reads it finds in it.
type Held map[cdc.Pos]struct{}

// Take reports whether h holds c, a read change (Change.MsgID set), and
// forgets it: a row is read at most once per run.
func (h Held) Take(c *cdc.Change) bool {
	if len(h) == 0 || c.MsgID == "" {
		return false
	}
	_, pos, err := cdc.ParseID(c.ID())
	if err != nil {
		return false
	}
	if _, ok := h[pos]; !ok {
		return false
	}
	delete(h, pos)
	return true
}

// Checkpointer is implemented by the source Wrap returns: the pipeline
// calls Checkpointed after each checkpoint it saves, from one goroutine.
type Checkpointer interface {
	// Checkpointed tells that the checkpoint at lsn, with the sinks'
	// cursors, is saved: the chunks whose high watermark is at or before
	// lsn count as done, and their progress is saved. An error ends the
	// run (checkpoint.ErrFenced: another instance owns the source).
	Checkpointed(ctx context.Context, lsn cdc.LSN, cursors map[string]string) error
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
	// Set by the worker before ready is closed:
	chunk   *sources.Chunk
	err     error
	last    []string // where the next chunk starts: the last row's key, or tbl.Until once reached
	done    bool     // the chunk ended its table
	emitted chan struct{}
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

// Wrap returns the source a pipeline run reads from and a stop function
// that ends the worker; src itself when snapshots are off for it. cursors
// are the sinks' cursors of the checkpoint the run starts from; held, when
// not nil, learns which reads of a snapshot under way the sinks hold. The
// source returned implements Checkpointer.
func (m *Manager) Wrap(ctx context.Context, src sources.Source, producer, epoch string, cursors map[string]string, held HeldFunc) (sources.Source, func(), error) {
	sn, ok := src.(sources.Snapshotter)
	if m == nil || !ok {
		return src, func() {}, nil
	}
	r := &snapRun{Source: src, m: m, sn: sn, producer: producer, epoch: epoch, log: m.log,
		wake: make(chan struct{}, 1), keyIdx: map[*cdc.Relation][]int{}, cursors: cursors}
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
	r.resetCursors()
	if c := r.st.Current; c != nil && c.Resolved {
		for i := range r.debt {
			r.log.Info("snapshot resumes: the rows an earlier run sent are read again first", "snapshot", c.ID, "table", c.Tables[i].Table,
				"chunks_counted", c.Tables[i].Chunks, "scan_from", c.ScanFrom)
		}
		if r.pinAll {
			r.log.Info("snapshot resumes: begun by an earlier version, its resume scan stays where it is until it completes", "snapshot", c.ID)
		}
		if held != nil {
			// Rows of chunks read again after a crash that a sink already
			// holds are not sent to it again, even past the duplicate window.
			if err := held(ctx, producer+".snap-"+c.ID, c.ScanFrom); err != nil {
				return nil, nil, fmt.Errorf("reading which rows of snapshot %s the sinks hold: %w", c.ID, err)
			}
		}
	}
	r.checkStop()
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.work(wctx)
	}()
	return r, func() { cancel(); <-done; r.cancel() }, nil
}

// resetCursors starts the in-memory cursors at the durable progress, and
// notes the tables whose rows an earlier run sent past After (debt).
// Called with r.mu held (or before the worker starts).
func (r *snapRun) resetCursors() {
	r.cursor, r.memDone, r.debt, r.until, r.pinAll = nil, nil, map[int][]string{}, map[int][]string{}, false
	if c := r.st.Current; c != nil {
		r.pinAll = c.Resolved && !c.Tracked
		for i, t := range c.Tables {
			a := slices.Clone(t.After)
			r.cursor = append(r.cursor, &a)
			r.memDone = append(r.memDone, t.Done)
			if !t.Done && t.Sent != nil && !slices.Equal(t.Sent, t.After) {
				r.debt[i], r.until[i] = t.Sent, t.Sent
			}
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
// returns without blocking (sources.Buffered), so a snapshotting
// run still hands transactions over in runs.
func (r *snapRun) Buffered() int {
	if b, ok := r.Source.(sources.Buffered); ok {
		return b.Buffered()
	}
	return 0
}

// ended returns the error that ends the run: a fatal snapshot error, or
// ErrDone.
func (r *snapRun) ended() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal != nil {
		return r.fatal
	}
	if r.stopped {
		return ErrDone
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
	e := emittedChunk{commit: t.CommitLSN, runID: strings.SplitN(p.id, ".", 2)[0], table: p.table, last: p.last,
		done: p.done, retry: p.retry, started: p.started}
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
	// Which run sent which chunk, so that a resumed snapshot's log explains
	// itself; keys are not logged (they may be data).
	r.log.Debug("snapshot chunk sent", "snapshot", e.runID, "chunk", p.id, "table", p.tbl.Name(), "rows", len(out.Changes),
		"read_rows", len(ch.Rows), "high_watermark", t.CommitLSN.String(), "bounded", p.tbl.Until != nil, "done", e.done, "retry", p.retry)
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

// NextPart implements cdc.PartIter, with the inner iterator's parts when it
// has them, else in new slices.
func (it *noteIter) NextPart() ([]cdc.Change, error) {
	p, err := cdc.TakePart(it.ChangeIter, 256)
	for i := range p {
		it.r.note(it.p, &p[i])
	}
	return p, err
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

// Ack implements sources.Source. Snapshot progress follows the
// checkpoint (Checkpointed), not the slot's confirmation, which
// checkpoint.confirm_delay may hold back.
func (r *snapRun) Ack(ctx context.Context, upTo cdc.LSN) error { return r.Source.Ack(ctx, upTo) }

// Checkpointed implements Checkpointer: the chunks whose high watermark the
// checkpoint covers count as done (their rows are in every sink), and the
// progress is saved.
//
// ScanFrom must stay at or before every stored copy of a read whose key is
// past its table's After, for a later run reads those keys again. After
// this count, the copies before cursors are this run's counted chunks
// (the writer stores in commit order: a chunk past lsn comes after
// cursors) and the chunks of earlier runs, whose keys go up to the Sent
// they left. So ScanFrom moves to cursors only once this run has counted
// its way to that Sent in every such table (debt), and never for a
// snapshot begun by a version that did not record Sent.
func (r *snapRun) Checkpointed(ctx context.Context, lsn cdc.LSN, cursors map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cursors = cursors
	cur := r.st.Current
	n := 0
	for n < len(r.emitted) && r.emitted[n].commit <= lsn {
		n++
	}
	if n == 0 || cur == nil {
		r.emitted = r.emitted[n:]
		return nil
	}
	now := time.Now().UTC()
	counted := 0
	for _, e := range r.emitted[:n] {
		if e.runID != cur.ID || e.table >= len(cur.Tables) {
			continue
		}
		counted++
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
	if counted == 0 {
		return nil
	}
	for i, sent := range r.debt {
		if t := cur.Tables[i]; t.Done || slices.Equal(t.After, sent) {
			delete(r.debt, i)
			r.log.Info("snapshot: the rows an earlier run sent are read again and counted", "snapshot", cur.ID, "table", t.Table)
		}
	}
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
	} else if len(r.debt) == 0 && !r.pinAll {
		cur.ScanFrom = maps.Clone(cursors)
		if cur.ScanFrom == nil {
			cur.ScanFrom = map[string]string{}
		}
	}
	rev, err := r.m.save(ctx, &r.st, r.rev)
	if err != nil {
		return err
	}
	r.rev = rev
	r.log.Debug("snapshot chunks counted", "snapshot", cur.ID, "chunks", counted, "checkpoint", lsn.String(), "scan_from", cur.ScanFrom)
	r.checkStop()
	return nil
}
