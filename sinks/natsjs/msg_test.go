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
	s := &Sink{log: slog.New(slog.DiscardHandler)}
	row := cdc.Change{Producer: "b.src.ep", CommitLSN: 0x16_B374D848, Seq: 3, TxSize: 7, Xid: 991, Schema: "public", Table: "items",
		Op: cdc.OpInsert, Subject: "cdc.items", Payload: []byte("{}"), Headers: map[string]string{"traceparent": "00-x", "Nats-Rollup": "all"}}
	msg := cdc.Change{Producer: "b.src.ep", CommitLSN: 0x1_00000000, Seq: 0, TxSize: 1, Xid: 5, Op: cdc.OpMessage, Prefix: "app", Subject: "cdc.msg"}
	want := func(c *cdc.Change) nats.Header {
		h := nats.Header{}
		h.Set("Nats-Msg-Id", c.ID())
		h.Set(HeaderTxSize, "7")
		h.Set(HeaderTable, "public.items")
		h.Set(HeaderOp, "insert")
		h.Set("traceparent", "00-x")
		return h
	}
	wantMsg := nats.Header{}
	wantMsg.Set("Nats-Msg-Id", "b.src.ep:0000000100000000:0")
	wantMsg.Set(HeaderTxSize, "1")
	wantMsg.Set(HeaderOp, "message")
	for range 3 {
		m, size := s.buildMsg(&row)
		assert.Equal(t, want(&row), m.Header)
		assert.Equal(t, natsconn.HeaderSize(m.Header), size, "the size buildMsg counts")
		assert.Equal(t, "b.src.ep:00000016B374D848:3", m.Header.Get("Nats-Msg-Id"))
		m.Header.Set("Nats-Expected-Last-Sequence", "12") // as a publish adds them
		m.Header.Set("Nats-Expected-Last-Msg-Id", "b.src.ep:00000016B374D848:2")
		m.Reply = "_INBOX.x.1"
		s.recycle(m)
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
		// A change of a transaction whose size is not known yet (one the
		// source started to hand over before its end): no size, not the
		// last message's.
		early := row
		early.TxSize = 0
		m, size = s.buildMsg(&early)
		assert.NotContains(t, m.Header, HeaderTxSize)
		assert.Equal(t, natsconn.HeaderSize(m.Header), size)
		s.recycle(m)
	}
}

// TestToMsgSnapshotID: a change with its own identity (a snapshot read)
// is published under it, not under its position.
func TestToMsgSnapshotID(t *testing.T) {
	s := &Sink{log: slog.New(slog.DiscardHandler)}
	c := cdc.Change{Producer: "b.src.ep", CommitLSN: 0x15AECF8, Seq: 2, TxSize: 3, Schema: "public", Table: "t", Op: cdc.OpRead,
		MsgID: "b.src.ep.snap-abc:00000000015AECF8:7", Subject: "cdc.t"}
	m := s.toMsg(&c)
	assert.Equal(t, "b.src.ep.snap-abc:00000000015AECF8:7", m.Header.Get("Nats-Msg-Id"))
	assert.Equal(t, "3", m.Header.Get(HeaderTxSize))
}
