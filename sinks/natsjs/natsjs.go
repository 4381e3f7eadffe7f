package natsjs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/bridgecdc/bridge/sinks/internal/natsconn"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

func init() {
	sinks.MustRegister("nats_jetstream", sinks.Plugin{
		New:    New,
		Config: DefaultConfig(),
		Doc:    "JetStream stream: exactly once (Nats-Msg-Id dedupe plus a tail check on restart), in order, per-change acks",
		// Batches as large as the window of acks in flight (max_pending's
		// default): each Write ends by draining its acks and a fenced one
		// starts with a change awaited alone, which cost 1.4 ms per Write
		// on a busy 2-core machine. Against 1000: big pgoutput backlog
		// median +12 % changes/s over six interleaved pairs (0 to +24 %
		// per pair), single-row +9 to +16 %, about 35 MiB more RSS
		// (docs/performance.md, fourth round).
		Batch: config.Batch{MaxChanges: DefaultMaxChanges},
	})
}

// Headers the sink sets on every message, besides jetstream.MsgIDHeader
// ("Nats-Msg-Id", the change's ID) and the change's own Headers.
const (
	HeaderCommitLSN = "Bridge-Commit-Lsn" // commit end LSN, Postgres form "16/B374D848"
	HeaderSeq       = "Bridge-Seq"        // ordinal of the change in its transaction, decimal
	HeaderTxSize    = "Bridge-Tx-Size"    // number of changes in the transaction, decimal
	HeaderXid       = "Bridge-Xid"        // Postgres transaction id, decimal
	HeaderTable     = "Bridge-Table"      // "schema.table"; absent for logical messages
	HeaderOp        = "Bridge-Op"         // insert, update, delete, truncate, message, read
	HeaderRun       = "Bridge-Run"        // random id of the publishing sink instance; diagnostic
)

// jsErrCodeAtomicDuplicate is the server's JSAtomicPublishContainsDuplicateMessageErr.
const jsErrCodeAtomicDuplicate jetstream.ErrorCode = 10201

// maxAtomic is the largest transaction published as one atomic batch: the
// server's default limit of messages per batch. Larger transactions are
// published message by message (still in order and exactly once, but a
// consumer can see part of one).
const maxAtomic = 1000

// atomicOK reports whether transactions go out as atomic batches: asked for,
// and the stream allows it.
func (s *Sink) atomicOK() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.AtomicTransactions && s.allowAtomic
}

// atomicGroup returns the size of the whole transaction starting at
// batch[i] when it can go as one atomic batch, else 0: it must start at
// ordinal 0, have two to maxAtomic changes, and all be in this batch.
func atomicGroup(batch []cdc.Change, i int, atomic bool) int {
	if !atomic {
		return 0
	}
	c := &batch[i]
	n := int(c.TxSize)
	if c.Seq != 0 || n < 2 || n > maxAtomic || i+n > len(batch) {
		return 0
	}
	for k := 1; k < n; k++ {
		if d := &batch[i+k]; d.CommitLSN != c.CommitLSN || d.Seq != uint32(k) || d.Producer != c.Producer {
			return 0
		}
	}
	return n
}

// jsErrCodeStreamNotMatch is the server's JSStreamNotMatchErr: the subject
// belongs to another stream than Nats-Expected-Stream.
const jsErrCodeStreamNotMatch jetstream.ErrorCode = 10060

var (
	errClosed = errors.New("natsjs: sink closed")
	// errSkipped marks changes a Write did not publish because an earlier
	// one failed: publishing them would widen the gap in the stream.
	errSkipped = errors.New("natsjs: not published: an earlier change of the batch failed")
)

// Sink publishes changes to a JetStream stream. It implements sinks.Sink
// and sinks.Resumer. Connect, Write, Delivered and Close follow the
// sinks.Sink contract: Write is never called concurrently with itself;
// Close may be called at any time, more than once.
type Sink struct {
	cfg  Config
	name string
	log  *slog.Logger
	run  string // random per instance, the Bridge-Run header
	// expStream is the Nats-Expected-Stream header's value, shared by
	// every message (capacity 1: an append copies it).
	expStream []string

	mu          sync.Mutex // guards the fields below
	nc          *nats.Conn
	js          jetstream.JetStream
	acks        *acker   // acks.go: the publishes' acks
	subjects    []string // the stream's subjects as last seen
	maxMsgSize  int      // the stream's max_msg_size as last seen; 0 or -1: none
	allowAtomic bool     // the stream accepts atomic batches
	allowBatch  bool     // the stream accepts fast batches (fast.go)
	closed      bool

	cursor atomic.Uint64 // see Cursor; 0 = none yet
	fence  fence         // fence.go: Nats-Expected-Last-Sequence chain
	hdrs   sync.Pool     // *nats.Msg of acknowledged messages, with their header maps (msg.go)
}

