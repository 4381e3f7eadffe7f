package natsjs

import (
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
)

// TestToMsgRecycledHeaders checks the headers toMsg sets, also when the map
// comes back from an acknowledged message that carried other keys.
func TestToMsgRecycledHeaders(t *testing.T) {
	s := &Sink{run: "r1", log: slog.New(slog.DiscardHandler)}
	row := cdc.Change{Producer: "b.src.ep", CommitLSN: 0x16_B374D848, Seq: 3, TxSize: 7, Xid: 991, Schema: "public", Table: "items",
		Op: cdc.OpInsert, Subject: "cdc.items", Payload: []byte("{}"), Headers: map[string]string{"traceparent": "00-x", "Nats-Rollup": "all"}}
	msg := cdc.Change{Producer: "b.src.ep", CommitLSN: 0x1_00000000, Seq: 0, TxSize: 1, Xid: 5, Op: cdc.OpMessage, Prefix: "app", Subject: "cdc.msg"}
	want := func(c *cdc.Change) nats.Header {
		h := nats.Header{}
		h.Set("Nats-Msg-Id", c.ID())
		h.Set(HeaderCommitLSN, c.CommitLSN.String())
		h.Set(HeaderSeq, "3")
		h.Set(HeaderTxSize, "7")
		h.Set(HeaderXid, "991")
		h.Set(HeaderTable, "public.items")
		h.Set(HeaderOp, "insert")
		h.Set(HeaderRun, "r1")
		h.Set("traceparent", "00-x")
		return h
	}
	wantMsg := nats.Header{}
	wantMsg.Set("Nats-Msg-Id", "b.src.ep:0000000100000000:0")
	wantMsg.Set(HeaderCommitLSN, "1/0")
	wantMsg.Set(HeaderSeq, "0")
	wantMsg.Set(HeaderTxSize, "1")
	wantMsg.Set(HeaderXid, "5")
	wantMsg.Set(HeaderOp, "message")
	wantMsg.Set(HeaderRun, "r1")
	shared := []string{"CDC"} // Sink.expStream: one slice in every message
	for range 3 {
		m, size := s.buildMsg(&row)
		assert.Equal(t, want(&row), m.Header)
		assert.Equal(t, natsconn.HeaderSize(m.Header), size, "the size buildMsg counts")
		assert.Equal(t, "b.src.ep:00000016B374D848:3", m.Header.Get("Nats-Msg-Id"))
		m.Header["Nats-Expected-Stream"] = shared // as write.publish does
		m.Header.Set("Nats-Expected-Last-Sequence", "12")
		m.Reply = "_INBOX.x.1"
		s.recycle(m)
		assert.Equal(t, []string{"CDC"}, shared, "a recycled message's shared values are left alone")
		m, size = s.buildMsg(&msg)
		assert.Equal(t, wantMsg, m.Header)
		assert.Equal(t, nats.Msg{Subject: "cdc.msg", Header: m.Header}, *m, "nothing else kept from the recycled message")
		assert.Equal(t, natsconn.HeaderSize(m.Header), size)
		s.recycle(m)
		// A logical message (no table) with a header of its own, then a
		// change without one: the header must not carry over.
		traced := msg
		traced.Headers = map[string]string{"traceparent": "00-y"}
		m, _ = s.buildMsg(&traced)
		assert.Equal(t, "00-y", m.Header.Get("traceparent"))
		s.recycle(m)
		plain := row
		plain.Headers = nil
		m, _ = s.buildMsg(&plain)
		assert.NotContains(t, m.Header, "traceparent", "the headers of a change published before do not carry over")
		s.recycle(m)
	}
}

// TestToMsgSnapshotID: a change with its own identity (a snapshot read)
// is published under it, not under its position.
func TestToMsgSnapshotID(t *testing.T) {
	s := &Sink{run: "r1", log: slog.New(slog.DiscardHandler)}
	c := cdc.Change{Producer: "b.src.ep", CommitLSN: 0x15AECF8, Seq: 2, TxSize: 3, Schema: "public", Table: "t", Op: cdc.OpRead,
		MsgID: "b.src.ep.snap-abc:00000000015AECF8:7", Subject: "cdc.t"}
	m := s.toMsg(&c)
	assert.Equal(t, "b.src.ep.snap-abc:00000000015AECF8:7", m.Header.Get("Nats-Msg-Id"))
	assert.Equal(t, "0/15AECF8", m.Header.Get(HeaderCommitLSN))
	assert.Equal(t, "2", m.Header.Get(HeaderSeq))
}
