package natskv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/natskv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

// newSink builds a connected sink on url, bucket "ROWS" plus extra config.
func newSink(t testing.TB, url string, extra map[string]any) sinks.Sink {
	t.Helper()
	raw := map[string]any{"url": url, "bucket": "ROWS", "ack_timeout": "5s"}
	for k, v := range extra {
		raw[k] = v
	}
	s, err := natskv.New((*config.Config)(nil).Decoder("sinks.kv.config", raw), sinks.Env{Name: "kv"})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	require.NoError(t, s.Connect(t.Context()))
	return s
}

var (
	// items has a composite key (order_id, sku) and a text column.
	items = &cdc.Relation{Schema: "public", Table: "items", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "order_id", Type: "int8", Key: true},
		{Name: "note", Type: "text"},
		{Name: "sku", Type: "text", Key: true},
	}}
	// keyless has no key columns (REPLICA IDENTITY FULL without a primary key).
	keyless = &cdc.Relation{Schema: "public", Table: "log", ReplicaIdentity: 'f', Columns: []cdc.Column{
		{Name: "line", Type: "text"},
	}}
)

// chg builds a change of producer at (lsn, seq) of rel.
func chg(producer string, lsn cdc.LSN, seq uint32, op cdc.Op, rel *cdc.Relation, before, after []any) cdc.Change {
	c := cdc.Change{Producer: producer, Source: "main", CommitLSN: lsn, Seq: seq, TxSize: seq + 1, Xid: uint32(lsn),
		Op: op, Rel: rel, Before: before, After: after, Headers: map[string]string{"traceparent": "00-1-2-01"}}
	if rel != nil {
		c.Schema, c.Table = rel.Schema, rel.Table
	}
	c.Payload = fmt.Appendf(nil, `{"id":%q,"op":%q,"after":%q}`, c.ID(), op, fmt.Sprint(after))
	return c
}

func write(t testing.TB, s sinks.Sink, batch ...cdc.Change) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Write(ctx, batch))
}

// bucket is what the test reads of the ROWS bucket.
type bucket struct {
	t  testing.TB
	nc *nats.Conn
	kv jetstream.KeyValue
	st jetstream.Stream
}

func openBucket(t testing.TB, url string) *bucket {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), "ROWS")
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), "KV_ROWS")
	require.NoError(t, err)
	return &bucket{t: t, nc: nc, kv: kv, st: st}
}

// id returns the Bridge-Id of key's last message, "" when it has none,
// and "DEL:"/"PURGE:" before it for a delete or purge marker.
func (b *bucket) id(key string) string {
	b.t.Helper()
	m, err := b.st.GetLastMsgForSubject(b.t.Context(), "$KV.ROWS."+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ""
	}
	require.NoError(b.t, err)
	id := m.Header.Get(natskv.HeaderID)
	if op := m.Header.Get("KV-Operation"); op != "" {
		return op + ":" + id
	}
	return id
}

// keys returns the keys the bucket holds values for (no deleted ones).
func (b *bucket) keys() []string {
	b.t.Helper()
	ks, err := b.kv.ListKeys(b.t.Context())
	require.NoError(b.t, err)
	var out []string
	for k := range ks.Keys() {
		out = append(out, k)
	}
	return out
}

func TestKeys(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	b := openBucket(t, srv.URL())
	const p = "shop.main.e1"
	cities := &cdc.Relation{Schema: "Geo Data", Table: "cities", Columns: []cdc.Column{{Name: "name", Type: "text", Key: true}}}
	write(t, s,
		chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(42), "n", "A-1"}),
		chg(p, 0x100, 1, cdc.OpInsert, items, nil, []any{int64(42), "n", "b.2 x"}),
		chg(p, 0x100, 2, cdc.OpInsert, cities, nil, []any{"München"}),
		chg(p, 0x100, 3, cdc.OpInsert, cities, nil, []any{""}),
		chg(p, 0x100, 4, cdc.OpInsert, cities, nil, []any{"a=b"}),
	)
	require.ElementsMatch(t, []string{
		"public.items.42.A-1",
		"public.items.42.b=2E2=20x",
		"Geo=20Data.cities.M=C3=BCnchen",
		"Geo=20Data.cities.=",
		"Geo=20Data.cities.a=3Db",
	}, b.keys())
	for _, k := range b.keys() {
		schema, table, vals, err := natskv.ParseKey(k, "")
		require.NoError(t, err)
		require.Equal(t, k, natskv.RowKey("", schema, table, vals...), "ParseKey undoes RowKey")
	}

	// An update that changes the key moves the row: the old key is deleted.
	up := chg(p, 0x200, 0, cdc.OpUpdate, items, []any{int64(42), cdc.Absent, "A-1"}, []any{int64(43), "n", "A-1"})
	write(t, s, up)
	require.Equal(t, "DEL:"+up.ID(), b.id("public.items.42.A-1"))
	require.Equal(t, up.ID(), b.id("public.items.43.A-1"))

	// A key column whose TOASTed value did not change comes from the old row.
	tu := chg(p, 0x300, 0, cdc.OpUpdate, cities, []any{"München"}, []any{cdc.Unchanged})
	write(t, s, tu)
	require.Equal(t, tu.ID(), b.id("Geo=20Data.cities.M=C3=BCnchen"))
}