// New builds a sink from its config block: it fills the defaults, decodes
// (the decoder validates), takes url and credentials from env.NATS when url
// is empty, and does no network I/O.
func New(decode config.Decoder, env sinks.Env) (sinks.Sink, error) {
	cfg := DefaultConfig()
	cfg.Subjects = nil // a decoded list must not merge with the default one
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = append([]string(nil), DefaultSubjects...)
	}
	if d := cfg.DeadLetterSubject; d != "" && cfg.CreateStream && !covered(cfg.Subjects, d) {
		cfg.Subjects = append(cfg.Subjects, d) // the stream binds its dead letters too
	}
	if cfg.URL == "" {
		cfg.URL = env.NATS.URL
		if cfg.Creds == "" && cfg.User == "" && cfg.Token == "" {
			cfg.Creds, cfg.User, cfg.Password, cfg.Token = env.NATS.Creds, env.NATS.User, env.NATS.Password, env.NATS.Token
		}
	}
	if cfg.URL == "" {
		cfg.URL = nats.DefaultURL
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Sink{cfg: cfg, name: env.Name, log: log, run: hex.EncodeToString(b[:]), expStream: []string{cfg.Stream}[:1:1]}, nil
}

// Run returns the instance's random run id, sent as the Bridge-Run header.
func (s *Sink) Run() string { return s.run }

// Connect dials the servers (unless already connected) and makes sure the
// stream exists: created or updated when create_stream is set, checked
// otherwise. It is idempotent and cheap to call again; after a Write
// failed with sinks.ErrNotConnected it waits, within ctx, for the client's
// own reconnection, then checks the stream again (a server restarted with
// an empty store gets its stream back). Publishes of an earlier Write
// still waiting for their acks are given up. ctx bounds dialling and the
// JetStream round trips.
func (s *Sink) Connect(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sinks.Permanent(errClosed)
	}
	nc, js, acks := s.nc, s.js, s.acks
	s.mu.Unlock()

	if nc == nil || nc.IsClosed() {
		var err error
		if nc, js, acks, err = s.dial(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return sinks.Permanent(errClosed)
		}
		s.nc, s.js, s.acks = nc, js, acks
		s.mu.Unlock()
	} else if err := natsconn.WaitConnected(ctx, nc); err != nil {
		return fmt.Errorf("connecting to %s: %w: %w", redact(s.cfg.URL), sinks.ErrNotConnected, err)
	}
	if n := acks.pending(); n > 0 {
		// Acks of a Write that failed (the pipeline ends the run and
		// connects again): the caller has given those publishes up, and
		// waiting for them (up to ack_timeout, forever silent when their
		// stream was deleted) would only hold the publish window. What
		// they stored, the next Delivered reads; the fence refuses what
		// they store later.
		s.log.Debug("dropping the acks of an abandoned Write", "stream", s.cfg.Stream, "pending", n)
		acks.drop()
	}
	return s.ensureStream(ctx, nc, js)
}

func (s *Sink) dial(ctx context.Context) (*nats.Conn, jetstream.JetStream, *acker, error) {
	nc, err := natsconn.Dial(ctx, natsconn.Settings{URL: s.cfg.URL, Creds: s.cfg.Creds, User: s.cfg.User, Password: s.cfg.Password,
		Token: s.cfg.Token, Sink: s.name, FlusherTimeout: s.cfg.AckTimeout}, s.log)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("connecting to %s: %w", redact(s.cfg.URL), err)
	}
	acks, err := newAcker(nc, s.cfg.Stream)
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("connecting to %s: %w", redact(s.cfg.URL), err)
	}
	return nc, js, acks, nil
}

// ensureStream creates, updates or checks the stream, and records its subjects.
func (s *Sink) ensureStream(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	name := s.cfg.Stream
	created := false
	st, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && !s.cfg.CreateStream:
		return fmt.Errorf("checking stream %q: it does not exist on %s: create it (for example `nats stream add %s --subjects %q --storage file --dupe-window %s`) or set create_stream: true",
			name, redact(s.cfg.URL), name, strings.Join(s.cfg.Subjects, ","), s.cfg.DuplicateWindow)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        name,
			Description: "Postgres changes published by the bridge",
			Subjects:    s.cfg.Subjects,
			Storage:     jetstream.FileStorage,
			Duplicates:  s.cfg.DuplicateWindow,
			Replicas:    s.cfg.Replicas,
			// Each Postgres transaction can then be stored all or nothing.
			AllowAtomicPublish: s.cfg.AtomicTransactions,
			AllowBatchPublish:  s.cfg.FastBatch,
		})
		created = err == nil
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // created concurrently
			st, err = js.Stream(ctx, name)
		}
		if err != nil {
			return s.streamErr(nc, fmt.Sprintf("creating stream %q with subjects %q", name, s.cfg.Subjects), err)
		}
	case err != nil:
		return s.streamErr(nc, fmt.Sprintf("checking stream %q", name), err)
	case s.cfg.CreateStream:
		cfg := st.CachedInfo().Config
		changed := false
		for _, subj := range s.cfg.Subjects {
			if !slices.Contains(cfg.Subjects, subj) {
				cfg.Subjects = append(cfg.Subjects, subj)
				changed = true
			}
		}
		if cfg.Duplicates != s.cfg.DuplicateWindow || cfg.Replicas != s.cfg.Replicas {
			cfg.Duplicates, cfg.Replicas = s.cfg.DuplicateWindow, s.cfg.Replicas
			changed = true
		}
		if s.cfg.AtomicTransactions && !cfg.AllowAtomicPublish {
			cfg.AllowAtomicPublish = true
			changed = true
		}
		if s.cfg.FastBatch && !cfg.AllowBatchPublish {
			cfg.AllowBatchPublish = true
			changed = true
		}
		if changed {
			if st, err = js.UpdateStream(ctx, cfg); err != nil {
				return s.streamErr(nc, fmt.Sprintf("updating stream %q (subjects %q, duplicate_window %s, replicas %d)",
					name, cfg.Subjects, cfg.Duplicates, cfg.Replicas), err)
			}
		}
	}
	info := st.CachedInfo()
	if !s.cfg.CreateStream {
		for _, subj := range s.cfg.Subjects {
			sample := strings.NewReplacer("*", "x", ">", "x").Replace(subj) // a subject the filter matches
			if !covered(info.Config.Subjects, sample) {
				s.log.Warn("stream does not bind a configured subject; changes routed there will fail",
					"stream", name, "subject", subj, "stream_subjects", info.Config.Subjects)
			}
		}
	}
	if d := s.cfg.DeadLetterSubject; d != "" && !covered(info.Config.Subjects, d) {
		return sinks.Permanent(fmt.Errorf("dead_letter_subject %q is not bound to stream %q (its subjects: %q): add it to subjects", d, name, info.Config.Subjects))
	}
	if s.cfg.AtomicTransactions && !info.Config.AllowAtomicPublish {
		s.log.Warn("stream does not allow atomic publishing: transactions are published message by message (consumers may see part of one)",
			"stream", name, "fix", "nats stream edit "+name+" --allow-batch (nats-server >= 2.12), or set create_stream: true")
	}
	// A stream this call created starts empty; otherwise the chain starts
	// where the stream ends unless it is running already (fence.go).
	s.fence.syncIf(created || !s.fence.isSynced(), info.State.LastSeq)
	s.mu.Lock()
	s.subjects = slices.Clone(info.Config.Subjects)
	s.maxMsgSize = int(info.Config.MaxMsgSize)
	s.allowAtomic = info.Config.AllowAtomicPublish
	s.allowBatch = info.Config.AllowBatchPublish
	s.mu.Unlock()
	return nil
}

