package natsjs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// acker publishes messages with reply subjects of its own and matches the
// JetStream acks to the publishes of the Write under way. It replaces
// nats.go's asynchronous publisher, whose per-message future (a reply
// inbox, a map entry, a timer and two channels) and encoding/json decoding
// of every ack cost 2–3 µs of CPU per change in the bridge's profile
// (docs/performance.md). A Write is the only publisher at a time
// (sinks.Sink: Write is never concurrent with itself), so publishes get
// consecutive ids and an ack finds its change by subtraction.
//
// An ack is matched only while its Write (or, for Close, the last
// abandoned one) is registered; a late ack of an older Write is dropped:
// that Write reported the change as not delivered, and Delivered reads
// what the stream holds.
type acker struct {
	nc     *nats.Conn
	prefix string // reply subjects: prefix + the publish id in base 36
	stream string // the stream acks must name
	status chan nats.Status

	mu   sync.Mutex
	next uint64   // id of the next publish
	cur  *ackWait // the Write under way; nil between Writes
	old  *ackWait // the last Write given up with publishes unanswered
	idle chan struct{}
}

// ackWait is the state of one Write's publishes.
type ackWait struct {
	base    uint64 // id of the Write's first publish
	start   time.Time
	sent    []time.Duration // per batch index: when it was last published, since start
	idx     []int32         // batch index of publish id base+k
	res     []ackRes        // per batch index
	open    int             // publishes awaiting their ack
	waiting int             // batch index the Write waits for; -1: none
	wake    chan struct{}
	failed  atomic.Bool // an ack carried an error: publish no more
	timer   *time.Timer
}

// ackRes is the outcome of one change's publish.
type ackRes struct {
	state uint8 // ackNone, ackOpen or ackDone
	dup   bool
	seq   uint64
	err   error
}

const (
	ackNone = iota // not published (or its publish call failed)
	ackOpen        // published, awaiting its ack
	ackDone        // acked or refused: seq/dup or err
)

// newAcker subscribes to the replies of nc's publishes to stream.
func newAcker(nc *nats.Conn, stream string) (*acker, error) {
	a := &acker{nc: nc, prefix: nc.NewInbox() + ".", stream: stream}
	sub, err := nc.Subscribe(a.prefix+"*", a.handle)
	if err != nil {
		return nil, fmt.Errorf("subscribing to JetStream acks: %w", err)
	}
	// A dropped ack (the client's slow-consumer limits) would fail a
	// stored change after ack_timeout; at most max_pending are due at once.
	_ = sub.SetPendingLimits(-1, -1)
	a.status = nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	go a.watch(a.status)
	return a, nil
}

// watch fails every awaited ack when the connection is lost: the server
// may have stored those messages or not, and no ack will tell (the reply
// subscription of a dead connection hears nothing). Like nats.go's own
// publisher, with nats.ErrDisconnected.
func (a *acker) watch(status <-chan nats.Status) {
	for st := range status {
		a.mu.Lock()
		for _, w := range []*ackWait{a.cur, a.old} {
			if w == nil {
				continue
			}
			for i := range w.res {
				if w.res[i].state == ackOpen {
					w.res[i] = ackRes{state: ackDone, err: nats.ErrDisconnected}
					w.open--
					w.failed.Store(true)
				}
			}
			if w.waiting >= 0 {
				w.waiting = -1
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
		}
		a.old = nil
		a.signalIdle()
		a.mu.Unlock()
		if st == nats.CLOSED {
			return
		}
	}
}

// begin registers a Write of n changes; its acks are matched from now on.
// An earlier Write still registered is given up (see end).
func (a *acker) begin(n int) *ackWait {
	w := &ackWait{idx: make([]int32, 0, n), res: make([]ackRes, n), sent: make([]time.Duration, n), start: time.Now(),
		waiting: -1, wake: make(chan struct{}, 1)}
	a.mu.Lock()
	if a.cur != nil {
		a.retire(a.cur)
	}
	w.base = a.next
	a.cur = w
	a.mu.Unlock()
	return w
}

// end unregisters w. Acks still due to it are kept track of (for Close)
// until the next Write begins or Connect drops them.
func (a *acker) end(w *ackWait) {
	a.mu.Lock()
	if a.cur == w {
		a.cur = nil
		a.retire(w)
	}
	a.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
	}
}

