// Package feeds fans one JetStream change stream, as the bridge's
// nats_jetstream sink writes it, out to many filtered feeds in one process.
//
// One ordered consumer per Feeds reads every message of the stream, whatever
// the number of feeds. Each message is decoded once; whole transactions
// are kept in an in-memory window; an inverted index (by table, then by
// the value of an equality or array-membership condition) finds the feeds a
// change may match, so feeds that do not match cost nothing. A feed reads
// from a position, a Token, with Next: it gets whole matching transactions
// and the token to resume after them, on this process or any other. A feed
// behind the window is served from the stream itself by a temporary
// ordered consumer. When the history a feed needs is gone (deleted by the
// stream's limits, the stream recreated), the bridge published a resync, a
// producer's epoch changed, or a table the feed reads was truncated, Next
// returns a *RefetchError (errors.Is ErrMustRefetch): the client must
// re-read its state and start again from Position. It never jumps silently.
//
// The payload must be the native JSON format (bridge/format); the headers
// those of sinks/natsjs. The package imports the change model only, never
// the bridge runtime.
package feeds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config configures Feeds. Zero values take the defaults.
type Config struct {
	// Stream is the JetStream stream the bridge writes. Default "CDC".
	Stream string
	// Route, when set, is the name of the route whose messages the feeds
	// serve (their Nats-Msg-Id ends with "@<Route>"); the stream's other
	// messages match no feed. Empty: every message of the stream, for a
	// stream one route writes.
	Route string
	// WindowTxns bounds the in-memory window in transactions. Default 100000.
	WindowTxns int
	// WindowBytes bounds the in-memory window in (estimated) bytes.
	// Default 64 MiB.
	WindowBytes int64
	// Prewarm is how many messages before the stream's end the consumer
	// starts at, to fill the window. Default 1000.
	Prewarm uint64
	// MaxBatch is the number of changes after which Next returns at the next
	// transaction boundary. Transactions are never split, so a batch can be
	// larger. Default 1000.
	MaxBatch int
	// MaxScan bounds the messages one Next reads from the stream when the
	// feed is behind the window; it then returns what it found (maybe
	// nothing) with the token reached. Default 100000.
	MaxScan int
	// CatchUps bounds the temporary consumers reading for feeds behind the
	// window at once. Default 4.
	CatchUps int
	// MaxProjections bounds the column sets (Filter.Columns) in use at
	// once, besides all columns: each keeps its own encoding of the
	// changes it is asked for. Register refuses a new one beyond it
	// (ErrTooManyProjections) once the idle ones are dropped. Default 1000.
	MaxProjections int
	// MaxColumns bounds the columns of one projection; Register refuses a
	// filter naming more. Default 256.
	MaxColumns int
	// ProjectionIdle is how long a column set no feed uses is kept, for
	// the next feed asking for it (a client reconnecting). Default 1m.
	ProjectionIdle time.Duration
	// CheckInterval is how often the stream is checked for recreation.
	// Default 2s.
	CheckInterval time.Duration
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger

	// replayGap is how far behind the head (in messages) a feed in the
	// window rides a replay rather than scanning the window on its own.
	// Default 4096; tests lower it.
	replayGap uint64
}

func (c *Config) defaults() {
	if c.Stream == "" {
		c.Stream = "CDC"
	}
	if c.WindowTxns <= 0 {
		c.WindowTxns = 100_000
	}
	if c.WindowBytes <= 0 {
		c.WindowBytes = 64 << 20
	}
	if c.Prewarm == 0 {
		c.Prewarm = 1000
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 1000
	}
	if c.MaxScan <= 0 {
		c.MaxScan = 100_000
	}
	if c.CatchUps <= 0 {
		c.CatchUps = 4
	}
	if c.MaxProjections <= 0 {
		c.MaxProjections = 1000
	}
	if c.MaxColumns <= 0 {
		c.MaxColumns = 256
	}
	if c.ProjectionIdle <= 0 {
		c.ProjectionIdle = time.Minute
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.replayGap == 0 {
		c.replayGap = 4096
	}
}

// Token is a position in the stream: the stream's identity (its creation
// time) and a stream sequence at a transaction boundary. Its text form,
// "<stream id>.<sequence>", is what clients keep.
type Token struct {
	Stream string
	Seq    uint64
}

// String returns the text form of t; "" for the zero Token.
func (t Token) String() string {
	if t.Stream == "" {
		return ""
	}
	return t.Stream + "." + strconv.FormatUint(t.Seq, 10)
}

// IsZero reports whether t is the zero Token (meaning "from now").
func (t Token) IsZero() bool { return t.Stream == "" }

// ParseToken parses the text form of a Token; "" gives the zero Token.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, nil
	}
	id, seq, ok := strings.Cut(s, ".")
	n, err := strconv.ParseUint(seq, 10, 64)
	if !ok || id == "" || err != nil {
		return Token{}, fmt.Errorf("parsing token %q: want <stream id>.<sequence> as returned by a previous batch", s)
	}
	return Token{Stream: id, Seq: n}, nil
}

