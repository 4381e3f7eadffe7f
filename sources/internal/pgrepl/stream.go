package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
)

// Plugin is what a logical decoding output plugin adds to the core.
type Plugin interface {
	// Name is the output plugin's name as Postgres knows it ("pgoutput").
	Name() string
	// Prepare runs plugin-specific checks and setup before the slot is
	// created (pgoutput: the publication). cat is a regular connection.
	Prepare(ctx context.Context, cat *pgx.Conn, log *slog.Logger) error
	// Check checks what Prepare checks and sets up, changing nothing (what
	// Prepare would create is an ok line saying so), and returns the
	// tables the source would stream ("schema.table"; nil: every table).
	// err is a failed query.
	Check(ctx context.Context, cat *pgx.Conn) (checks []config.Check, tables []string, err error)
	// Args are the START_REPLICATION plugin options.
	Args() []string
	// NewDecoder returns a decoder for one replication run; cat stays open
	// for catalog lookups while the run lasts and is used only from the
	// goroutine that calls Decode.
	NewDecoder(cat *pgx.Conn) Decoder
}

// Decoder turns the plugin's output into whole transactions. It is used from
// one goroutine.
type Decoder interface {
	// Decode handles one XLogData payload starting at walStart. It returns a
	// transaction when the payload completes one (a commit), else nil. The
	// payload's memory is reused after Decode returns.
	Decode(ctx context.Context, walStart cdc.LSN, data []byte) (*cdc.Txn, error)
	// InTxn reports whether a transaction is open (begun, not committed).
	InTxn() bool
	// Buffer returns the decoder's transaction buffer: the receive loop
	// lets it hand large transactions over while they arrive (live.go).
	Buffer() *TxnBuffer
}

// Source is a sources.Source over a replication slot and a Plugin.
type Source struct {
	cfg    Config
	name   string
	log    *slog.Logger
	plugin Plugin

	cat      *pgx.Conn
	repl     *pgconn.PgConn
	database string
	reader   sources.SlotReader // this source's walsender, once streaming (evict.go)

	// lineage.go: what the checkpoint was recorded under (Expect), the
	// stream's end, and the server's own lineage, read at Open.
	expect    sources.Lineage
	expectEnd cdc.LSN
	lineage   sources.Lineage

	txns   chan []*cdc.Txn // runs of transactions, see run
	ready  []*cdc.Txn      // the rest of the run Read took last; Read's goroutine only
	errc   chan error
	acked  atomic.Uint64
	cancel context.CancelFunc
	done   chan struct{}

	beat chan struct{} // closed when the heartbeat goroutine ends; nil when off

	mu        sync.Mutex
	idleSafe  cdc.LSN
	idleAfter cdc.LSN
	idleOK    bool
	closeOnce sync.Once

	snap snapState // snapshot.go
}

// New returns a source; it does no I/O.
func New(cfg Config, env sources.Env, p Plugin) *Source {
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{cfg: cfg, name: env.Name, log: log, plugin: p}
}

// Config returns the source's configuration.
func (s *Source) Config() Config { return s.cfg }