func (s *Sink) streamErr(nc *nats.Conn, doing string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("%s: JetStream is not enabled on %s (start nats-server with -js, or enable it for the account): %w",
			doing, redact(s.cfg.URL), err)
	case !nc.IsConnected() || isConnErr(err):
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// Write publishes the batch in order, pipelined: up to max_pending
// messages await their acks at once. It returns when every published change
// is acked or failed, or when ctx ends.
//
// nil means every change is in the stream (a duplicate ack counts: it was
// there already). A *sinks.BatchError lists the changes that are not known
// to be in the stream; every index it does not list was acked. After the
// first failure Write publishes nothing more (the rest fail with a "not
// published" error), but changes already in flight behind the failed one
// may still be stored, leaving a gap; they are reported as delivered if
// and only if their ack arrived. Per-change errors wrap
// sinks.ErrNotConnected when the connection is down (the pipeline calls
// Connect), and are sinks.Permanent when the change can never be stored:
// larger than the server's max_payload or the stream's max_msg_size, an
// invalid subject, or a subject the stream does not bind. Other errors
// (ack timeout, ctx) are worth retrying. A Write on a closed sink fails
// with a Permanent error, one before Connect with ErrNotConnected.
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	if len(batch) == 0 {
		return nil
	}
	s.mu.Lock()
	nc, js, acks, closed, subjects := s.nc, s.js, s.acks, s.closed, s.subjects
	s.mu.Unlock()
	switch {
	case closed:
		return sinks.Permanent(fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, errClosed))
	case js == nil || !nc.IsConnected():
		return fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, sinks.ErrNotConnected)
	case ctx.Err() != nil:
		return fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, ctx.Err())
	}

	w := &write{s: s, nc: nc, ctx: ctx, batch: batch, acks: acks, aw: acks.begin(len(batch)), msg: make([]*nats.Msg, len(batch)),
		seqs: make([]uint64, len(batch)), group: make([]int, len(batch))}
	defer acks.end(w.aw)
	// The fence (fence.go): each publish expects the stream's last
	// sequence to be the one before it, so nothing another instance stored
	// meanwhile can be overtaken.
	fenced := s.cfg.ExpectLastSequence && !s.fence.isShared()
	var exp uint64 // the stream's last sequence the next publish expects
	if fenced {
		var err error
		if exp, err = s.fence.start(ctx, js, s.cfg.Stream); err != nil {
			err = fmt.Errorf("writing %d changes to stream %q: %w", len(batch), s.cfg.Stream, err)
			for i := range batch {
				w.err.Fail(i, err)
			}
			return w.err.Err()
		}
	}
	synced := exp // the stream's last sequence where the chain stands
	refreshed := false
	stop := len(batch) // first index not published
	var stopErr error  // why, when stopped before a failure of its own
	// prepare builds change i's message, diverting or offloading it when the
	// server would refuse it; false means it failed (recorded in w.err).
	okSubject := "" // the last subject found valid and bound to the stream
	limit, what := s.msgLimit(nc)
	prepare := func(i int) (*nats.Msg, bool) {
		c := &batch[i]
		var refusal error // a reason the server would refuse c for good
		known := c.Subject == okSubject && okSubject != ""
		valid := known || validSubject(c.Subject)
		if !valid {
			refusal = fmt.Errorf("publishing %s: invalid subject %q", c.ID(), c.Subject)
		}
		if valid && !known && len(subjects) > 0 && !covered(subjects, c.Subject) && !refreshed {
			refreshed = true // the stream may have been given the subject since
			if err := s.ensureStream(ctx, nc, js); err == nil {
				s.mu.Lock()
				subjects = s.subjects
				s.mu.Unlock()
				limit, what = s.msgLimit(nc)
			}
		}
		if valid && !known && len(subjects) > 0 && !covered(subjects, c.Subject) {
			refusal = fmt.Errorf("publishing %s: subject %q is not bound to stream %q (its subjects: %q); add it to the stream's subjects or change the route",
				c.ID(), c.Subject, s.cfg.Stream, subjects)
		}
		if refusal == nil {
			okSubject = c.Subject
		}
		msg, hsize := s.buildMsg(c)
		if refusal == nil {
			size := len(msg.Data) + hsize + len(msg.Subject)
			if limit > 0 && size > limit {
				if s.cfg.LargePayloadBucket == "" {
					refusal = fmt.Errorf("publishing %s to %q: the message is %d bytes, over %s of %d; set large_payload_bucket to carry it through the object store",
						c.ID(), c.Subject, size, what, limit)
				} else if err := s.offload(ctx, js, c, msg); err != nil {
					w.err.Fail(i, err)
					return nil, false
				}
			}
		}
		if refusal != nil {
			if s.cfg.DeadLetterSubject == "" {
				w.err.Fail(i, sinks.Permanent(fmt.Errorf("%w; set dead_letter_subject to divert such changes instead of stopping", refusal)))
				return nil, false
			}
			msg = s.deadLetter(nc, c, msg, refusal)
			s.log.Warn("change dead-lettered", "change", c.ID(), "table", c.Schema+"."+c.Table, "subject", s.cfg.DeadLetterSubject, "reason", refusal.Error())
		}
		return msg, true
	}
	atomic := s.atomicOK()
	// firstDone resolves the Write's first publish (a message or an atomic
	// batch ending at index end) when fenced, and turns the rest of the
	// Write into a replay when it was stored already.
	firstDone := func(end int) {
		if end != w.firstEnd {
			return
		}
		for w.next <= end {
			w.resolve()
		}
		if w.dups > 0 || len(w.redo) > 0 {
			wasFenced := fenced
			fenced, atomic = false, false // a replay: see fence.go
			s.log.Debug("the Write starts with changes the stream holds already: publishing it message by message, unfenced", "stream", s.cfg.Stream, "first", batch[0].ID())
			w.replayRedo()
			w.aw.failed.Store(false) // the first publish's refusal is handled
			if wasFenced && w.dupMax > synced && end+1 < len(batch) && w.err.Failed == nil {
				// Stored after the point the chain starts from: not a
				// replay of ours but another writer's (a killed or paused
				// instance whose publishes the server applied late). Seen
				// where the server checks duplicates before the expected
				// sequence: atomic and fast batches, clustered streams. A
				// plain publish to an R1 stream is refused by its
				// expectation instead (wrong last sequence: ErrFenced).
				// Publishing the rest unfenced could store what that
				// writer stored beyond the duplicate window: stop, so the
				// next run reads the stream's tail again.
				w.err.Fail(end+1, fmt.Errorf("not publishing %s: the stream stored %s at sequence %d, after sequence %d where this sink's chain stands, so another instance is publishing: %w",
					batch[end+1].ID(), batch[0].ID(), w.dupMax, synced, ErrFenced))
			}
		}
	}
	w.firstEnd = -1
	if fenced || atomic {
		w.firstEnd = 0
		if n := atomicGroup(batch, 0, atomic); n > 0 {
			w.firstEnd = n - 1
		}
	}
	from := 0 // first index the loop below publishes
	// fastRest: a fenced Write's first publish goes alone (a replay shows
	// there), the rest as one fenced fast batch (fence.go).
	fastRest := false
	if !atomic && len(batch) >= fastMin && s.fastOK() {
		if fenced {
			fastRest = true
		} else {
			stop, stopErr = s.writeFast(w, js, prepare, 0, false, 0) // fast.go
			from = len(batch)
		}
	}