// ErrMustRefetch is matched (errors.Is) by every *RefetchError.
var ErrMustRefetch = errors.New("feeds: must refetch")

// ErrTooManyProjections is matched (errors.Is) by Register's error when
// MaxProjections column sets are in use: the filter's Columns would make
// one more. A filter without Columns (all of them) is always served.
var ErrTooManyProjections = errors.New("feeds: too many projections")

// ErrClosed is returned by Next after the feed or Feeds was closed.
var ErrClosed = errors.New("feeds: closed")

// Reasons of a RefetchError.
const (
	ReasonGone     = "gone"     // the history after the token is no longer in the stream
	ReasonStream   = "stream"   // the stream was recreated (or the token is of another stream)
	ReasonResync   = "resync"   // the bridge published a resync control message
	ReasonEpoch    = "epoch"    // a producer's epoch changed without a resync message
	ReasonTruncate = "truncate" // a table the feed reads was truncated
)

// RefetchError says the feed cannot continue from its token without a
// gap: the client must re-read its state (a snapshot query after reading
// Position) and register again.
type RefetchError struct {
	Reason string // one of the Reason constants
	Detail string
	// Seq is the stream sequence where continuity broke, when known.
	Seq uint64
}

func (e *RefetchError) Error() string {
	s := "feeds: must refetch (" + e.Reason + ")"
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is makes errors.Is(err, ErrMustRefetch) true.
func (e *RefetchError) Is(target error) bool { return target == ErrMustRefetch }

// Stats are counters of a Feeds, for tests and metrics.
type Stats struct {
	Feeds, Waiting  int
	Head            uint64 // Position's sequence
	WindowFrom      uint64 // the window serves tokens at or after this
	WindowTxns      int
	Serialisations  int64 // change encodings made (one per change, projection and kind)
	Projections     int   // column sets held (in use or idle), besides all columns
	EncodedBytes    int64 // bytes of the window's changes' encodings, counted in WindowBytes
	CatchUps        int64 // reads from the stream for feeds behind the window
	CatchUpMessages int64 // messages those reads took from the stream
	Replays         int64 // passes over history shared by feeds far behind (replay.go)
	Backfills       int64 // replays whose reads from the stream joined the window
	Gaps, Recreates int64
}

// Feeds reads one stream and serves filtered feeds from it. Create it with
// New; all methods are safe for concurrent use.
type Feeds struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    Config
	log    *slog.Logger
	sem    chan struct{}

	mu         sync.RWMutex
	streamID   string
	gen        uint64 // bumped when the stream is recreated
	haveHead   bool
	head       uint64
	windowFrom uint64
	txs        []*txn // complete transactions up to head, ordered by last sequence
	evicted    int    // transactions evicted from txs' array since it was copied
	bytes      int64
	lastSeq    uint64
	asm        *assembler
	pending    []*txn
	idx        *index
	feeds      map[*Feed]struct{}
	waiting    map[*Feed]struct{}
	projs      map[string]*projection // by projKey; "" is all columns
	nextProj   uint64                 // the next projection's id: ids are never reused
	headCh     chan struct{}          // closed and replaced when head changes
	stamp      uint64
	scratch    []*group // candidates of one change, reused
	closed     bool
	restart    context.CancelFunc

	lanes     [2]lane         // replays, under mu
	replayCtx context.Context // ends with Close
	replayWG  sync.WaitGroup

	encBytes atomic.Int64 // bytes of the encodings of the window's changes (see countLocked)

	objs sync.Map // bucket → jetstream.ObjectStore, for payloads stored there (payloadOf)
	// Messages not understood: how many since the last warning, and when
	// that was (unix ns); see notUnderstood.
	badCount, badLogged atomic.Int64

	serialisations, catchUps, catchUpMsgs, replays, backfills, gaps, recreates atomic.Int64

	cancel context.CancelFunc
	done   chan struct{}
}

// New opens the stream, starts the ordered consumer and returns once the
// window holds the stream's end as it was at the call, so that Position is
// current. ctx bounds the start only; Close stops the consumer.
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*Feeds, error) {
	cfg.defaults()
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("feeds: opening stream %q (is the bridge's nats_jetstream sink writing it?): %w", cfg.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("feeds: reading stream %q: %w", cfg.Stream, err)
	}
	fs := &Feeds{
		js: js, stream: st, cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, cfg.CatchUps),
		idx: newIndex(), feeds: map[*Feed]struct{}{}, waiting: map[*Feed]struct{}{},
		projs: map[string]*projection{}, headCh: make(chan struct{}), done: make(chan struct{}),
	}
	fs.projs[""] = &projection{id: 0}
	fs.nextProj = 1
	fs.resetLocked(streamID(info), info.State.FirstSeq, info.State.LastSeq)
	target := info.State.LastSeq
	bg, cancel := context.WithCancel(context.Background())
	fs.cancel, fs.replayCtx = cancel, bg
	go fs.run(bg)
	for {
		fs.mu.RLock()
		ready := fs.haveHead && fs.lastSeq >= target
		ch := fs.headCh
		fs.mu.RUnlock()
		if ready {
			return fs, nil
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			fs.Close()
			return nil, fmt.Errorf("feeds: reading stream %q up to sequence %d (no transaction boundary yet?): %w", cfg.Stream, target, ctx.Err())
		}
	}
}