// Open implements sources.Source.
func (s *Source) Open(ctx context.Context, from cdc.LSN) (err error) {
	defer func() {
		if err != nil {
			s.closeConns()
		}
	}()
	ccfg, err := s.connConfig("bridge:" + s.name)
	if err != nil {
		return err
	}
	s.cat, err = pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		if e := noConnect(ccfg, err); e != nil {
			return e
		}
		return fmt.Errorf("connecting to %s: %w", Redact(s.cfg.DSN), explainConnect(s.cfg.DSN, err))
	}
	if err := s.cat.QueryRow(ctx, "SELECT current_database()").Scan(&s.database); err != nil {
		return fmt.Errorf("reading current database: %w", err)
	}
	si, err := Check(ctx, s.cat, s.cfg.Slot, s.plugin.Name())
	if err != nil {
		return err
	}
	if err := s.plugin.Prepare(ctx, s.cat, s.log); err != nil {
		return err
	}
	if err := s.checkPrivileges(ctx); err != nil {
		return err
	}
	rcfg, err := s.replConfig("bridge:" + s.name)
	if err != nil {
		return err
	}
	// Values are decoded from text; fix the output formats.
	rcfg.RuntimeParams["DateStyle"] = "ISO, MDY"
	rcfg.RuntimeParams["TimeZone"] = "UTC"
	rcfg.RuntimeParams["IntervalStyle"] = "postgres"
	rcfg.RuntimeParams["extra_float_digits"] = "3"
	rcfg.RuntimeParams["bytea_output"] = "hex"
	s.repl, err = pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return fmt.Errorf("opening replication connection to %s: %w", Redact(s.cfg.DSN), explainConnect(s.cfg.DSN, err))
	}
	// A failover since the checkpoint: never stream on from a point the
	// server's history lacks (lineage.go).
	if err := s.identify(ctx); err != nil {
		return err
	}
	failover, err := s.checkLineage(ctx, si, from)
	if err != nil {
		return err
	}
	if (si.Exists && si.WALStatus == "lost") || (!si.Exists && from != 0) {
		if err := s.slotLost(ctx, si, from, failover); err != nil {
			return err
		}
		si.Exists = false // dropped: created below
	}

	start := from
	if !si.Exists {
		if !s.cfg.CreateSlot {
			return &SetupError{
				What: fmt.Sprintf("slot %q does not exist (create_slot is false)", s.cfg.Slot),
				Fix:  fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', '%s');", s.cfg.Slot, s.plugin.Name()),
			}
		}
		cp, err := s.createSlot(ctx) // lineage.go: a failover slot with failover: true
		if err != nil {
			return err
		}
		s.log.Info("created replication slot", "slot", s.cfg.Slot, "plugin", s.plugin.Name(), "consistent_point", cp.String(),
			"failover", s.cfg.Failover, "on_standby", s.lineage.Standby)
		start = 0
	} else if err := s.alterFailover(ctx, si); err != nil {
		return err
	} else if start != 0 && start < si.ConfirmedFlush {
		// Postgres starts from its confirmed position anyway; say so.
		s.log.Info("slot is ahead of the checkpoint; Postgres resumes at the slot's position",
			"checkpoint", start.String(), "confirmed_flush", si.ConfirmedFlush.String())
	}
	initial := start
	if initial == 0 {
		initial = si.ConfirmedFlush
	}
	s.acked.Store(uint64(initial))

	if err := pglogrepl.StartReplication(ctx, s.repl, s.cfg.Slot, pglogrepl.LSN(start),
		pglogrepl.StartReplicationOptions{PluginArgs: s.plugin.Args()}); err != nil {
		return s.busy(ctx, s.explain(fmt.Errorf("starting replication on slot %q at %s: %w", s.cfg.Slot, start, err)))
	}
	s.reader = s.ownReader(ctx)
	s.log.Info("streaming", "slot", s.cfg.Slot, "from", start.String(), "plugin", s.plugin.Name())

	rctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.txns = make(chan []*cdc.Txn, max(1, s.cfg.Buffer/maxRun))
	s.errc = make(chan error, 1)
	s.done = make(chan struct{})
	go s.run(rctx, s.plugin.NewDecoder(s.cat))
	if s.cfg.HeartbeatInterval > 0 {
		s.beat = make(chan struct{})
		go s.heartbeat(rctx)
	}
	return nil
}