publish:
	for i := from; i < len(batch); i++ {
		c := &batch[i]
		for i-w.next >= s.cfg.MaxPending { // window full: wait for the oldest ack
			w.resolve()
		}
		if w.err.Failed != nil || w.aw.failed.Load() || ctx.Err() != nil {
			stop = i
			if w.err.Failed == nil && ctx.Err() != nil {
				stopErr = w.ctxErr()
			}
			break
		}
		if n := atomicGroup(batch, i, atomic); n > 0 {
			// A whole transaction as one atomic batch: its messages, then a
			// commit whose ack (awaited like any other) covers them all.
			// Pipelined: no round trip per transaction.
			msgs := make([]*nats.Msg, n)
			for k := range n {
				m, ok := prepare(i + k)
				if !ok {
					for kk := range k { // its transaction goes all or nothing
						w.err.Fail(i+kk, fmt.Errorf("not publishing %s: change #%d of its transaction was refused: %w", batch[i+kk].ID(), i+k, errSkipped))
					}
					stop = i + k + 1
					break publish
				}
				msgs[k] = m
			}
			bid := nuid.Next()
			for k, m := range msgs {
				m.Header.Set(jetstreamext.BatchIDHeader, bid)
				m.Header.Set(jetstreamext.BatchSeqHeader, strconv.Itoa(k+1))
			}
			msgs[n-1].Header.Set(jetstreamext.BatchCommitHeader, "1")
			if fenced { // only a batch's first message may carry it
				msgs[0].Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(exp, 10))
				exp += uint64(n)
			}
			for k := range n - 1 {
				if err := nc.PublishMsg(msgs[k]); err != nil {
					for kk := range n {
						w.err.Fail(i+kk, s.publishErr(nc, &batch[i+kk], len(msgs[kk].Data)+natsconn.HeaderSize(msgs[kk].Header), err))
					}
					stop = i + n
					break publish
				}
			}
			w.msg[i+n-1] = msgs[n-1]
			if err := w.publish(i + n - 1); err != nil {
				for kk := range n {
					w.err.Fail(i+kk, s.publishErr(nc, &batch[i+kk], len(msgs[kk].Data)+natsconn.HeaderSize(msgs[kk].Header), err))
				}
				stop = i + n
				break
			}
			w.group[i+n-1] = n
			if w.msgs == nil {
				w.msgs = map[int]*nats.Msg{}
			}
			for k, m := range msgs {
				w.msgs[i+k] = m
			}
			firstDone(i + n - 1)
			i += n - 1
			continue
		}
		msg, ok := prepare(i)
		if !ok {
			stop = i + 1
			break
		}
		if fenced {
			msg.Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(exp, 10))
			exp++
		}
		w.msg[i] = msg
		if err := w.publish(i); err != nil {
			w.err.Fail(i, s.publishErr(nc, c, len(msg.Data)+natsconn.HeaderSize(msg.Header), err))
			stop = i + 1
			break publish
		}
		firstDone(i)
		if fastRest && i == w.firstEnd && fenced && w.err.Failed == nil && !w.aw.failed.Load() && ctx.Err() == nil {
			stop, stopErr = s.writeFast(w, js, prepare, i+1, true, exp) // fast.go
			break
		}
	}
	for w.next < stop {
		w.resolve()
	}
	w.replayRedo()
	first := -1 // first failed index
	if idx := w.err.Indexes(); len(idx) > 0 {
		first = idx[0]
	}
	for i := stop; i < len(batch); i++ {
		if _, failed := w.err.Failed[i]; failed {
			continue // its own reason stands
		}
		id := batch[i].ID()
		switch {
		case stopErr != nil:
			w.err.Fail(i, fmt.Errorf("not publishing %s: %w", id, stopErr))
		case first >= 0:
			w.err.Fail(i, fmt.Errorf("not publishing %s after #%d failed: %w", id, first, errSkipped))
		default: // a failure reported by the client, maybe of an earlier Write
			w.err.Fail(i, fmt.Errorf("not publishing %s: %w", id, errSkipped))
		}
	}
	s.advanceCursor(w)
	s.fence.done(w)
	return w.err.Err()
}

