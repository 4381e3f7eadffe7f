package e2e_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/checker"
)

// TestKVBucketDeletedRestartKeepsFence deletes the checkpoint bucket under
// a running bridge (which stops, TestFaultKVBucketDeleted) while writers
// go on, and starts it again. The restart starts a new epoch at the slot's
// confirmed position, and the stream's messages of the previous epoch are
// its own history, not another writer's: the fence stays on. Every message
// of the new epoch is published fenced (fencedAfter), and a message of
// the previous epoch stored behind the bridge's back (a zombie's) makes its
// next publish fail as fenced instead of landing behind it; the run starts
// again and goes on, still fenced. Each epoch holds each change at most
// once, in order: the old one a prefix of every writer's commits, the new
// one the rest from the slot's confirmed position on (the changes between
// that position and the deletion are in both, under different ids, as
// docs/operations.md says).
func TestKVBucketDeletedRestartKeepsFence(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	w := newSeqWorkload(t, e)
	cfg := faultConfig(e, "kvfence", e.pg.DSN(""), e.natsURL(), "")
	r := e.start(cfg)
	waitReady(t, r)
	w.start(2, 2*time.Millisecond)
	e.waitStored("CDC_kvfence", 200, time.Minute)
	js := natsJS(t, e)
	require.NoError(t, js.DeleteKeyValue(t.Context(), "bridge_checkpoints"))
	select {
	case err := <-r.done:
		r.cancel = nil
		require.ErrorContains(t, err, "deleted")
	case <-time.After(60 * time.Second):
		t.Fatal("the bridge went on without its checkpoint bucket")
	}
	var confirmed string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_kvfence'`).Scan(&confirmed))
	from, err := cdc.ParseLSN(confirmed)
	require.NoError(t, err)
	before := e.messages("CDC_kvfence")
	oldProducer, _, err := cdc.ParseID(before[0].ID)
	require.NoError(t, err)
	t.Logf("the bridge stopped with %d messages stored; slot confirmed at %s", len(before), confirmed)

	// Restart, its log kept to read.
	out := &syncBuffer{}
	tw := &testWriter{t: t}
	t.Cleanup(func() { tw.mu.Lock(); tw.done = true; tw.mu.Unlock() })
	log := slog.New(slog.NewTextHandler(io.MultiWriter(out, tw), &slog.HandlerOptions{Level: slog.LevelDebug}))
	r2 := e.startWith(cfg, app.WithLogger(log))
	waitReady(t, r2)
	e.waitStored("CDC_kvfence", len(before)+200, time.Minute)

	// A write of the previous epoch behind the bridge's back, while the
	// bridge is idle: its next Write's first publish, which goes alone,
	// meets it. (A foreign message landing among a Write's pipelined
	// publishes can refuse one and let the next ones match the chain
	// again; that hole of the fence is reported separately.)
	w.halt()
	// Idle: every committed row stored (each is, in one epoch or the
	// other), then a second without a new message. A quiet second alone
	// can be a pause of a loaded machine in the middle of the backlog.
	waitAllRows(t, e, "CDC_kvfence", w.truth(t, e, 0))
	quiet(t, e, "CDC_kvfence")
	zombieID := oldProducer + ":FFFFFFFFFFFFFFF0:0"
	zm := nats.NewMsg("cdc.kvfence.public.fw")
	zm.Header.Set("Nats-Msg-Id", zombieID)
	zm.Data = []byte(`{"zombie":true}`)
	_, err = js.PublishMsg(t.Context(), zm)
	require.NoError(t, err)
	// More rows, as a writer of their own (writer 9, one row per transaction).
	for i := 1; i <= 100; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO fw (writer, wseq, part, parts) VALUES (9, %d, 0, 1)`, i))
	}
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "natsjs: fenced") },
		30*time.Second, 50*time.Millisecond, "the bridge's next publish was not refused: the fence is off")
	want := w.truth(t, e, 0)
	waitAllRows(t, e, "CDC_kvfence", want)
	time.Sleep(time.Second) // anything still on its way
	all := e.messages("CDC_kvfence")
	r2.stop(t)

	require.NotContains(t, out.String(), "other writers", "the previous epoch's messages were taken for another writer's")
	// Split by epoch; the zombie's message is neither.
	var oldMs, newMs []msg
	newProducer := ""
	for i, m := range all {
		p, _, err := cdc.ParseID(m.ID)
		require.NoError(t, err)
		switch {
		case m.ID == zombieID:
		case p == oldProducer:
			require.Empty(t, newMs, "seq %d: a message of the old epoch after the new one started", m.Seq)
			oldMs = append(oldMs, m)
		default:
			require.True(t, newProducer == "" || newProducer == p, "seq %d: a third producer %s", m.Seq, p)
			newProducer = p
			newMs = append(newMs, m)
			require.True(t, i > 0 && fencedAfter(m, all[i-1]), "seq %d: published without the fence (%v)", m.Seq, m.Header)
		}
	}
	require.NotEmpty(t, newMs)
	require.True(t, strings.HasPrefix(newProducer, "kvfence.app."), newProducer)
	require.Greater(t, uint64(newMs[0].Pos.LSN), uint64(from), "the new epoch starts after the slot's confirmed position")
	checkOrdered(t, oldMs)
	checkOrdered(t, newMs)

	// Per writer: the old epoch holds a prefix of its commits (its last
	// transaction maybe in part: it stopped mid-Write), the new one the
	// rest from some point in that prefix, whole transactions, each once.
	byWriter := map[int][]checker.Want{} // in commit order
	for _, wt := range want {
		byWriter[wt.Writer] = append(byWriter[wt.Writer], wt)
	}
	keysOf := func(ms []msg) map[string]bool {
		out := map[string]bool{}
		for _, g := range stream(t, ms) {
			out[g.Key] = true
		}
		return out
	}
	oldKeys, newKeys := keysOf(oldMs), keysOf(newMs)
	overlap := 0
	var wantOld, wantNew []checker.Want
	for wr, ws := range byWriter {
		a := 0 // old holds ws[:a]
		for a < len(ws) && oldKeys[ws[a].Key] {
			a++
		}
		b := len(ws) // new holds ws[b:]
		for b > 0 && newKeys[ws[b-1].Key] {
			b--
		}
		require.LessOrEqual(t, b, a, "writer %d: its rows %d to %d are in neither epoch", wr, a, b)
		overlap += a - b
		wantOld = append(wantOld, ws[:a]...)
		wantNew = append(wantNew, ws[b:]...)
	}
	rep := checker.Compare(wantOld, stream(t, oldMs))
	t.Logf("old epoch: %s", rep)
	require.Empty(t, rep.Missing, "old epoch")
	require.Empty(t, rep.Unexpected, "old epoch")
	require.Empty(t, rep.Duplicates, "old epoch")
	require.Empty(t, rep.OutOfOrder, "old epoch")
	rep = checker.Compare(wantNew, stream(t, newMs))
	t.Logf("new epoch: %s", rep)
	require.True(t, rep.OK(), "new epoch: %s", rep)
	// A change in both epochs has the same position in both (ids differ
	// only in the producer): consumers can tell the repeats.
	oldPos := map[string]cdc.Pos{}
	for _, g := range stream(t, oldMs) {
		oldPos[g.Key] = g.Pos
	}
	for _, g := range stream(t, newMs) {
		if p, ok := oldPos[g.Key]; ok {
			require.Equal(t, p, g.Pos, "row %s", g.Key)
		}
	}
	t.Logf("%d changes in both epochs (between the slot's confirmed position and the deletion)", overlap)
}

// waitAllRows waits until stream name holds every row of want, under any
// producer.
func waitAllRows(t *testing.T, e *env, name string, want []checker.Want) {
	t.Helper()
	require.Eventually(t, func() bool {
		keys := map[string]bool{}
		for _, g := range stream(t, e.messages(name)) {
			keys[g.Key] = true
		}
		for _, wt := range want {
			if !keys[wt.Key] {
				return false
			}
		}
		return true
	}, 2*time.Minute, 500*time.Millisecond, "not every committed row arrived")
}

// quiet waits until stream has stopped growing for a second.
func quiet(t *testing.T, e *env, stream string) {
	t.Helper()
	last, since := storedCount(t, e, stream), time.Now()
	deadline := time.Now().Add(time.Minute)
	for time.Since(since) < time.Second {
		require.True(t, time.Now().Before(deadline), "stream %s never stopped growing", stream)
		time.Sleep(100 * time.Millisecond)
		if n := storedCount(t, e, stream); n != last {
			last, since = n, time.Now()
		}
	}
}