// Read implements sources.Source.
func (s *Source) Read(ctx context.Context) (*cdc.Txn, error) {
	if t, ok := s.next(); ok {
		return t, nil
	}
	select {
	case run := <-s.txns:
		s.ready = run
		t, _ := s.next()
		return t, nil
	default:
	}
	select {
	case run := <-s.txns:
		s.ready = run
		t, _ := s.next()
		return t, nil
	case err := <-s.errc:
		// Hand out what was decoded before the failure first.
		select {
		case run := <-s.txns:
			s.ready = run
			t, _ := s.next()
			s.errc <- err
			return t, nil
		default:
		}
		s.errc <- err
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// next pops the first transaction of s.ready.
func (s *Source) next() (*cdc.Txn, bool) {
	if len(s.ready) == 0 {
		return nil, false
	}
	t := s.ready[0]
	s.ready[0] = nil
	s.ready = s.ready[1:]
	return t, true
}

// Buffered returns how many decoded transactions Read returns without
// waiting for the receive loop: the rest of the current run, or 1 when a
// run is queued. Call it from Read's goroutine.
func (s *Source) Buffered() int {
	if n := len(s.ready); n > 0 {
		return n
	}
	return min(len(s.txns), 1)
}

// Ack implements sources.Source. Positions never move backwards.
func (s *Source) Ack(_ context.Context, upTo cdc.LSN) error {
	for {
		cur := s.acked.Load()
		if uint64(upTo) <= cur || s.acked.CompareAndSwap(cur, uint64(upTo)) {
			return nil
		}
	}
}

// Idle implements sources.Idler.
func (s *Source) Idle() (safe, after cdc.LSN, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idleSafe, s.idleAfter, s.idleOK
}

// Close implements sources.Source.
func (s *Source) Close(ctx context.Context) error {
	if s.cancel != nil {
		s.cancel()
		// Wake the receive loop; it sends the final status and returns.
		_ = s.repl.Conn().SetReadDeadline(time.Now())
		select {
		case <-s.done:
		case <-ctx.Done():
			// The goodbye hangs: cut the socket under it (net.Conn is safe
			// for concurrent use; pgconn is not).
			_ = s.repl.Conn().Close()
			<-s.done
		}
		if s.beat != nil {
			<-s.beat
		}
	}
	s.closeConns()
	return nil
}

func (s *Source) closeConns() {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if s.repl != nil {
			_ = s.repl.Close(ctx)
		}
		if s.cat != nil {
			_ = s.cat.Close(ctx)
		}
		s.closeSnapshot(ctx)
	})
}

func (s *Source) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
}

