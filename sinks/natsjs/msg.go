package natsjs

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

// pubHeaders are the headers a publish adds to a change's message besides
// buildMsg's: the fence (fence.go) and an atomic batch's. They count
// against max_payload like every other byte, so prepare sets them before it
// measures the message, and nothing adds a header after prepare.
type pubHeaders struct {
	expLast   string // Nats-Expected-Last-Sequence (the fence), "" for none
	expLastID string // Nats-Expected-Last-Msg-Id (the fence's chain), "" for none
	batchID   string // Nats-Batch-Id of an atomic batch, "" for none
	batchSeq  int    // Nats-Batch-Sequence, from 1
	commit    bool   // Nats-Batch-Commit: the atomic batch's last message
}

// set adds the headers to h and returns the bytes they take on the wire.
func (ph pubHeaders) set(h nats.Header) int {
	n := 0
	add := func(k string, v string) {
		h[k] = []string{v}
		n += len(k) + len(v) + 4
	}
	if ph.expLast != "" {
		add(jetstream.ExpectedLastSeqHeader, ph.expLast)
	}
	if ph.expLastID != "" {
		add(jetstream.ExpectedLastMsgIDHeader, ph.expLastID)
	}
	if ph.batchID != "" {
		add(jetstreamext.BatchIDHeader, ph.batchID)
		add(jetstreamext.BatchSeqHeader, strconv.Itoa(ph.batchSeq))
		if ph.commit {
			add(jetstreamext.BatchCommitHeader, "1")
		}
	}
	return n
}

// prepare assembles the message of change i as it will be sent: buildMsg's
// headers and payload plus the publish's own (ph). That is where the size
// is decided, counting what NATS counts against max_payload and a stream's
// max_msg_size (the header block and the payload; the subject does not
// count): a message over the limit goes to the object store
// (large_payload_bucket) or, failing that, to the dead-letter subject, as
// does one the server would refuse for its subject. false means the change
// cannot be published; prepare recorded why in w.err. The caller adds no
// header afterwards.
func (w *write) prepare(i int, ph pubHeaders) (*nats.Msg, bool) {
	s, c := w.s, &w.batch[i]
	var refusal error // a reason the server would refuse c for good
	known := c.Subject == w.okSubject && w.okSubject != ""
	valid := known || validSubject(c.Subject)
	if !valid {
		refusal = fmt.Errorf("publishing %s: invalid subject %q", c.ID(), c.Subject)
	}
	if valid && !known && len(w.subjects) > 0 && !covered(w.subjects, c.Subject) && !w.refreshed {
		w.refreshed = true // the stream may have been given the subject since
		if err := s.ensureStream(w.ctx, w.nc, w.js); err == nil {
			s.mu.Lock()
			w.subjects = s.subjects
			s.mu.Unlock()
			w.limit, w.what = s.msgLimit(w.nc)
		}
	}
	if valid && !known && len(w.subjects) > 0 && !covered(w.subjects, c.Subject) {
		refusal = fmt.Errorf("publishing %s: subject %q is not bound to stream %q (its subjects: %q); add it to the stream's subjects or change the route",
			c.ID(), c.Subject, s.cfg.Stream, w.subjects)
	}
	if refusal == nil {
		w.okSubject = c.Subject
	}
	msg, hsize := s.buildMsg(c)
	hsize += ph.set(msg.Header)
	if size := len(msg.Data) + hsize; refusal == nil && w.limit > 0 && size > w.limit {
		if s.cfg.LargePayloadBucket == "" {
			refusal = fmt.Errorf("publishing %s to %q: the message is %d bytes (a %d-byte payload and %d bytes of headers), over %s of %d; set large_payload_bucket to carry it through the object store",
				c.ID(), c.Subject, size, len(msg.Data), hsize, w.what, w.limit)
		} else if err := s.offload(w.ctx, w.js, c, msg); err != nil {
			w.err.Fail(i, err)
			return nil, false
		}
	}
	if refusal != nil {
		if s.cfg.DeadLetterSubject == "" {
			w.err.Fail(i, sinks.Permanent(fmt.Errorf("%w; set dead_letter_subject to divert such changes instead of stopping", refusal)))
			return nil, false
		}
		msg = s.deadLetter(c, msg, w.limit, refusal)
		w.dead = append(w.dead, i)
		s.log.Warn("change dead-lettered", "change", c.ID(), "table", c.Schema+"."+c.Table, "subject", s.cfg.DeadLetterSubject, "reason", refusal.Error())
	}
	return msg, true
}