// TestKeyPrefix: key_prefix starts every key, ParseKey removes it.
func TestKeyPrefix(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), map[string]any{"key_prefix": "shop.v1"})
	b := openBucket(t, srv.URL())
	c := chg("p.s.e", 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "n", "x"})
	write(t, s, c)
	require.Equal(t, []string{"shop.v1.public.items.1.x"}, b.keys())
	schema, table, vals, err := natskv.ParseKey("shop.v1.public.items.1.x", "shop.v1")
	require.NoError(t, err)
	require.Equal(t, []string{"public", "items", "1", "x"}, append([]string{schema, table}, vals...))
	_, _, _, err = natskv.ParseKey("public.items.1.x", "shop.v1")
	require.Error(t, err)
}

// TestUnkeyable: a row the sink cannot key fails for good, naming the
// table and the fix; the other changes of the batch are written.
func TestUnkeyable(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	b := openBucket(t, srv.URL())
	ok := chg("p.s.e", 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "n", "x"})
	noKey := chg("p.s.e", 0x100, 1, cdc.OpInsert, keyless, nil, []any{"hello"})
	nullKey := chg("p.s.e", 0x100, 2, cdc.OpInsert, items, nil, []any{nil, "n", "x"})
	err := s.Write(t.Context(), []cdc.Change{ok, noKey, nullKey})
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.Equal(t, []int{1, 2}, be.Indexes())
	require.True(t, sinks.IsPermanent(be.Failed[1]))
	require.Contains(t, be.Failed[1].Error(), "public.log")
	require.Contains(t, be.Failed[1].Error(), "ADD PRIMARY KEY")
	require.True(t, sinks.IsPermanent(be.Failed[2]))
	require.Contains(t, be.Failed[2].Error(), `key column "order_id" is null`)
	require.Equal(t, ok.ID(), b.id("public.items.1.x"))
}

// TestGuard: a replayed or retried change never replaces a later value of
// its producer; a value of another producer, or not the bridge's, is
// replaced.
func TestGuard(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	b := openBucket(t, newSinkURL(t, srv))
	const p = "shop.main.e1"
	ins := chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v1", "x"})
	upd := chg(p, 0x200, 0, cdc.OpUpdate, items, nil, []any{int64(1), "v2", "x"})
	del := chg(p, 0x300, 0, cdc.OpDelete, items, []any{int64(1), cdc.Absent, "x"}, nil)
	ins2 := chg(p, 0x400, 0, cdc.OpInsert, items, nil, []any{int64(2), "v1", "x"})
	s := newSink(t, srv.URL(), nil)
	write(t, s, ins, upd, del, ins2)
	require.Equal(t, "DEL:"+del.ID(), b.id("public.items.1.x"))
	last := lastSeq(t, b)

	// The same batch again, a part of it, each change alone, by this
	// instance and by a fresh one (a restart): nothing is written.
	write(t, s, ins, upd, del, ins2)
	write(t, s, upd)
	fresh := newSink(t, srv.URL(), nil)
	write(t, fresh, ins)
	write(t, fresh, upd, ins2)
	require.Equal(t, last, lastSeq(t, b), "a replay wrote to the bucket")
	require.Equal(t, "DEL:"+del.ID(), b.id("public.items.1.x"))

	// Another producer (a new epoch after a resync) replaces the value,
	// even at an earlier position.
	other := chg("shop.main.e2", 0x50, 0, cdc.OpInsert, items, nil, []any{int64(1), "v3", "x"})
	write(t, fresh, other)
	require.Equal(t, other.ID(), b.id("public.items.1.x"))

	// A value the bridge did not write is replaced.
	_, err := b.kv.Put(t.Context(), "public.items.2.x", []byte("by hand"))
	require.NoError(t, err)
	ins3 := chg(p, 0x500, 0, cdc.OpUpdate, items, nil, []any{int64(2), "v2", "x"})
	write(t, fresh, ins3)
	require.Equal(t, ins3.ID(), b.id("public.items.2.x"))
}

