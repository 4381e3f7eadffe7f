package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/sources"
)

// The worker that takes requests and reads chunks between watermarks.

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
		r.st.Current.Where = q.Where
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
		if err == nil && cur.Where != "" {
			err = checkWhere(ctx, r.sn, tables, cur.Where)
		}
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
			cur.Tables = append(cur.Tables, Table{Table: t.Name(), Key: t.Key, Estimate: t.Estimate})
		}
		cur.Resolved, cur.Tracked = true, true
		// No chunk of this snapshot is in the stream yet: its rows all
		// come after the cursors of the run's last checkpoint.
		cur.ScanFrom = maps.Clone(r.cursors)
		if cur.ScanFrom == nil {
			cur.ScanFrom = map[string]string{}
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
			t := cur.Tables[i].source()
			if cur.Where != "" {
				var err error
				if t.Where, err = sources.ParseWhere(cur.Where); err != nil {
					return 0, sources.SnapshotTable{}, nil, false, err // checked when resolved: not here
				}
			}
			if sent, ok := r.until[i]; ok {
				// An earlier run sent rows up to sent: read them again in
				// chunks that end there, so the cursor reaches it exactly.
				t.Until = sent
			}
			return i, t, *r.cursor[i], true, nil
		}
	}
	return 0, sources.SnapshotTable{}, nil, false, nil
}

// checkWhere checks a snapshot's where against each of its tables. Its
// problems are setup errors: the request is refused.
func checkWhere(ctx context.Context, sn sources.Snapshotter, tables []sources.SnapshotTable, where string) error {
	conds, err := sources.ParseWhere(where)
	if err != nil {
		return &sources.SetupError{What: err.Error(), Fix: "write the where as conditions joined with AND: column = 'text', column > 10, column IN (1, 2), column IS NULL (docs/snapshots.md)"}
	}
	wc, ok := sn.(sources.WhereChecker)
	if !ok {
		return &sources.SetupError{What: "this source cannot read a snapshot with a where", Fix: "snapshot without --where"}
	}
	for _, t := range tables {
		t.Where = conds
		if err := wc.CheckWhere(ctx, t); err != nil {
			return err
		}
	}
	return nil
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
	r.m.chunkRead(tbl.Name(), tbl.Estimate, p.id, after == nil)
	limit := r.m.opts.ChunkSize
	ch, err := r.sn.ReadChunk(ctx, tbl, after, limit, p.id)
	if err == nil {
		full := len(ch.Rows) >= limit || ch.Partial
		p.last, p.done = ch.Last, !full
		if tbl.Until != nil {
			p.done = false // the table goes on past Until
			if !full {
				p.last = tbl.Until
			}
		} else if ch.Last != nil {
			// Before the chunk can reach the stream: no stored read of
			// the table will have a key past Sent (see Checkpointed).
			err = r.recordSent(ctx, runID, ti, ch.Last)
		}
	}
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
	defer r.mu.Unlock()
	if r.st.Current == nil || r.st.Current.ID != runID || ti >= len(r.cursor) {
		return nil // counted to its end meanwhile: the cursors are another snapshot's
	}
	if len(p.last) > 0 {
		*r.cursor[ti] = p.last
	}
	if tbl.Until != nil && slices.Equal(p.last, tbl.Until) {
		delete(r.until, ti) // read up to the earlier runs' Sent: on from there
	}
	if p.done {
		r.memDone[ti] = true
	}
	return nil
}

// recordSent saves last as table ti's Sent in snapshot runID, when it is
// still the current one.
func (r *snapRun) recordSent(ctx context.Context, runID string, ti int, last []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.st.Current
	if cur == nil || cur.ID != runID || ti >= len(cur.Tables) {
		return fmt.Errorf("snapshot %s is no longer the current one", runID)
	}
	// Kept in memory even when the save fails: a Sent past what was sent
	// only makes a later run read a few rows again.
	cur.Tables[ti].Sent = slices.Clone(last)
	rev, err := r.m.save(ctx, &r.st, r.rev)
	if err != nil {
		return fmt.Errorf("recording the chunk of %s about to be sent: %w", cur.Tables[ti].Table, err)
	}
	r.rev = rev
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
		var req Request
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