// replayRedo publishes, message by message, the changes of the atomic
// batches that met messages stored already (only a Write's first publish
// when fenced: fence.go); dedupe drops the stored ones.
func (w *write) replayRedo() {
	for len(w.redo) > 0 && w.err.Failed == nil {
		end := w.redo[0]
		w.redo = w.redo[1:]
		n := w.group[end]
		w.group[end] = 0
		for k := end - n + 1; k <= end; k++ {
			m := w.msgs[k]
			for _, h := range []string{jetstreamext.BatchIDHeader, jetstreamext.BatchSeqHeader, jetstreamext.BatchCommitHeader, jetstream.ExpectedLastSeqHeader} {
				m.Header.Del(h)
			}
			w.msg[k] = m
			if err := w.publish(k); err != nil {
				w.err.Fail(k, w.s.publishErr(w.nc, &w.batch[k], len(m.Data)+natsconn.HeaderSize(m.Header), err))
				break
			}
		}
		for w.next = end - n + 1; w.next <= end; {
			w.resolve()
		}
	}
}

// write is the state of one Write.
type write struct {
	s     *Sink
	nc    *nats.Conn
	ctx   context.Context
	batch []cdc.Change
	acks  *acker
	aw    *ackWait          // acks.go: this Write's acks
	msg   []*nats.Msg       // per change: its message once published with an ack awaited
	group []int             // at the commit's index: the size of its atomic batch
	msgs  map[int]*nats.Msg // messages of atomic batches, for a republish
	redo  []int             // commit indexes of atomic batches to republish
	seqs  []uint64          // stream sequence of each acked change
	dups  int
	// dupMax is the highest stream sequence of the stored originals of
	// changes acked as duplicates.
	dupMax uint64
	fresh  uint64 // highest sequence of a change stored (not a duplicate) by this Write
	next   int    // next index to resolve
	// firstEnd is the last index of the Write's first publish while that
	// publish is awaited alone (fence.go), else -1.
	firstEnd int
	err      sinks.BatchError
}

// publish publishes w.msg[i] with its ack awaited, and the header that
// makes the server refuse it unless the subject belongs to the stream.
func (w *write) publish(i int) error {
	m := w.msg[i]
	m.Header[jetstream.ExpectedStreamHeader] = w.s.expStream
	return w.acks.publish(w.aw, i, m)
}

