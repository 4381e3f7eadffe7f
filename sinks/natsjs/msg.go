package natsjs

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// header returns an empty header map for about n keys, reused from an
// acknowledged message when one is available.
func (s *Sink) header(n int) nats.Header {
	if h, ok := s.hdrs.Get().(nats.Header); ok {
		return h
	}
	return make(nats.Header, n)
}

// recycle takes back the header map of m, a message whose publish is
// resolved: nats.go encoded it during the publish call and keeps no
// reference it reads later. m must not be used afterwards.
func (s *Sink) recycle(m *nats.Msg) {
	if m == nil || m.Header == nil || len(m.Header) > 32 {
		return
	}
	clear(m.Header)
	s.hdrs.Put(m.Header)
	m.Header = nil
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
