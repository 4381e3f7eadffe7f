package natskv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

// maxInFlight is the most writes awaiting their acks at once.
const maxInFlight = 4096

// casRounds is how often Write reads a key again and retries after the
// server refused a write because the key changed since it was read.
const casRounds = 3

// errNotWritten marks changes a Write did not get to: an earlier
// TRUNCATE of the batch, or the rows before it, failed.
var errNotWritten = errors.New("natskv: not written: an earlier change of the batch failed")

// op is one write of a Write: a key's last change in a run of row changes.
type op struct {
	key, table string
	c          *cdc.Change // the last change to the key; its payload and headers are the value
	del        bool        // it deletes the row: a delete, or an update that moved the row to another key
	deps       []int       // indexes of the batch whose effect it carries
}

// write is the state of one Write.
type write struct {
	s     *Sink
	ctx   context.Context
	nc    *nats.Conn
	js    jetstream.JetStream
	kv    jetstream.Stream
	batch []cdc.Change
	err   sinks.BatchError
}

// Write applies the batch to the bucket in order. Each run of row changes
// between TRUNCATEs becomes one write per key, of the key's last change
// in the run (so the bucket keeps the latest state, not every change),
// guarded as guard.go explains: a key that holds this change or a later
// one of its producer is left alone. A TRUNCATE purges its table's keys
// (truncate.go). Logical decoding messages and control messages are not
// rows: they are delivered as nothing.
//
// nil means every change is in effect. A *sinks.BatchError lists the
// changes that may not be: every change whose key's write failed (with the
// key's earlier changes in the batch), and everything after a failed
// TRUNCATE or a run that had a failure. Per-change errors wrap
// sinks.ErrNotConnected when the connection is down, and are
// sinks.Permanent for a row the sink cannot key (a table without a primary
// key or replica identity index, a null key value) or a value larger than
// the server takes. A Write on a closed sink fails with a Permanent error,
// one before Connect with ErrNotConnected.
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	if len(batch) == 0 {
		return nil
	}
	s.mu.Lock()
	nc, js, kv, closed, reset := s.nc, s.js, s.kv, s.closed, s.reset
	s.reset = false
	s.mu.Unlock()
	switch {
	case closed:
		return sinks.Permanent(fmt.Errorf("writing %d changes to bucket %q: %w", len(batch), s.cfg.Bucket, errClosed))
	case js == nil || kv == nil || !nc.IsConnected():
		return fmt.Errorf("writing %d changes to bucket %q: %w", len(batch), s.cfg.Bucket, sinks.ErrNotConnected)
	case ctx.Err() != nil:
		return fmt.Errorf("writing %d changes to bucket %q: %w", len(batch), s.cfg.Bucket, ctx.Err())
	}
	if reset {
		s.cache.clear()
	}
	w := &write{s: s, ctx: ctx, nc: nc, js: js, kv: kv, batch: batch}
	for from := 0; from < len(batch); {
		end := from
		for end < len(batch) && batch[end].Op != cdc.OpTruncate {
			end++
		}
		if !w.rows(from, end) {
			w.failFrom(end)
			break
		}
		if end == len(batch) {
			break
		}
		if !w.truncate(end) {
			w.failFrom(end + 1)
			break
		}
		from = end + 1
	}
	return w.err.Err()
}

// failFrom fails every change from index i on.
func (w *write) failFrom(i int) {
	for ; i < len(w.batch); i++ {
		if w.err.Failed[i] == nil {
			w.err.Fail(i, fmt.Errorf("%s: %w", w.batch[i].ID(), errNotWritten))
		}
	}
}

// rows writes batch[from:end], changes other than TRUNCATE, and reports
// whether all of them are in effect.
func (w *write) rows(from, end int) bool {
	ops := w.plan(from, end)
	for round := 0; len(ops) > 0; round++ {
		retry, err := w.apply(ops, round+1 < casRounds)
		if err != nil {
			for _, o := range ops {
				w.failOp(o, err)
			}
			break
		}
		ops = retry
	}
	for i := from; i < end; i++ {
		if w.err.Failed[i] != nil {
			return false
		}
	}
	return true
}