// resolve waits for the ack of change w.next (unless it was not published
// with an ack awaited) and records the outcome. Once ctx has ended it only
// takes acks that have arrived already.
func (w *write) resolve() {
	i := w.next
	w.next++
	r, published, err := w.acks.wait(w.ctx, w.aw, i, w.s.cfg.AckTimeout)
	if !published {
		return
	}
	m := w.msg[i]
	if err == nil {
		err = r.err
	} else if w.ctx.Err() != nil {
		w.failGroup(i, fmt.Errorf("waiting for the ack of %s: %w", w.batch[i].ID(), w.ctxErr()))
		return
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if w.group[i] > 1 && errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeAtomicDuplicate && i == w.firstEnd {
			w.redo = append(w.redo, i) // see Write: republished one by one
			return
		}
		w.failGroup(i, w.s.publishErr(w.nc, &w.batch[i], len(m.Data)+natsconn.HeaderSize(m.Header), err))
		return
	}
	if w.group[i] == 0 {
		w.s.recycle(m) // acked; nothing reads it any more
		w.msg[i] = nil
	}
	n := max(w.group[i], 1)
	for k := range n { // an atomic batch's ack is its last message's
		w.seqs[i-k] = r.seq - uint64(k)
	}
	if r.dup {
		w.dups++
		w.dupMax = max(w.dupMax, r.seq) // the sequence of the stored original
	} else {
		w.fresh = max(w.fresh, r.seq)
	}
}

// failGroup records err for change i and, when i commits an atomic batch,
// for every change of that batch: none of them is known to be stored.
func (w *write) failGroup(i int, err error) {
	n := max(w.group[i], 1)
	for k := n - 1; k >= 1; k-- {
		w.err.Fail(i-k, fmt.Errorf("not stored: the atomic batch of its transaction failed: %w", err))
	}
	w.err.Fail(i, err)
}

// ctxErr is ctx's error, also wrapping sinks.ErrNotConnected when the
// connection is down (a Write blocked by a dead server).
func (w *write) ctxErr() error {
	err := w.ctx.Err()
	if err == nil {
		err = context.Canceled
	}
	if !w.nc.IsConnected() {
		return fmt.Errorf("%w: %w", sinks.ErrNotConnected, err)
	}
	return err
}

// advanceCursor moves the cursor to the highest sequence acked before the
// first failure of the Write. Acks behind a failure do not count, so the
// cursor never passes a gap. A fresh (non-duplicate) ack below the cursor
// means the stream was recreated, and resets it.
func (s *Sink) advanceCursor(w *write) {
	end := len(w.batch)
	if idx := w.err.Indexes(); len(idx) > 0 {
		end = idx[0]
	}
	var hi uint64
	for _, seq := range w.seqs[:end] {
		hi = max(hi, seq)
	}
	if hi == 0 {
		return
	}
	cur := s.cursor.Load()
	reset := false
	if hi < cur && w.dups == 0 {
		reset = true
	}
	if hi > cur || reset {
		s.cursor.Store(hi)
	}
}