// retire keeps w as the abandoned Write when it awaits acks. a.mu held.
func (a *acker) retire(w *ackWait) {
	if w.open > 0 {
		a.old = w
	}
}

// drop forgets the acks of abandoned Writes.
func (a *acker) drop() {
	a.mu.Lock()
	a.old = nil
	a.signalIdle()
	a.mu.Unlock()
}

// pending returns how many publishes await their ack, the current Write's
// and the last abandoned one's.
func (a *acker) pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pendingLocked()
}

func (a *acker) pendingLocked() int {
	n := 0
	for _, w := range []*ackWait{a.cur, a.old} {
		if w != nil {
			n += w.open
		}
	}
	return n
}

// drained returns a channel closed once nothing awaits an ack.
func (a *acker) drained() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.idle == nil {
		a.idle = make(chan struct{})
	}
	ch := a.idle
	a.signalIdle()
	return ch
}

// signalIdle closes the drained channel when nothing is pending. a.mu held.
func (a *acker) signalIdle() {
	if a.idle != nil && a.pendingLocked() == 0 {
		close(a.idle)
		a.idle = nil
	}
}

// publish publishes m as change i of w, its ack awaited. A publish that
// fails here (connection down, max_payload) records nothing.
func (a *acker) publish(w *ackWait, i int, m *nats.Msg) error {
	a.mu.Lock()
	id := a.next
	a.next++
	w.idx = append(w.idx, int32(i))
	w.res[i] = ackRes{state: ackOpen}
	w.open++
	a.mu.Unlock()
	w.sent[i] = time.Since(w.start) // read by wait, in the same goroutine
	var b [48]byte
	m.Reply = string(strconv.AppendUint(append(b[:0], a.prefix...), id, 36))
	if err := a.nc.PublishMsg(m); err != nil {
		a.mu.Lock()
		if w.res[i].state == ackOpen {
			w.res[i].state = ackNone
			w.open--
		}
		a.mu.Unlock()
		return err
	}
	return nil
}

