// The resume side (sinks.Resumer): the cursor the Writes advance, and
// Delivered, which reads what the stream holds after it.

package natsjs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

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
func (s *Sink) Delivered(ctx context.Context, producer, cursor string) (_ map[cdc.Pos]struct{}, err error) {
	s.mu.Lock()
	js, nc := s.js, s.nc
	s.mu.Unlock()
	defer func() {
		if denied := natsconn.PermissionDenied(nc, err); denied != nil {
			err = fmt.Errorf("reading stream %q: %w", s.cfg.Stream, denied)
		}
	}()
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
	// after it that Delivered does not list refuses the next publish. A
	// second read of the same run leaves it at the first's (fence.go).
	s.fence.syncRead(state.LastSeq)
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
	family := lineage(producer)
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
		if !ours && !sameLineage(msg.Headers().Get(jetstream.MsgIDHeader), family) {
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

// lineage returns what every epoch of producer's bridge and source share:
// "<bridge>.<source>." of "<bridge>.<source>.<epoch>", and of a snapshot's
// "<bridge>.<source>.<epoch>.snap-<run>". The epoch never holds a dot.
func lineage(producer string) string {
	if i := strings.Index(producer, ".snap-"); i >= 0 {
		producer = producer[:i]
	}
	i := strings.LastIndexByte(producer, '.')
	if i < 0 {
		return ""
	}
	return producer[:i+1]
}

// sameLineage reports whether the message id id was published by some
// epoch of the bridge and source whose lineage is family: "<family><epoch>"
// or a snapshot read "<family><epoch>.snap-<run>", then ":<LSN>:<seq>".
// Such messages are this source's own history (an earlier epoch after the
// checkpoint was deleted or a resync, snapshot reads, its changes as seen
// from a snapshot's Delivered), not another writer's: an instance of an
// earlier epoch still publishing is a zombie, which is what the fence
// stops, while another source in the same stream would be refused at
// every run if the fence stayed on.
func sameLineage(id, family string) bool {
	if family == "" || !strings.HasPrefix(id, family) {
		return false
	}
	p, _, err := cdc.ParseID(id)
	if err != nil || len(p) <= len(family) {
		return false
	}
	epoch, rest, _ := strings.Cut(p[len(family):], ".")
	return epoch != "" && !strings.ContainsAny(epoch, ":*> ") && (rest == "" || strings.HasPrefix(rest, "snap-"))
}
