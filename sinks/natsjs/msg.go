package natsjs

import (
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

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
	case jetstream.MsgIDHeader, HeaderCommitLSN, HeaderSeq, HeaderTxSize, HeaderXid, HeaderTable, HeaderOp, HeaderRun:
		return true
	}
	return false
}

// recycle takes back m, a message whose publish is resolved: nats.go
// encoded it during the publish call and keeps no reference it reads
// later. m must not be used afterwards. Its header keeps only the keys of
// ownHeader: the rest (the change's own headers, Nats-Expected-Stream,
// whose value is shared by every message, the fence's, a batch's) may
// share their value slices and go.
func (s *Sink) recycle(m *nats.Msg) {
	if m == nil || m.Header == nil || len(m.Header) > 32 {
		return
	}
	h := m.Header
	delete(h, jetstream.ExpectedStreamHeader)
	delete(h, jetstream.ExpectedLastSeqHeader)
	own := 7 // ownHeader's keys buildMsg always sets; HeaderTable when the change has a table
	if _, ok := h[HeaderTable]; ok {
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

// appendID appends c.ID() to dst without allocating.
func appendID(dst []byte, c *cdc.Change) []byte {
	if c.MsgID != "" { // a snapshot read's own identity
		return append(dst, c.MsgID...)
	}
	const digits = "0123456789ABCDEF"
	dst = append(dst, c.Producer...)
	dst = append(dst, ':')
	v := uint64(c.CommitLSN)
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, digits[(v>>uint(shift))&0xF])
	}
	dst = append(dst, ':')
	return strconv.AppendUint(dst, uint64(c.Seq), 10)
}