// newSinkURL creates the bucket through a sink and returns the server's URL.
func newSinkURL(t testing.TB, srv *natsembed.Server) string {
	t.Helper()
	newSink(t, srv.URL(), nil)
	return srv.URL()
}

func lastSeq(t testing.TB, b *bucket) uint64 {
	t.Helper()
	info, err := b.st.Info(t.Context())
	require.NoError(t, err)
	return info.State.LastSeq
}

// TestGuardRace: a key written behind the sink's back after it read it is
// read again, not overwritten blindly, and not lost.
func TestGuardRace(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	b := openBucket(t, srv.URL())
	const p = "shop.main.e1"
	write(t, s, chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v1", "x"})) // s now knows the key
	// Another instance of the same producer writes a later change.
	later := chg(p, 0x300, 0, cdc.OpUpdate, items, nil, []any{int64(1), "v3", "x"})
	write(t, newSink(t, srv.URL(), nil), later)
	// s, behind, writes a change between the two: its expectation fails,
	// it reads the key again and sees the later value.
	mid := chg(p, 0x200, 0, cdc.OpUpdate, items, nil, []any{int64(1), "v2", "x"})
	write(t, s, mid)
	require.Equal(t, later.ID(), b.id("public.items.1.x"), "an earlier change overwrote a later one")
	// And a change after both is written.
	next := chg(p, 0x400, 0, cdc.OpUpdate, items, nil, []any{int64(1), "v4", "x"})
	write(t, s, next)
	require.Equal(t, next.ID(), b.id("public.items.1.x"))
}

// TestFolding: a Write keeps each key's last change only; the rest of the
// batch is in effect.
func TestFolding(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), map[string]any{"history": 10})
	b := openBucket(t, srv.URL())
	const p = "shop.main.e1"
	var batch []cdc.Change
	for i := range 20 {
		batch = append(batch, chg(p, cdc.LSN(0x100+i), 0, cdc.OpUpdate, items, nil, []any{int64(i % 2), fmt.Sprint(i), "x"}))
	}
	write(t, s, batch...)
	require.Equal(t, batch[18].ID(), b.id("public.items.0.x"))
	require.Equal(t, batch[19].ID(), b.id("public.items.1.x"))
	require.Equal(t, uint64(2), lastSeq(t, b), "one write per key")
}

// TestDeletes: delete markers, or purge markers that drop the history.
func TestDeletes(t *testing.T) {
	for _, mode := range []string{"delete", "purge"} {
		t.Run(mode, func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			s := newSink(t, srv.URL(), map[string]any{"history": 5, "delete": mode})
			b := openBucket(t, srv.URL())
			const p = "shop.main.e1"
			write(t, s, chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v1", "x"}))
			write(t, s, chg(p, 0x200, 0, cdc.OpUpdate, items, nil, []any{int64(1), "v2", "x"}))
			del := chg(p, 0x300, 0, cdc.OpDelete, items, []any{int64(1), cdc.Absent, "x"}, nil)
			write(t, s, del)
			_, err := b.kv.Get(t.Context(), "public.items.1.x")
			require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
			hist, err := b.kv.History(t.Context(), "public.items.1.x")
			require.NoError(t, err)
			want := map[string]int{"delete": 3, "purge": 1}[mode]
			require.Len(t, hist, want, "revisions kept")
			m, err := b.st.GetLastMsgForSubject(t.Context(), "$KV.ROWS.public.items.1.x")
			require.NoError(t, err)
			require.Equal(t, map[string]string{"delete": "DEL", "purge": "PURGE"}[mode], m.Header.Get("KV-Operation"))
			require.Equal(t, string(del.Payload), string(m.Data), "the marker carries the delete's payload")
			require.Equal(t, del.ID(), m.Header.Get(natskv.HeaderID))
		})
	}
}

