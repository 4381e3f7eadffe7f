package natskv

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sinks"
)

// TRUNCATE. A table's rows all live under "<table key>.>", so one
// subject-filtered purge of the bucket's stream removes them, tombstones
// included. That leaves nothing for the guard to compare a replayed
// change with, so the table's own key (TableKey, never a row's) records
// the truncate, in two steps: "started" before the purge, "done" after.
// A change of the table at or before the recorded position is skipped
// (the truncate wiped it), a replayed truncate finding "done" at its own
// position is skipped, and one finding "started" purges again: nothing of
// the table after it can have been written yet, since Write goes on only
// once the truncate is done.

// Values of HeaderTruncate.
const (
	truncateStarted = "started"
	truncateDone    = "done"
)

// truncate applies the TRUNCATE batch[i] and reports whether it is in effect.
func (w *write) truncate(i int) bool {
	s, c := w.s, &w.batch[i]
	table := TableKey(s.cfg.KeyPrefix, c.Schema, c.Table)
	fail := func(doing string, err error) bool {
		s.cache.forgetTable(table)
		w.err.Fail(i, s.connErr(w.nc, fmt.Sprintf("truncating %s.%s (%s) in bucket %q: %s", c.Schema, c.Table, c.ID(), s.cfg.Bucket, doing), err))
		return false
	}
	mark, ok := s.cache.marks[table]
	if !ok {
		got, err := s.lookup(w.ctx, w.nc, []string{table})
		if err != nil {
			return fail("reading the table's key", err)
		}
		mark = got[table]
	}
	if mark.covers(c.Producer, at(c)) && (mark.done || mark.pos != at(c)) {
		s.cache.setMark(table, mark)
		return true // done already, or a later truncate supersedes it
	}
	seq := mark.seq
	if !mark.covers(c.Producer, at(c)) { // not started yet
		var err error
		if seq, err = w.putMark(table, c, truncateStarted, seq); err != nil {
			return fail("recording the truncate's start", err)
		}
	}
	filter := s.cfg.subject(table) + ".>"
	ctx, cancel := context.WithTimeout(w.ctx, s.cfg.AckTimeout)
	err := w.kv.Purge(ctx, jetstream.WithPurgeSubject(filter))
	cancel()
	if err != nil {
		if !w.nc.IsConnected() || isConnErr(err) {
			return fail(fmt.Sprintf("purging %s", filter), fmt.Errorf("%w: %w", sinks.ErrNotConnected, err))
		}
		return fail(fmt.Sprintf("purging %s (the bucket's stream must allow purges: create_bucket: true fixes it)", filter), err)
	}
	if seq, err = w.putMark(table, c, truncateDone, seq); err != nil {
		return fail("recording the truncate's end", err)
	}
	s.cache.forgetTable(table)
	s.cache.setMark(table, held{seq: seq, producer: c.Producer, pos: at(c), done: true})
	return true
}

// putMark writes the table's own key: c's payload and headers, with
// HeaderTruncate state, expecting the key's last sequence to be last.
func (w *write) putMark(table string, c *cdc.Change, state string, last uint64) (uint64, error) {
	m := w.s.msg(table, c)
	m.Header[HeaderTruncate] = []string{state}
	m.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(last, 10)}
	ctx, cancel := context.WithTimeout(w.ctx, w.s.cfg.AckTimeout)
	defer cancel()
	ack, err := w.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}