// publishErr classifies a publish failure of c.
func (s *Sink) publishErr(nc *nats.Conn, c *cdc.Change, size int, err error) error {
	doing := fmt.Sprintf("publishing %s to %q", c.ID(), c.Subject)
	var apiErr *jetstream.APIError
	errors.As(err, &apiErr)
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return sinks.Permanent(fmt.Errorf("%s: the message is %d bytes, over the server's max_payload of %d: %w",
			doing, size, nc.MaxPayload(), err))
	case apiErr != nil && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return sinks.Permanent(fmt.Errorf("%s: the message is %d bytes, over stream %q's max_msg_size: %w", doing, size, s.cfg.Stream, err))
	case apiErr != nil && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("%s: %w: %w", doing, ErrFenced, err)
	case apiErr != nil && apiErr.ErrorCode == jsErrCodeAtomicDuplicate:
		return fmt.Errorf("%s: its atomic batch holds changes stream %q has already (a replay the tail check missed); the next run reads the tail again: %w", doing, s.cfg.Stream, err)
	case apiErr != nil && apiErr.ErrorCode == jsErrCodeStreamNotMatch:
		return sinks.Permanent(fmt.Errorf("%s: the subject belongs to another stream than %q: %w", doing, s.cfg.Stream, err))
	case errors.Is(err, nats.ErrHeadersNotSupported), errors.Is(err, nats.ErrBadSubject):
		return sinks.Permanent(fmt.Errorf("%s: %w", doing, err))
	case isConnErr(err) || !nc.IsConnected():
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// isConnErr reports errors that mean the connection, or JetStream behind
// it, is unavailable.
func isConnErr(err error) bool {
	for _, e := range []error{
		nats.ErrConnectionClosed, nats.ErrDisconnected, nats.ErrReconnectBufExceeded,
		nats.ErrConnectionDraining, nats.ErrConnectionReconnecting, nats.ErrNoServers,
		nats.ErrNoResponders, nats.ErrStaleConnection, nats.ErrTimeout,
		jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// toMsg builds the message of c: its subject and payload as the router set
// them, the change's own headers (except "Nats-*" ones, which would steer
// JetStream), and the bridge's headers. The message comes from s.hdrs (see
// recycle); the bridge's header values share one string.
func (s *Sink) toMsg(c *cdc.Change) *nats.Msg {
	m, _ := s.buildMsg(c)
	return m
}

// buildMsg is toMsg, also returning the size of the header block it built
// (natsconn.HeaderSize of the message's header, without computing it again).
func (s *Sink) buildMsg(c *cdc.Change) (*nats.Msg, int) {
	m := s.newMsg(len(c.Headers) + 9) // +1: Nats-Expected-Stream
	h := m.Header
	size := len("NATS/1.0\r\n\r\n")
	for k, v := range c.Headers {
		if !natsconn.ValidHeader(k, v) {
			s.log.Warn("dropping an invalid or reserved header", "change", c.ID(), "header", k)
			continue
		}
		if ownHeader(k) {
			continue // set below, to the bridge's value
		}
		h[k] = []string{v}
		size += len(k) + len(v) + 4
	}
	// The bridge's own keys: a recycled map holds each with a slice of its
	// own (see ownHeader), overwritten in place.
	set := func(k, v string) {
		if vs := h[k]; len(vs) == 1 {
			vs[0] = v
		} else {
			h[k] = []string{v}
		}
		size += len(k) + len(v) + 4
	}
	// id, commit LSN, seq, tx size, xid and table in one string.
	var b [160]byte
	buf := appendID(b[:0], c)
	ends := [6]int{len(buf)}
	buf = c.CommitLSN.Append(buf)
	ends[1] = len(buf)
	buf = strconv.AppendUint(buf, uint64(c.Seq), 10)
	ends[2] = len(buf)
	buf = strconv.AppendUint(buf, uint64(c.TxSize), 10)
	ends[3] = len(buf)
	buf = strconv.AppendUint(buf, uint64(c.Xid), 10)
	ends[4] = len(buf)
	table := c.Op != cdc.OpMessage && c.Table != ""
	if table {
		buf = append(buf, c.Schema...)
		buf = append(buf, '.')
		buf = append(buf, c.Table...)
	}
	ends[5] = len(buf)
	all := string(buf)
	set(jetstream.MsgIDHeader, all[:ends[0]])
	set(HeaderCommitLSN, all[ends[0]:ends[1]])
	set(HeaderSeq, all[ends[1]:ends[2]])
	set(HeaderTxSize, all[ends[2]:ends[3]])
	set(HeaderXid, all[ends[3]:ends[4]])
	if table {
		set(HeaderTable, all[ends[4]:ends[5]])
	} else {
		delete(h, HeaderTable)
	}
	set(HeaderOp, string(c.Op))
	set(HeaderRun, s.run)
	m.Subject, m.Data = c.Subject, c.Payload
	return m, size
}

// HeaderPayloadObject names the object ("<bucket>/<name>") holding a payload
// too large for one message; the message itself then carries no payload.
const HeaderPayloadObject = "Bridge-Payload-Object"

// offload puts msg's payload into the large-payload object store under the
// change's id and turns msg into a reference to it (a claim check). Putting
// the same id twice stores the same bytes, so replays stay exactly-once.
func (s *Sink) offload(ctx context.Context, js jetstream.JetStream, c *cdc.Change, msg *nats.Msg) error {
	bucket := s.cfg.LargePayloadBucket
	obs, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bucket, Storage: jetstream.FileStorage, Replicas: s.cfg.Replicas,
			Description: "payloads too large for one message, by change id"})
	}
	if err != nil {
		return fmt.Errorf("opening object store %q for the %d-byte payload of %s: %w", bucket, len(msg.Data), c.ID(), err)
	}
	chunk := uint32(128 << 10)
	if limit, _ := s.msgLimit(s.conn()); limit > 0 && limit-1024 < int(chunk) {
		chunk = uint32(max(limit-1024, 256))
	}
	meta := jetstream.ObjectMeta{Name: c.ID(), Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk}}
	if _, err := obs.Put(ctx, meta, bytes.NewReader(msg.Data)); err != nil {
		return fmt.Errorf("storing the %d-byte payload of %s in object store %q: %w", len(msg.Data), c.ID(), bucket, err)
	}
	msg.Header.Set(HeaderPayloadObject, bucket+"/"+c.ID())
	msg.Header.Set(HeaderPayloadBytes, strconv.Itoa(len(msg.Data)))
	msg.Data = nil
	return nil
}

func (s *Sink) conn() *nats.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nc
}

// Dead-letter headers, added to the change's own.
const (
	HeaderDeadLetterReason = "Bridge-Dead-Letter-Reason" // why the server would refuse the change
	HeaderOriginalSubject  = "Bridge-Original-Subject"   // the subject the route gave it
	HeaderPayloadBytes     = "Bridge-Payload-Bytes"      // set when the payload was left out for size
)

// msgLimit is the largest message the server and the stream accept (0 when
// unknown) and which limit that is.
func (s *Sink) msgLimit(nc *nats.Conn) (int, string) {
	limit, what := int(nc.MaxPayload()), "the server's max_payload"
	s.mu.Lock()
	if m := s.maxMsgSize; m > 0 && (limit <= 0 || m < limit) {
		limit, what = m, fmt.Sprintf("stream %q's max_msg_size", s.cfg.Stream)
	}
	s.mu.Unlock()
	return limit, what
}

// deadLetter turns msg into its dead letter: same id and headers, the
// reason, the dead-letter subject, and the payload only when it fits.
func (s *Sink) deadLetter(nc *nats.Conn, c *cdc.Change, msg *nats.Msg, reason error) *nats.Msg {
	h := msg.Header
	h.Set(HeaderDeadLetterReason, strings.NewReplacer("\r", " ", "\n", " ").Replace(reason.Error()))
	h.Set(HeaderOriginalSubject, strings.NewReplacer("\r", " ", "\n", " ").Replace(c.Subject))
	data := msg.Data
	if limit, _ := s.msgLimit(nc); limit > 0 && len(data)+natsconn.HeaderSize(h)+len(s.cfg.DeadLetterSubject) > limit {
		h.Set(HeaderPayloadBytes, strconv.Itoa(len(data)))
		data = nil
	}
	return &nats.Msg{Subject: s.cfg.DeadLetterSubject, Header: h, Data: data}
}

