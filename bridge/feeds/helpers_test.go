package feeds

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/natsjs"
)

// env is a real nats-server with the CDC stream, the real natsjs sink
// writing to it, and a generator of bridge changes.
type env struct {
	t    testing.TB
	srv  *natsembed.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	sink *natsjs.Sink
	gen  *gen
}

func newEnv(t testing.TB, streamCfg *jetstream.StreamConfig) *env {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	e := &env{t: t, srv: srv, gen: newGen("b.src.e1")}
	e.connect()
	sc := jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}, Storage: jetstream.FileStorage, Duplicates: time.Minute}
	if streamCfg != nil {
		sc = *streamCfg
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := e.js.CreateStream(ctx, sc)
	require.NoError(t, err)
	raw := map[string]any{"url": srv.URL(), "stream": "CDC", "create_stream": false, "ack_timeout": "5s"}
	sk, err := natsjs.New(decoderFor(raw), sinks.Env{Name: "main"})
	require.NoError(t, err)
	e.sink = sk.(*natsjs.Sink)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.sink.Close(ctx)
	})
	require.NoError(t, e.sink.Connect(ctx))
	return e
}

func (e *env) connect() {
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(e.t, err)
	e.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	e.nc, e.js = nc, js
}

// feeds opens a Feeds on the env's stream.
func (e *env) feeds(cfg Config) *Feeds {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fs, err := New(ctx, e.js, cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(fs.Close)
	return fs
}

// write publishes transactions with the real sink, retrying failed writes
// (the stream dedupes by Nats-Msg-Id).
func (e *env) write(txs ...[]cdc.Change) {
	e.t.Helper()
	var batch []cdc.Change
	for _, tx := range txs {
		batch = append(batch, tx...)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := e.sink.Write(ctx, batch)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Errorf("writing %d changes: %v", len(batch), err)
			return
		}
		_ = e.sink.Connect(context.Background())
		time.Sleep(50 * time.Millisecond)
	}
}

func decoderFor(raw map[string]any) config.Decoder {
	return func(into any) error {
		d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			TagName: "koanf", ErrorUnused: true, Result: into,
			DecodeHook: mapstructure.ComposeDecodeHookFunc(mapstructure.StringToTimeDurationHookFunc(), mapstructure.TextUnmarshallerHookFunc()),
		})
		if err != nil {
			return err
		}
		if err := d.Decode(raw); err != nil {
			return err
		}
		if v, ok := into.(interface{ Validate() error }); ok {
			return v.Validate()
		}
		return nil
	}
}

// ordersRel is public.orders: id is the key.
var ordersRel = &cdc.Relation{ID: 1, Schema: "public", Table: "orders", ReplicaIdentity: 'f', Columns: []cdc.Column{
	{Name: "id", Type: "int8", Key: true}, {Name: "tenant", Type: "int8"}, {Name: "status", Type: "text"},
	{Name: "tags", Type: "_text"}, {Name: "amount", Type: "numeric"}, {Name: "note", Type: "text"},
}}

var itemsRel = &cdc.Relation{ID: 2, Schema: "public", Table: "items", ReplicaIdentity: 'd', Columns: []cdc.Column{
	{Name: "id", Type: "int8", Key: true}, {Name: "tenant", Type: "int8"}, {Name: "status", Type: "text"},
}}

// order is a row of public.orders.
type order struct {
	ID, Tenant int64
	Status     string
	Tags       []string
	Amount     int64 // numeric, sent as "<amount>.50"
	Note       *string
}

func (o order) values() []any {
	tags := make([]any, len(o.Tags))
	for i, t := range o.Tags {
		tags[i] = t
	}
	var note any
	if o.Note != nil {
		note = *o.Note
	}
	return []any{o.ID, o.Tenant, o.Status, tags, cdc.Numeric(fmt.Sprintf("%d.50", o.Amount)), note}
}

// gen makes changes of one producer with increasing commit LSNs.
type gen struct {
	mu       sync.Mutex
	producer string
	lsn      cdc.LSN
}

func newGen(producer string) *gen { return &gen{producer: producer, lsn: 0x1000} }