// run is the receive loop. It alone uses s.repl until it returns.
func (s *Source) run(ctx context.Context, dec Decoder) {
	defer close(s.done)
	conn := s.repl.Conn()
	var lastSent cdc.LSN
	var lastSendAt time.Time
	var lastCommit cdc.LSN
	send := func(reply bool) error {
		pos := cdc.LSN(s.acked.Load())
		// All three positions explicitly: pglogrepl copies write into a zero
		// flush, which would confirm what was never checkpointed.
		err := pglogrepl.SendStandbyStatusUpdate(ctx, s.repl, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pglogrepl.LSN(pos),
			WALFlushPosition: pglogrepl.LSN(pos),
			WALApplyPosition: pglogrepl.LSN(pos),
			ClientTime:       time.Now(),
			ReplyRequested:   reply,
		})
		if err != nil {
			return fmt.Errorf("sending standby status: %w", err)
		}
		lastSent, lastSendAt = pos, time.Now()
		return nil
	}
	defer func() {
		// Goodbye: report the final acknowledged position, bounded.
		deadline := time.Now().Add(time.Second)
		_ = conn.SetWriteDeadline(deadline)
		if send(false) != nil || ctx.Err() == nil || s.repl.IsClosed() {
			return // a failed run: the connection is dead or the server ended the copy
		}
		// Closed: end the copy and wait, bounded, for the server's end of
		// it. The walsender handles messages in order, so once it answers,
		// the slot shows the position sent above (pg_replication_slots'
		// confirmed_flush_lsn) before this process may exit; without the
		// wait the status could sit unread in the socket when the
		// process is gone and someone looks.
		_ = conn.SetReadDeadline(deadline)
		_, _ = pglogrepl.SendStandbyCopyDone(context.Background(), s.repl)
	}()
	// Transactions go to Read in runs: every transaction decoded from what
	// pgconn has already read, so the pipeline wakes once per run, not once
	// per transaction.
	var run []*cdc.Txn
	runChanges := 0
	push := func() error {
		if len(run) == 0 {
			return nil
		}
		select {
		case s.txns <- run:
			run, runChanges = make([]*cdc.Txn, 0, 4), 0
			return nil
		default:
		}
		// The pipeline is stalled: while it is, nothing reads the server's
		// keepalive requests, so report every second (or status_interval
		// when shorter) to keep a walsender with a short
		// wal_sender_timeout from dropping the connection.
		stall := time.NewTicker(min(s.cfg.StatusInterval, time.Second))
		defer stall.Stop()
		for {
			select {
			case s.txns <- run:
				run, runChanges = make([]*cdc.Txn, 0, 4), 0
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-stall.C:
				if err := send(false); err != nil {
					return err
				}
			}
		}
	}
	nextStatus := time.Now().Add(s.cfg.StatusInterval)
	_ = conn.SetReadDeadline(nextStatus)
	// lastRecv is when the server was last heard from: a link that is cut
	// without a reset stays silent, and only this notices (silence.go).
	lastRecv := time.Now()
	timeout := s.cfg.receiveTimeout()
	var watch silenceWatch
	// deadline is when the read must wake: for the next status update, or
	// to check a silence.
	deadline := func() time.Time {
		if d := watch.due(lastRecv, timeout); d.Before(nextStatus) {
			return d
		}
		return nextStatus
	}
	// now is read once per message received (and after waiting on the
	// pipeline): the loop runs three times per single-row transaction.
	now := lastRecv
	// lag is how long after its commit the last transaction decoded was
	// received: the reader is catching up when it is large (catchUpWait).
	var lag time.Duration
	// A transaction of more than StreamAfter changes is handed over while
	// it arrives; while the pipeline is behind on it, the decoder waits
	// and reports like push does below (not reading meanwhile, so the
	// server is not silent).
	dec.Buffer().Stream(ctx, s.done, min(s.cfg.StatusInterval, time.Second), func() error {
		now = time.Now()
		lastRecv = now
		return send(false)
	})
	for {
		if ctx.Err() != nil {
			return
		}
		if cur := cdc.LSN(s.acked.Load()); cur > lastSent && now.Sub(lastSendAt) > 500*time.Millisecond {
			if err := send(false); err != nil {
				s.fail(err)
				return
			}
		}
		if d := catchUpWait(s.cfg.CatchUpReadDelay, lag, s.repl.Frontend().ReadBufferLen()); d > 0 {
			time.Sleep(d)
		}
		msg, err := s.repl.ReceiveMessage(context.Background())
		now = time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) && !s.repl.IsClosed() {
				silent := now.Sub(lastRecv)
				if silent >= timeout && !now.Before(watch.next) {
					if watch.lost != nil { // nothing came in lostGrace either
						s.endWalsender(s.repl.PID(), watch.probed)
						s.fail(watch.lost)
						return
					}
					if probed, lost := s.checkSilence(&watch, silent, timeout, err); lost != nil {
						watch.lost, watch.probed, watch.next = lost, probed, time.Now().Add(lostGrace)
					}
				}
				if !now.Before(nextStatus) {
					if err := send(!dec.InTxn() || silent > timeout/2); err != nil {
						s.fail(err)
						return
					}
					nextStatus = time.Now().Add(s.cfg.StatusInterval)
				}
				_ = conn.SetReadDeadline(deadline())
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, syscall.ETIMEDOUT) {
				// TCP_USER_TIMEOUT (internal/pgnet): the server's host left
				// what the bridge sent unacknowledged.
				s.endWalsender(s.repl.PID(), false)
				s.fail(fmt.Errorf("replication connection on slot %q of database %q: the kernel ended it, the server's host having acknowledged nothing the bridge sent for tcp_user_timeout: taking it as lost: %w",
					s.cfg.Slot, s.database, err))
				return
			}
			s.fail(fmt.Errorf("receiving from slot %q: %w", s.cfg.Slot, err))
			return
		}
		if watch.active() {
			if !watch.busySince.IsZero() {
				s.log.Info("the walsender answered again", "slot", s.cfg.Slot, "silent", now.Sub(lastRecv).Round(time.Millisecond).String())
			} else {
				s.log.Debug("the replication connection answered after all", "slot", s.cfg.Slot, "verdict", watch.lost)
			}
			watch = silenceWatch{}
		}
		lastRecv = now
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					s.fail(fmt.Errorf("parsing keepalive: %w", err))
					return
				}
				if !dec.InTxn() {
					// Everything before ServerWALEnd was decoded and sent to
					// us; once all we emitted is acked it may be confirmed.
					s.mu.Lock()
					s.idleSafe, s.idleAfter, s.idleOK = cdc.LSN(pkm.ServerWALEnd), lastCommit, true
					s.mu.Unlock()
				}
				if pkm.ReplyRequested {
					if err := send(false); err != nil {
						s.fail(err)
						return
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					s.fail(fmt.Errorf("parsing XLogData: %w", err))
					return
				}
				t, err := dec.Decode(ctx, cdc.LSN(xld.WALStart), xld.WALData)
				if err != nil {
					s.fail(fmt.Errorf("decoding %s output at %s: %w", s.plugin.Name(), cdc.LSN(xld.WALStart), err))
					return
				}
				if t != nil {
					for i := range t.Changes {
						t.Changes[i].Database = s.database
					}
					if t.Rest != nil {
						t.Rest = &dbIter{ChangeIter: t.Rest, db: s.database}
					}
					run = append(run, t)
					runChanges += len(t.Changes)
					// Counted once decoded, pushed or not: the pipeline
					// takes an idle position only after delivering every
					// transaction up to lastCommit.
					lastCommit, lag = t.CommitLSN, now.Sub(t.CommitTime)
				}
			}
		case *pgproto3.ErrorResponse:
			_ = push() // hand out what was decoded before it
			s.fail(s.explain(fmt.Errorf("replication on slot %q: %w", s.cfg.Slot, pgconn.ErrorResponseToPgError(m))))
			return
		case *pgproto3.CopyDone:
			_ = push()
			s.fail(fmt.Errorf("replication on slot %q: server ended the stream", s.cfg.Slot))
			return
		}
		if len(run) > 0 && (len(run) >= maxRun || runChanges >= maxRunChanges || run[len(run)-1].Rest != nil ||
			s.repl.Frontend().ReadBufferLen() == 0) {
			if err := push(); err != nil {
				if ctx.Err() == nil {
					s.fail(err)
				}
				return
			}
			now = time.Now()
			lastRecv = now // not reading while the pipeline was busy
		}
		if now.After(nextStatus) {
			if err := send(false); err != nil {
				s.fail(err)
				return
			}
			nextStatus = time.Now().Add(s.cfg.StatusInterval)
			_ = conn.SetReadDeadline(deadline())
		}
	}
}