func streamID(info *jetstream.StreamInfo) string {
	return strconv.FormatInt(info.Created.UnixNano(), 36)
}

// resetLocked starts over on a stream whose identity is id, reading from
// near its end. Positions before the restart are served from the stream.
func (fs *Feeds) resetLocked(id string, first, last uint64) {
	fs.streamID = id
	fs.dropWindowLocked()
	fs.asm = newAssembler()
	start := first
	if last >= first && last-first+1 > fs.cfg.Prewarm {
		start = last - fs.cfg.Prewarm + 1
	}
	if last < first || start <= 1 {
		// An empty stream, or its very beginning: a transaction boundary.
		if start == 0 || last < first {
			start = last + 1
		}
		fs.haveHead, fs.head, fs.windowFrom = true, start-1, start-1
	} else {
		fs.haveHead = false
	}
	fs.lastSeq = start - 1
	fs.signalLocked()
}

func (fs *Feeds) signalLocked() {
	close(fs.headCh)
	fs.headCh = make(chan struct{})
}

// Position returns the token of the stream's end as this process has read
// it, at a transaction boundary. Read it before a snapshot query and
// register from it: every change at or before it committed before the
// query began; changes after it are delivered, some maybe already in the
// snapshot (apply them as upserts by key).
func (fs *Feeds) Position() Token {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return Token{Stream: fs.streamID, Seq: fs.head}
}

// Stats returns counters.
func (fs *Feeds) Stats() Stats {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return Stats{
		Feeds: len(fs.feeds), Waiting: len(fs.waiting), Head: fs.head, WindowFrom: fs.windowFrom, WindowTxns: len(fs.txs),
		Serialisations: fs.serialisations.Load(), Projections: len(fs.projs) - 1, EncodedBytes: fs.encBytes.Load(), CatchUps: fs.catchUps.Load(), CatchUpMessages: fs.catchUpMsgs.Load(), Replays: fs.replays.Load(), Backfills: fs.backfills.Load(), Gaps: fs.gaps.Load(), Recreates: fs.recreates.Load(),
	}
}

// Ready reports whether the consumer is at a transaction boundary and the
// Feeds is not closed.
func (fs *Feeds) Ready() bool {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.haveHead && !fs.closed
}

// Close stops the consumer; every feed's Next returns ErrClosed. A feed
// parked in Next first moves its token to Position (nothing up to it
// matched), so that Token, read after Close, hands a client the most
// recent position it can resume from, on another process.
func (fs *Feeds) Close() {
	fs.mu.Lock()
	if fs.closed {
		fs.mu.Unlock()
		return
	}
	fs.closed = true
	for f := range fs.waiting {
		// Parked and not woken: no transaction up to head concerns it.
		if fs.haveHead && f.stream == fs.streamID && f.pos < fs.head {
			f.pos = fs.head
		}
	}
	fs.wakeAllLocked()
	fs.signalLocked()
	fs.mu.Unlock()
	fs.cancel()
	<-fs.done
	fs.replayWG.Wait()
}

// Register opens a feed with filter f, reading after from (the zero Token
// means Position). A token of another stream (the stream was recreated)
// gives a *RefetchError.
func (fs *Feeds) Register(f Filter, from Token) (*Feed, error) {
	cf, err := compile(f)
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.closed {
		return nil, ErrClosed
	}
	if from.IsZero() {
		from = Token{Stream: fs.streamID, Seq: fs.head}
	}
	if from.Stream != fs.streamID {
		return nil, &RefetchError{Reason: ReasonStream, Detail: fmt.Sprintf("token of stream %s, stream %q is now %s", from.Stream, fs.cfg.Stream, fs.streamID)}
	}
	if n := len(strings.Split(projKey(f.Columns), ",")); len(f.Columns) > 0 && n > fs.cfg.MaxColumns {
		return nil, fmt.Errorf("filter.columns: %d columns, more than the limit of %d (MaxColumns)", n, fs.cfg.MaxColumns)
	}
	p, err := fs.projectionLocked(f.Columns)
	if err != nil {
		return nil, err
	}
	cf.proj = p
	feed := &Feed{fs: fs, filter: cf, stream: from.Stream, pos: from.Seq}
	fs.idx.add(feed)
	fs.feeds[feed] = struct{}{}
	return feed, nil
}