// op is one change to put in a transaction.
type op struct {
	op            cdc.Op
	rel           *cdc.Relation
	before, after []any
}

func ins(o order) op { return op{op: cdc.OpInsert, rel: ordersRel, after: o.values()} }
func del(o order) op { return op{op: cdc.OpDelete, rel: ordersRel, before: o.values()} }
func upd(a, b order) op {
	return op{op: cdc.OpUpdate, rel: ordersRel, before: a.values(), after: b.values()}
}
func trunc(r *cdc.Relation) op { return op{op: cdc.OpTruncate, rel: r} }

// tx builds one transaction's changes, payloads in the native format.
func (g *gen) tx(ops ...op) []cdc.Change {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lsn += 0x100
	out := make([]cdc.Change, len(ops))
	for i, o := range ops {
		c := cdc.Change{
			Producer: g.producer, Source: "src", CommitLSN: g.lsn, LSN: g.lsn - 0x50, Seq: uint32(i), TxSize: uint32(len(ops)),
			Xid: uint32(g.lsn), CommitTime: time.Unix(1700000000, 0).UTC(), Schema: o.rel.Schema, Table: o.rel.Table,
			Op: o.op, Rel: o.rel, Before: o.before, After: o.after,
		}
		c.Subject = "cdc.src." + c.Schema + "." + c.Table
		c.Payload = format.AppendNative(nil, &c)
		out[i] = c
	}
	return out
}

// resync builds the control message the pipeline publishes when a slot is
// recreated; later changes carry newProducer.
func (g *gen) resync(newProducer string) []cdc.Change {
	g.mu.Lock()
	defer g.mu.Unlock()
	ctl := cdc.Control{Kind: cdc.ControlResync, Reason: "slot_recreated", Source: "src", OldProducer: g.producer, Producer: newProducer, LSN: g.lsn.String(), Time: time.Now().UTC()}
	b, _ := json.Marshal(ctl)
	g.producer = newProducer
	g.lsn += 0x100
	c := cdc.Change{Producer: newProducer, Source: "src", CommitLSN: g.lsn, Seq: 0, TxSize: 1, Schema: cdc.ControlSchema, Table: cdc.ControlResync,
		Op: cdc.OpControl, Content: b, Subject: "cdc.src._control.resync", Payload: b}
	return []cdc.Change{c}
}

// collect reads f until it has n changes or the deadline passes; it fails
// the test on an error.
func collect(t testing.TB, f *Feed, n int, within time.Duration) ([]Change, Token) {
	t.Helper()
	var out []Change
	var tok Token
	deadline := time.Now().Add(within)
	for len(out) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		b, err := f.Next(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			t.Fatalf("Next: %v", err)
		}
		out = append(out, b.Changes...)
		tok = b.Token
	}
	return out, tok
}

func seqs(cs []Change) []uint64 {
	out := make([]uint64, len(cs))
	for i, c := range cs {
		out[i] = c.Seq
	}
	return out
}

// snap builds one chunk of the snapshot run of the producer: reads of
// public.orders whose ids, as bridge/snapshot makes them, hold a hash of
// the row's key instead of a commit LSN and an ordinal.
func (g *gen) snap(run string, rows ...order) []cdc.Change {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lsn += 0x100
	producer := g.producer + ".snap-" + run
	out := make([]cdc.Change, len(rows))
	for i, o := range rows {
		c := cdc.Change{
			Producer: producer, Source: "src", CommitLSN: g.lsn, LSN: g.lsn - 0x50, Seq: uint32(i), TxSize: uint32(len(rows)),
			CommitTime: time.Unix(1700000000, 0).UTC(), Schema: ordersRel.Schema, Table: ordersRel.Table,
			Op: cdc.OpRead, Rel: ordersRel, After: o.values(),
		}
		h := uint64(o.ID)*0x9E3779B97F4A7C15 | 1 // any position but the ordinal's
		c.MsgID = producer + ":" + cdc.LSN(h).Hex() + ":" + strconv.FormatUint(h>>32, 10)
		c.Subject = "cdc.src." + c.Schema + "." + c.Table
		c.Payload = format.AppendNative(nil, &c)
		out[i] = c
	}
	return out
}