// toMsg builds the message of c: its subject and payload as the router set
// them, the change's own headers (except "Nats-*" ones, which would steer
// JetStream), and the bridge's: Nats-Msg-Id, Bridge-Op, Bridge-Table (row
// changes) and Bridge-Tx-Size (when the transaction's size is known). The
// message comes from s.hdrs (see recycle).
func (s *Sink) toMsg(c *cdc.Change) *nats.Msg {
	m, _ := s.buildMsg(c)
	return m
}

// buildMsg is toMsg, also returning the size of the header block it built
// (natsconn.HeaderSize of the message's header, without computing it again).
func (s *Sink) buildMsg(c *cdc.Change) (*nats.Msg, int) {
	m := s.newMsg(len(c.Headers) + 5) // +1: the fence
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
	// The id, the transaction's size and the table in one string.
	var b [160]byte
	buf := appendID(b[:0], c)
	ends := [3]int{len(buf)}
	if c.TxSize > 0 {
		buf = strconv.AppendUint(buf, uint64(c.TxSize), 10)
	}
	ends[1] = len(buf)
	table := c.Op != cdc.OpMessage && c.Table != ""
	if table {
		buf = append(buf, c.Schema...)
		buf = append(buf, '.')
		buf = append(buf, c.Table...)
	}
	ends[2] = len(buf)
	all := string(buf)
	set(jetstream.MsgIDHeader, all[:ends[0]])
	if c.TxSize > 0 {
		set(HeaderTxSize, all[ends[0]:ends[1]])
	} else {
		delete(h, HeaderTxSize) // not known yet: published before the transaction's end
	}
	if table {
		set(HeaderTable, all[ends[1]:ends[2]])
	} else {
		delete(h, HeaderTable)
	}
	set(HeaderOp, string(c.Op))
	m.Subject, m.Data = c.Subject, c.Payload
	return m, size
}

// newMsg returns a message to fill, reused from an acknowledged one when
// one is available. Its header map may still hold the keys of ownHeader,
// each with a one-element slice of its own that buildMsg overwrites in
// place; it holds no other key.
func (s *Sink) newMsg(n int) *nats.Msg {
	if m, ok := s.hdrs.Get().(*nats.Msg); ok {
		return m
	}
	return &nats.Msg{Header: make(nats.Header, n)}
}

// ownHeader reports whether buildMsg sets k with a value slice of its own
// (one it allocated for that key, shared with nothing), which a recycled
// map keeps so the next message can overwrite it without allocating.
func ownHeader(k string) bool {
	switch k {
	case jetstream.MsgIDHeader, HeaderTxSize, HeaderTable, HeaderOp:
		return true
	}
	return false
}

// recycle takes back m, a message whose publish is resolved: nats.go
// encoded it during the publish call and keeps no reference it reads
// later. m must not be used afterwards. Its header keeps only the keys of
// ownHeader: the rest (the change's own headers, the fence's, a batch's)
// may share their value slices and go.
func (s *Sink) recycle(m *nats.Msg) {
	if m == nil || m.Header == nil || len(m.Header) > 32 {
		return
	}
	h := m.Header
	delete(h, jetstream.ExpectedLastSeqHeader)
	delete(h, jetstream.ExpectedLastMsgIDHeader)
	own := 2 // ownHeader's keys buildMsg always sets; the others when present
	if _, ok := h[HeaderTable]; ok {
		own++
	}
	if _, ok := h[HeaderTxSize]; ok {
		own++
	}
	if len(h) > own { // more than the bridge's own: the change's headers, a batch's
		for k := range h {
			if !ownHeader(k) {
				delete(h, k)
			}
		}
	}
	*m = nats.Msg{Header: h}
	s.hdrs.Put(m)
}

// appendID appends c.ID() to dst without allocating: the position, and
// the destination when the change's route is named.
func appendID(dst []byte, c *cdc.Change) []byte {
	if c.MsgID != "" { // a snapshot read's own identity
		dst = append(dst, c.MsgID...)
	} else {
		const digits = "0123456789ABCDEF"
		dst = append(dst, c.Producer...)
		dst = append(dst, ':')
		v := uint64(c.CommitLSN)
		for shift := 60; shift >= 0; shift -= 4 {
			dst = append(dst, digits[(v>>uint(shift))&0xF])
		}
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, uint64(c.Seq), 10)
	}
	if c.Dest != "" {
		dst = append(dst, cdc.DestSep...)
		dst = append(dst, c.Dest...)
	}
	return dst
}