// Cursor returns the highest stream sequence acked so far, in decimal, or
// "" before the first ack. Acks that arrived behind a failed change of the
// same Write do not move it, so Delivered(Cursor()) always covers a gap.
// Call it between Writes.
func (s *Sink) Cursor() string {
	if c := s.cursor.Load(); c > 0 {
		return strconv.FormatUint(c, 10)
	}
	return ""
}

// Delivered returns the positions of producer's changes that the stream
// holds after cursor: it reads, headers only, from sequence cursor+1 (from
// the first when cursor is "", older than the stream's first message, or
// beyond its last one: a recreated stream) up to the stream's last sequence
// at the time of the call, and keeps messages whose Nats-Msg-Id belongs to
// producer. Call it after Connect; ctx bounds the whole read.
func (s *Sink) Delivered(ctx context.Context, producer, cursor string) (map[cdc.Pos]struct{}, error) {
	s.mu.Lock()
	js := s.js
	s.mu.Unlock()
	if js == nil {
		return nil, fmt.Errorf("reading stream %q: %w", s.cfg.Stream, sinks.ErrNotConnected)
	}
	var after uint64
	if cursor != "" {
		var err error
		if after, err = strconv.ParseUint(cursor, 10, 64); err != nil {
			return nil, fmt.Errorf("reading stream %q: invalid cursor %q: %w", s.cfg.Stream, cursor, err)
		}
	}
	st, err := js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("reading stream %q: %w", s.cfg.Stream, err)
	}
	state := st.CachedInfo().State
	// The chain of expectations restarts at this snapshot: anything stored
	// after it that Delivered does not list refuses the next publish.
	s.fence.sync(state.LastSeq)
	out := map[cdc.Pos]struct{}{}
	start := after + 1
	if after > state.LastSeq || start < state.FirstSeq {
		start = state.FirstSeq
	}
	if state.Msgs == 0 || start > state.LastSeq {
		return out, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		HeadersOnly:       true,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("reading stream %q from sequence %d: %w", s.cfg.Stream, start, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(deliveredBatch))
	if err != nil {
		return nil, fmt.Errorf("reading stream %q from sequence %d: %w", s.cfg.Stream, start, err)
	}
	defer func() {
		it.Stop()
		// Ordered consumers are ephemeral; delete it now rather than
		// after InactiveThreshold.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = st.DeleteConsumer(dctx, info.Name)
			cancel()
		}
	}()
	prefix := producer + ":"
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("reading stream %q from sequence %d: %w", s.cfg.Stream, start, err)
		}
		ours := false
		if id := msg.Headers().Get(jetstream.MsgIDHeader); strings.HasPrefix(id, prefix) {
			if p, pos, err := cdc.ParseID(id); err == nil && p == producer {
				out[pos] = struct{}{}
				ours = true
			}
		}
		if !ours && strings.HasPrefix(msg.Headers().Get(jetstream.MsgIDHeader), producer+".snap-") {
			ours = true // a snapshot read of this producer (its own ids: cdc.Change.MsgID)
		}
		if !ours {
			s.fence.foundOther(s, msg.Headers().Get(jetstream.MsgIDHeader), msg.Subject())
		}
		md, err := msg.Metadata()
		if err != nil {
			return nil, fmt.Errorf("reading stream %q: %w", s.cfg.Stream, err)
		}
		if md.Sequence.Stream >= state.LastSeq || md.NumPending == 0 {
			return out, nil
		}
	}
}

// deliveredBatch is how many headers-only messages Delivered asks for at once.
const deliveredBatch = 8192

// Close waits for the acks of in-flight publishes, drains the connection
// and closes it. It returns by ctx's deadline even if the server hangs,
// closing the connection without waiting any more. Idempotent; Write and
// Connect fail once it has been called.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	nc, acks := s.nc, s.acks
	s.mu.Unlock()
	if nc == nil || nc.IsClosed() {
		return nil
	}
	var err error
	if acks.pending() > 0 && nc.IsConnected() {
		select {
		case <-acks.drained():
		case <-ctx.Done():
			err = fmt.Errorf("closing: waiting for %d acks: %w", acks.pending(), ctx.Err())
		}
	}
	if err == nil && nc.IsConnected() {
		ch := nc.StatusChanged(nats.CLOSED)
		if derr := nc.Drain(); derr == nil {
			select {
			case <-ch:
			case <-ctx.Done():
				err = fmt.Errorf("closing: draining the connection: %w", ctx.Err())
			}
		}
		nc.RemoveStatusListener(ch)
	}
	done := make(chan struct{})
	go func() {
		nc.Close() // flushes; bounded by the FlusherTimeout (ack_timeout)
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		if err == nil {
			err = fmt.Errorf("closing: %w", ctx.Err())
		}
	}
	return err
}

// redact drops user info from a comma-separated list of URLs.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			u.User = nil
			p = u.String()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// Interface guards.
var (
	_ sinks.Sink    = (*Sink)(nil)
	_ sinks.Resumer = (*Sink)(nil)
)