// A run of transactions ends with what pgconn holds read, or at maxRun
// transactions or maxRunChanges changes, or after a transaction that spilled.
const (
	maxRun        = 16
	maxRunChanges = 1000
)

var _ sources.Source = (*Source)(nil)
var _ sources.Idler = (*Source)(nil)
var _ sources.Lineaged = (*Source)(nil)

// dbIter sets the database on changes read back from a spill file.
type dbIter struct {
	cdc.ChangeIter
	db string
}

func (it *dbIter) Next(dst []cdc.Change) (int, error) {
	n, err := it.ChangeIter.Next(dst)
	for i := range dst[:n] {
		dst[i].Database = it.db
	}
	return n, err
}

// NextPart implements cdc.PartIter, with the inner iterator's parts when it
// has them, else in new slices.
func (it *dbIter) NextPart() ([]cdc.Change, error) {
	p, err := cdc.TakePart(it.ChangeIter, livePart)
	for i := range p {
		p[i].Database = it.db
	}
	return p, err
}

// catchUpAge is how long after its commit a transaction must arrive for
// catchUpWait to take the reader as catching up: well above a live
// stream's delay (under a millisecond to a few), well below a backlog's.
const catchUpAge = 100 * time.Millisecond

// catchUpWait is how long the reader waits before its next read
// (catch_up_read_delay): delay when it has consumed everything received
// (buffered is 0) while catching up, the last transaction decoded having
// arrived lag after its commit, more than catchUpAge (a transaction handed
// over before its commit is known counts as late); else 0, reading at once.
// Before the first transaction lag is 0.
//
// Reading as fast as the walsender sends, the reader takes one small
// message per read and the walsender wakes it for every one: both spend
// more CPU per change of small transactions than when the socket holds
// many. Live changes, however rare, arrive within milliseconds of their
// commit and are read at once; a bridge clock ahead of the database's by
// more than catchUpAge makes them wait too, adding at most delay to a
// change's latency.
func catchUpWait(delay, lag time.Duration, buffered int) time.Duration {
	if delay <= 0 || buffered > 0 || lag <= catchUpAge {
		return 0
	}
	return delay
}
