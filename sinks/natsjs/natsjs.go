package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
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
		// (measured with scripts/bench.sh; docs/performance.md, Levers).
		Batch: config.Batch{MaxChanges: DefaultMaxChanges},
	})
}

// Headers the sink sets, besides jetstream.MsgIDHeader ("Nats-Msg-Id",
// the change's ID, on every message) and the change's own Headers. They
// carry what a consumer filters or groups on without parsing the payload;
// everything else about the change is in the payload
// (docs/consumers.md#headers).
const (
	HeaderOp     = "Bridge-Op"      // insert, update, delete, truncate, message, read, control; every message
	HeaderTable  = "Bridge-Table"   // "schema.table"; absent for logical messages
	HeaderTxSize = "Bridge-Tx-Size" // number of changes in the transaction, decimal; absent while not known (see cdc.Change.TxSize)
)

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
	cfg   Config
	nconn natsconn.Conn // cfg's connection, resolved
	name  string
	log   *slog.Logger

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
	dead   atomic.Uint64 // changes stored on the dead-letter subject (DeadLetters)
	fence  fence         // fence.go: Nats-Expected-Last-Sequence chain
	hdrs   sync.Pool     // *nats.Msg of acknowledged messages, with their header maps (msg.go)

	// afterPublish, when set (tests only), is called by a Write after it
	// has handed change i's message to the connection.
	afterPublish func(i int)
	// beforeRedo, when set (tests only), is called by a Write between an
	// atomic batch's duplicate reply and its redo (replayRedo).
	beforeRedo func()
}

// New builds a sink from its config block: it fills the defaults, decodes
// (the decoder validates), takes url, credentials and TLS from env.NATS
// when url and context are empty (natsconn.ForSink), and does no network
// I/O.
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
	conn, err := natsconn.ForSink("sinks."+env.Name+".config", cfg.URL, cfg.NATSClient, env.NATS)
	if err != nil {
		return nil, err
	}
	cfg.URL = conn.URL
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{cfg: cfg, nconn: conn, name: env.Name, log: log}, nil
}

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
	s.fence.newRun() // the pipeline connects at the start of every run (fence.go)
	nc, js, acks := s.nc, s.js, s.acks
	s.mu.Unlock()
	if acks != nil {
		if n := acks.pending(); n > 0 {
			// Acks of a Write that failed (the pipeline ends the run and
			// connects again): the caller has given those publishes up, and
			// waiting for them (up to ack_timeout, forever silent when their
			// stream was deleted) would only hold the publish window. What
			// they stored, the next Delivered reads; the fence refuses what
			// they store later. Given up first, so that a Connect that
			// fails (a server that does not answer its ping) leaves none.
			s.log.Debug("dropping the acks of an abandoned Write", "stream", s.cfg.Stream, "pending", n)
			acks.drop()
		}
	}

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
	} else if err := natsconn.Alive(ctx, nc, s.aliveTimeout(), s.log); err != nil {
		// A connection that went silent is reconnected here rather than
		// failing run after run until the pings declare it stale.
		return fmt.Errorf("connecting to %s: %w: %w", redact(s.cfg.URL), sinks.ErrNotConnected, err)
	}
	return s.ensureStream(ctx, nc, js)
}

// aliveTimeout bounds Connect's ping of a connection it already has: the
// time a healthy server has to answer (ack_timeout, at most the pings'
// own bound).
func (s *Sink) aliveTimeout() time.Duration { return min(s.cfg.AckTimeout, s.nconn.PingWindow()) }

func (s *Sink) dial(ctx context.Context) (*nats.Conn, jetstream.JetStream, *acker, error) {
	nc, err := natsconn.Dial(ctx, natsconn.Settings{Conn: s.nconn, Sink: s.name, FlusherTimeout: s.cfg.AckTimeout}, s.log)
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
	switch denied := natsconn.PermissionDenied(nc, err); {
	case denied != nil: // the JetStream API's answer never came
		return fmt.Errorf("%s: %w", doing, denied)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("%s: JetStream is not enabled on %s (start nats-server with -js, or enable it for the account): %w",
			doing, redact(s.cfg.URL), err)
	case !nc.IsConnected() || isConnErr(err):
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

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