// plan turns batch[from:end] into one op per key, in the order keys first
// appear; a change the sink cannot key fails for good.
func (w *write) plan(from, end int) []*op {
	var ops []*op
	byKey := map[string]*op{}
	add := func(key, table string, c *cdc.Change, i int, del bool) {
		if o := byKey[key]; o != nil {
			o.c, o.del, o.deps = c, del, append(o.deps, i)
			return
		}
		o := &op{key: key, table: table, c: c, del: del, deps: []int{i}}
		byKey[key] = o
		ops = append(ops, o)
	}
	for i := from; i < end; i++ {
		c := &w.batch[i]
		switch c.Op {
		case cdc.OpInsert, cdc.OpUpdate, cdc.OpRead, cdc.OpDelete:
		default:
			continue // a logical message or a control message: no row
		}
		if c.Tombstone() {
			// A Debezium tombstone repeats its delete for Kafka's
			// compaction: the delete's marker already ended the row (with
			// the delete's payload, which the tombstone's empty one would
			// replace in the same Write).
			continue
		}
		keyErr := func(err error) {
			fix := "route the table to another sink, or give it a primary key"
			if errors.Is(err, errNoKey) {
				fix = fmt.Sprintf("give it one (ALTER TABLE %s.%s ADD PRIMARY KEY (...), or REPLICA IDENTITY USING INDEX) or route the table to another sink", c.Schema, c.Table)
			}
			w.err.Fail(i, sinks.Permanent(fmt.Errorf("nats_kv sink %q cannot key the %s of %s.%s at %s (%s): %w; %s",
				w.s.name, c.Op, c.Schema, c.Table, c.CommitLSN, c.ID(), err, fix)))
		}
		if c.Rel == nil {
			keyErr(errNoKey)
			continue
		}
		table := TableKey(w.s.cfg.KeyPrefix, c.Schema, c.Table)
		if c.Op == cdc.OpDelete {
			vals, ok, err := rowValues(c.Rel, c.Before, nil)
			if err == nil && !ok {
				err = errors.New("the old row does not carry the key")
			}
			if err != nil {
				keyErr(err)
				continue
			}
			add(RowKey(w.s.cfg.KeyPrefix, c.Schema, c.Table, vals...), table, c, i, true)
			continue
		}
		vals, ok, err := rowValues(c.Rel, c.After, c.Before)
		if err == nil && !ok {
			err = errors.New("the new row does not carry the key")
		}
		if err != nil {
			keyErr(err)
			continue
		}
		key := RowKey(w.s.cfg.KeyPrefix, c.Schema, c.Table, vals...)
		if c.Op == cdc.OpUpdate && c.Before != nil {
			if old, ok, err := rowValues(c.Rel, c.Before, nil); err == nil && ok {
				if oldKey := RowKey(w.s.cfg.KeyPrefix, c.Schema, c.Table, old...); oldKey != key {
					add(oldKey, table, c, i, true) // the key changed: the row leaves its old key
				}
			}
		}
		add(key, table, c, i, false)
		w.s.noteToast(c)
	}
	return ops
}

// noteToast logs, once per table, that a value lacks unchanged TOAST columns.
func (s *Sink) noteToast(c *cdc.Change) {
	if c.Op != cdc.OpUpdate || !slices.Contains(c.After, any(cdc.Unchanged)) {
		return
	}
	t := c.Schema + "." + c.Table
	if s.toastWarned[t] {
		return
	}
	s.toastWarned[t] = true
	s.log.Warn("an update left large (TOASTed) column values unchanged, so Postgres did not send them: the row's value in the bucket lacks them until they change",
		"table", t, "change", c.ID(), "bucket", s.cfg.Bucket)
}