// TestNotRows: logical messages and control messages write nothing.
func TestNotRows(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	b := openBucket(t, srv.URL())
	msg := cdc.Change{Producer: "p.s.e", CommitLSN: 0x100, Op: cdc.OpMessage, Prefix: "app", Content: []byte("x"), Payload: []byte("{}")}
	ctl, err := cdc.Control{Kind: cdc.ControlResync, Producer: "p.s.e2"}.Change("p.s.e2", "s", "db")
	require.NoError(t, err)
	write(t, s, msg, ctl)
	require.Equal(t, uint64(0), lastSeq(t, b))
}

// TestTruncate: a TRUNCATE purges the table's keys (tombstones too) and no
// other table's; replayed changes from before it, and the truncate itself,
// write nothing; changes after it are written.
func TestTruncate(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), map[string]any{"history": 5})
	b := openBucket(t, srv.URL())
	const p = "shop.main.e1"
	other := &cdc.Relation{Schema: "public", Table: "items_archive", Columns: items.Columns}
	before := []cdc.Change{
		chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v1", "x"}),
		chg(p, 0x100, 1, cdc.OpInsert, items, nil, []any{int64(2), "v1", "x"}),
		chg(p, 0x100, 2, cdc.OpDelete, items, []any{int64(2), cdc.Absent, "x"}, nil),
		chg(p, 0x100, 3, cdc.OpInsert, other, nil, []any{int64(1), "v1", "x"}),
	}
	trunc := chg(p, 0x200, 0, cdc.OpTruncate, items, nil, nil)
	after := chg(p, 0x300, 0, cdc.OpInsert, items, nil, []any{int64(3), "v1", "x"})
	write(t, s, append(append(before, trunc), after)...)
	require.ElementsMatch(t, []string{"public.items.3.x", "public.items_archive.1.x", "public.items"}, b.keys())
	require.Equal(t, "", b.id("public.items.2.x"), "the tombstone is purged too")
	m, err := b.st.GetLastMsgForSubject(t.Context(), "$KV.ROWS.public.items")
	require.NoError(t, err)
	require.Equal(t, "done", m.Header.Get(natskv.HeaderTruncate))
	require.Equal(t, trunc.ID(), m.Header.Get(natskv.HeaderID))
	last := lastSeq(t, b)

	// A replay from before the truncate, by a fresh instance: nothing.
	fresh := newSink(t, srv.URL(), map[string]any{"history": 5})
	write(t, fresh, append(append(before[:3:3], trunc), after)...)
	write(t, fresh, before[0])
	require.Equal(t, last, lastSeq(t, b), "a replay wrote to the bucket")
	require.ElementsMatch(t, []string{"public.items.3.x", "public.items_archive.1.x", "public.items"}, b.keys())
}

// TestTruncateInterrupted: a truncate whose purge may not have happened
// (its "started" record is all there is) purges again when replayed.
func TestTruncateInterrupted(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	b := openBucket(t, srv.URL())
	const p = "shop.main.e1"
	ins := chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v1", "x"})
	write(t, s, ins)
	trunc := chg(p, 0x200, 0, cdc.OpTruncate, items, nil, nil)
	// What a crash right after the "started" record leaves.
	m := nats.NewMsg("$KV.ROWS.public.items")
	for k, v := range map[string]string{natskv.HeaderID: trunc.ID(), natskv.HeaderProducer: p, natskv.HeaderCommitLSN: trunc.CommitLSN.String(),
		natskv.HeaderSeq: "0", natskv.HeaderTruncate: "started"} {
		m.Header.Set(k, v)
	}
	js, err := jetstream.New(b.nc)
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), m)
	require.NoError(t, err)

	fresh := newSink(t, srv.URL(), nil)
	write(t, fresh, ins) // before the truncate: skipped, though the row is still there
	require.Equal(t, ins.ID(), b.id("public.items.1.x"))
	write(t, fresh, trunc)
	require.Equal(t, []string{"public.items"}, b.keys())
	mk, err := b.st.GetLastMsgForSubject(t.Context(), "$KV.ROWS.public.items")
	require.NoError(t, err)
	require.Equal(t, "done", mk.Header.Get(natskv.HeaderTruncate))
}