// handle takes one ack (the subscription's goroutine).
func (a *acker) handle(m *nats.Msg) {
	id, err := strconv.ParseUint(m.Subject[len(a.prefix):], 36, 64)
	if err != nil {
		return
	}
	r := a.parse(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range []*ackWait{a.cur, a.old} {
		if w == nil || id < w.base || id-w.base >= uint64(len(w.idx)) {
			continue
		}
		i := int(w.idx[id-w.base])
		if w.res[i].state != ackOpen {
			return
		}
		w.res[i] = r
		w.open--
		if r.err != nil {
			w.failed.Store(true)
		}
		if w.waiting == i {
			w.waiting = -1
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
		if w == a.old && w.open == 0 {
			a.old = nil
		}
		a.signalIdle()
		return
	}
}

// wait returns the outcome of change i's publish: ok is false when it was
// not published. It waits for the ack until timeout after the publish (so
// the acks of a stalled server all fail about together, not one timeout
// after another), and until ctx ends; once ctx has ended, or the time is
// up, it only takes an ack that has arrived already.
func (a *acker) wait(ctx context.Context, w *ackWait, i int, timeout time.Duration) (r ackRes, ok bool, err error) {
	var deadline <-chan time.Time
	defer func() {
		a.mu.Lock()
		if w.waiting == i {
			w.waiting = -1
		}
		a.mu.Unlock()
		if deadline != nil {
			w.timer.Stop()
		}
	}()
	for {
		a.mu.Lock()
		r = w.res[i]
		if r.state != ackOpen {
			a.mu.Unlock()
			return r, r.state == ackDone, nil
		}
		w.waiting = i
		a.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return r, true, err
		}
		if deadline == nil {
			left := w.sent[i] + timeout - time.Since(w.start)
			if left <= 0 {
				return r, true, jetstream.ErrAsyncPublishTimeout
			}
			if w.timer == nil {
				w.timer = time.NewTimer(left)
			} else {
				w.timer.Reset(left)
			}
			deadline = w.timer.C
		}
		select {
		case <-w.wake: // maybe stale: the loop checks
		case <-deadline:
			return r, true, jetstream.ErrAsyncPublishTimeout
		case <-ctx.Done(): // the loop takes an ack that raced it
		}
	}
}

// parse reads a JetStream publish ack: {"stream":"S","seq":N} with
// optional "domain", "duplicate", batch and other fields, or
// {"error":{...}}; a reply without data is the server's "no responders"
// status (no stream binds the subject, or JetStream is down). An ack from
// another stream than the sink's is an error (the publishes carry no
// Nats-Expected-Stream: a header stored with every message, to check what
// the ack tells anyway).
func (a *acker) parse(m *nats.Msg) ackRes {
	done := func(err error) ackRes { return ackRes{state: ackDone, err: err} }
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return done(jetstream.ErrNoStreamResponse)
		}
		return done(fmt.Errorf("%w: %s %s", jetstream.ErrInvalidJSAck, m.Header.Get("Status"), m.Header.Get("Description")))
	}
	d := m.Data
	// The common reply, without an error: read by hand.
	if bytes.HasPrefix(d, []byte(`{"stream":"`)) && bytes.HasPrefix(d[len(`{"stream":"`):], []byte(a.stream)) &&
		len(d) > len(`{"stream":"`)+len(a.stream) && d[len(`{"stream":"`)+len(a.stream)] == '"' && !bytes.Contains(d, []byte(`"error"`)) {
		rest := d[len(`{"stream":"`)+len(a.stream)+1:]
		if num, ok := field(rest, `"seq":`); ok {
			end := 0
			for end < len(num) && num[end] >= '0' && num[end] <= '9' {
				end++
			}
			if seq, err := strconv.ParseUint(string(num[:end]), 10, 64); err == nil && seq > 0 {
				dup, _ := field(rest, `"duplicate":`)
				return ackRes{state: ackDone, seq: seq, dup: bytes.HasPrefix(dup, []byte("true"))}
			}
		}
	}
	var pa struct {
		Error     *jetstream.APIError `json:"error"`
		Stream    string              `json:"stream"`
		Sequence  uint64              `json:"seq"`
		Duplicate bool                `json:"duplicate"`
	}
	if err := json.Unmarshal(d, &pa); err != nil {
		return done(fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, d))
	}
	switch {
	case pa.Stream != "" && pa.Stream != a.stream:
		// The subject is bound to another stream (the sink's stream no
		// longer binds it): stored there, or refused by it (the fence
		// expects this stream's sequence), but never where the sink
		// resumes from.
		what := "stored in"
		if pa.Error != nil {
			what = "refused by"
		}
		return done(&jetstream.APIError{Code: 400, ErrorCode: jsErrCodeStreamNotMatch,
			Description: fmt.Sprintf("%s stream %q, not %q", what, pa.Stream, a.stream)})
	case pa.Error != nil:
		return done(pa.Error)
	case pa.Stream == "":
		return done(fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, d))
	}
	return ackRes{state: ackDone, seq: pa.Sequence, dup: pa.Duplicate}
}

// field returns what follows key (and any spaces) in d, and whether key is
// there. The server writes acks with fmt, not a JSON encoder: a space may
// follow a colon (`"duplicate": true`).
func field(d []byte, key string) ([]byte, bool) {
	k := bytes.Index(d, []byte(key))
	if k < 0 {
		return nil, false
	}
	return bytes.TrimLeft(d[k+len(key):], " "), true
}