// apply reads what the ops' keys and tables hold where it does not know,
// skips the ops the guard covers, writes the others, and waits for their
// acks. It returns the ops the server refused because their key changed
// since it was read, when retry is set (their keys forgotten, to be read
// again); an error that fails them all. Other failures are recorded.
func (w *write) apply(ops []*op, retry bool) ([]*op, error) {
	s := w.s
	if err := w.learn(ops); err != nil {
		return nil, err
	}
	type pending struct {
		o   *op
		f   jetstream.PubAckFuture
		err error
	}
	var sent []pending
	var again []*op
	wait := func() {
		for _, p := range sent {
			if p.err == nil {
				select {
				case ack := <-p.f.Ok():
					s.cache.setRow(p.o.table, p.o.key, held{seq: ack.Sequence, producer: p.o.c.Producer, pos: at(p.o.c)})
					continue
				case p.err = <-p.f.Err():
				case <-w.ctx.Done():
					p.err = w.ctx.Err()
				}
			}
			s.cache.forgetRow(p.o.table, p.o.key) // unknown now
			if retry && wrongLast(p.err) {
				again = append(again, p.o)
				continue
			}
			w.failOp(p.o, w.pubErr(p.o, p.err))
		}
		sent = sent[:0]
	}
	for _, o := range ops {
		if mark, ok := s.cache.marks[o.table]; ok && mark.covers(o.c.Producer, at(o.c)) {
			continue // the table was truncated at or after this change
		}
		h, _ := s.cache.row(o.table, o.key)
		if h.covers(o.c.Producer, at(o.c)) {
			continue // the key holds this change or a later one
		}
		m := s.msg(o.key, o.c)
		if o.del {
			if s.cfg.Delete == DeletePurge {
				m.Header[kvOperation] = []string{kvPurge}
				m.Header[jetstream.MsgRollup] = []string{jetstream.MsgRollupSubject}
			} else {
				m.Header[kvOperation] = []string{kvDelete}
			}
		}
		m.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(h.seq, 10)}
		if len(sent) >= maxInFlight {
			wait()
		}
		f, err := w.js.PublishMsgAsync(m)
		sent = append(sent, pending{o: o, f: f, err: err})
	}
	wait()
	return again, nil
}

// learn reads what the bucket holds under the ops' keys and their tables'
// own keys, where the cache does not know.
func (w *write) learn(ops []*op) error {
	s := w.s
	var need []string
	tables := map[string]bool{}
	for _, o := range ops {
		if _, ok := s.cache.row(o.table, o.key); !ok {
			need = append(need, o.key)
		}
		if _, ok := s.cache.marks[o.table]; !ok && !tables[o.table] {
			tables[o.table] = true
			need = append(need, o.table)
		}
	}
	if len(need) == 0 {
		return nil
	}
	got, err := s.lookup(w.ctx, w.nc, need)
	if err != nil {
		return err
	}
	for _, o := range ops {
		if h, ok := got[o.key]; ok {
			s.cache.setRow(o.table, o.key, h)
		}
	}
	for t := range tables {
		s.cache.setMark(t, got[t])
	}
	return nil
}

// failOp fails the changes whose effect o carries.
func (w *write) failOp(o *op, err error) {
	for _, i := range o.deps {
		if w.err.Failed[i] == nil {
			w.err.Fail(i, err)
		}
	}
}

// pubErr describes the failed write of o.
func (w *write) pubErr(o *op, err error) error {
	c := o.c
	what := fmt.Sprintf("writing key %q of bucket %q (%s of %s.%s, %s)", o.key, w.s.cfg.Bucket, c.Op, c.Schema, c.Table, c.ID())
	if errors.Is(err, nats.ErrMaxPayload) {
		return sinks.Permanent(fmt.Errorf("%s: the value is %d bytes, over the server's max_payload of %d: raise max_payload, or route fewer columns of the table: %w",
			what, len(c.Payload), w.nc.MaxPayload(), err))
	}
	return w.s.connErr(w.nc, what, err)
}

// wrongLast reports whether err is the server's refusal of a write whose
// Nats-Expected-Last-Subject-Sequence no longer holds.
func wrongLast(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && (ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// msg builds the message that writes c under key: c's payload, c's own
// headers (except "Nats-*" ones and the KV protocol's), and the bridge's.
func (s *Sink) msg(key string, c *cdc.Change) *nats.Msg {
	h := make(nats.Header, len(c.Headers)+12)
	for k, v := range c.Headers {
		if !natsconn.ValidHeader(k, v) || k == kvOperation {
			s.log.Warn("dropping an invalid or reserved header", "change", c.ID(), "header", k)
			continue
		}
		h[k] = []string{v}
	}
	h[HeaderID] = []string{c.ID()}
	h[HeaderProducer] = []string{c.Producer}
	h[HeaderCommitLSN] = []string{c.CommitLSN.String()}
	h[HeaderSeq] = []string{strconv.FormatUint(uint64(c.Seq), 10)}
	if c.TxSize > 0 { // 0: published before its transaction's end
		h[HeaderTxSize] = []string{strconv.FormatUint(uint64(c.TxSize), 10)}
	}
	h[HeaderXid] = []string{strconv.FormatUint(uint64(c.Xid), 10)}
	h[HeaderTable] = []string{c.Schema + "." + c.Table}
	h[HeaderOp] = []string{string(c.Op)}
	return &nats.Msg{Subject: s.cfg.subject(key), Data: c.Payload, Header: h}
}