// TestTooLarge: a value over the server's max_payload fails for good,
// with the fix.
func TestTooLarge(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{MaxPayload: 4096})
	s := newSink(t, srv.URL(), nil)
	c := chg("p.s.e", 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v", "x"})
	c.Payload = []byte(`{"note":"` + strings.Repeat("x", 5000) + `"}`)
	err := s.Write(t.Context(), []cdc.Change{c})
	require.Error(t, err)
	require.True(t, sinks.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "max_payload")
	require.Contains(t, err.Error(), "public.items.1.x")
}

// TestBucketSetup: the bucket is created with history and replicas, an
// existing one updated; without create_bucket a missing one is an error
// with the fix.
func TestBucketSetup(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	raw := map[string]any{"url": srv.URL(), "bucket": "MISSING", "create_bucket": false}
	s, err := natskv.New((*config.Config)(nil).Decoder("sinks.kv.config", raw), sinks.Env{Name: "kv"})
	require.NoError(t, err)
	defer s.Close(context.Background())
	err = s.Connect(t.Context())
	require.ErrorContains(t, err, "nats kv add MISSING")
	require.ErrorContains(t, err, "create_bucket: true")

	newSink(t, srv.URL(), map[string]any{"history": 7})
	b := openBucket(t, srv.URL())
	st, err := b.kv.Status(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(7), st.History())
	newSink(t, srv.URL(), map[string]any{"history": 3})
	st, err = b.kv.Status(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(3), st.History(), "create_bucket updates the history")
}

// TestConfigErrors: every invalid key is reported with its YAML path.
func TestConfigErrors(t *testing.T) {
	raw := map[string]any{"bucket": "a.b", "key_prefix": "x..y", "delete": "drop", "history": 65, "replicas": 0, "ack_timeout": "0s"}
	_, err := natskv.New((*config.Config)(nil).Decoder("sinks.kv.config", raw), sinks.Env{Name: "kv"})
	require.Error(t, err)
	for _, want := range []string{"sinks.kv.config.bucket", "sinks.kv.config.key_prefix", "sinks.kv.config.delete",
		"sinks.kv.config.history", "sinks.kv.config.replicas", "sinks.kv.config.ack_timeout"} {
		require.Contains(t, err.Error(), want)
	}
	_, err = natskv.New((*config.Config)(nil).Decoder("sinks.kv.config", map[string]any{}), sinks.Env{Name: "kv"})
	require.ErrorContains(t, err, "sinks.kv.config.bucket")
}

// TestTombstones: a route's Debezium tombstone after a delete (a copy of
// the delete with an empty payload, its destination "<route>~tombstone")
// writes nothing: the delete's marker, with the delete's payload and id,
// is the row's end, once, whether the tombstone comes in the delete's
// Write or in the next.
func TestTombstones(t *testing.T) {
	for _, sameWrite := range []bool{true, false} {
		t.Run(fmt.Sprintf("same_write=%v", sameWrite), func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{})
			s := newSink(t, srv.URL(), map[string]any{"history": 5})
			b := openBucket(t, srv.URL())
			const p = "shop.main.e1"
			write(t, s, chg(p, 0x100, 0, cdc.OpInsert, items, nil, []any{int64(1), "v1", "x"}))
			del := chg(p, 0x200, 0, cdc.OpDelete, items, []any{int64(1), cdc.Absent, "x"}, nil)
			tomb := del
			tomb.Payload, tomb.TxSize, tomb.Dest = []byte{}, 0, "dbz"+cdc.TombstoneDest
			if sameWrite {
				write(t, s, del, tomb)
			} else {
				write(t, s, del)
				write(t, s, tomb)
			}
			hist, err := b.kv.History(t.Context(), "public.items.1.x")
			require.NoError(t, err)
			require.Len(t, hist, 2, "the insert and one delete marker")
			m, err := b.st.GetLastMsgForSubject(t.Context(), "$KV.ROWS.public.items.1.x")
			require.NoError(t, err)
			require.Equal(t, "DEL", m.Header.Get("KV-Operation"))
			require.Equal(t, string(del.Payload), string(m.Data), "the marker carries the delete's payload")
			require.Equal(t, del.ID(), m.Header.Get(natskv.HeaderID))
		})
	}
}
