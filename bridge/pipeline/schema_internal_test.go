package pipeline

import (
	"encoding/json"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// TestRouteSchemaEvents: with a schema registry, the reader puts a schema
// change event before the first change of a table and before the first
// change under each new shape, at that change's position, in every path a
// transaction takes (held in memory, read back from disk, routes with
// continue), once per route that carries the table, on the route's
// schema_subject (default: its subject); every row change names its
// version in the Bridge-Schema-Version header.
func TestRouteSchemaEvents(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	r1 := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}}}
	r2 := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}, {Name: "n", Type: "text"}}}
	mk := func(from, n, size, switchAt int) []cdc.Change {
		cs := make([]cdc.Change, n)
		for i := range cs {
			rel := r1
			if from+i >= switchAt {
				rel = r2
			}
			cs[i] = cdc.Change{Source: "app", Schema: "public", Table: "t", Op: cdc.OpInsert, Rel: rel,
				After: make([]any, len(rel.Columns)), CommitLSN: 99, Seq: uint32(from + i), TxSize: uint32(size)}
		}
		return cs
	}
	plain := []config.Route{{Match: config.Match{Tables: []string{"public.t"}}, Sinks: []string{"a"}}}
	fan := []config.Route{
		{Name: "one", Continue: true, Sinks: []string{"a"}, SchemaSubject: "schemas.{{.Schema}}.{{.Table}}"},
		{Name: "two", Match: config.Match{Ops: []string{"insert"}}, Sinks: []string{"a"}}, // no schema op: no events
		{Name: "three", Sinks: []string{"a"}},
	}
	for _, tc := range []struct {
		name           string
		routes         []config.Route
		mem, rest, at  int
		wantDests      []string
		wantSubjects   []string
		wantEventCount int
	}{
		{"in memory", plain, 10, 0, 4, []string{schema.Dest}, []string{"cdc.app.public.t"}, 2},
		{"in memory, large", plain, 2*chunk + 10, 0, chunk + 3, []string{schema.Dest}, []string{"cdc.app.public.t"}, 2},
		{"spilled", plain, 5, 2 * chunk, chunk + 700, []string{schema.Dest}, []string{"cdc.app.public.t"}, 2},
		// one copy per route that carries the table: "one" (continue), not
		// "two" (its ops leave schema out), and "three" (it sees the
		// table's other ops).
		{"continue", fan, 10, 0, 4, []string{"one" + schema.Dest, "three" + schema.Dest}, []string{"schemas.public.t", "cdc.app.public.t"}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, err := schema.Open(t.Context(), js, "schemas_"+sanitize(tc.name), 1)
			require.NoError(t, err)
			r, err := route.New(&config.Config{Unrouted: "drop", Routes: tc.routes}, map[string]int{"a": 0}, "")
			require.NoError(t, err)
			p := New(Config{Source: "app", Router: r, Schemas: reg})
			p.trk = schema.NewTracker(reg, "app")
			size := tc.mem + tc.rest
			txn := &cdc.Txn{CommitLSN: 99, Changes: mk(0, tc.mem, size, tc.at)}
			if tc.rest > 0 {
				txn.Rest = &sliceIter{cs: mk(tc.mem, tc.rest, size, tc.at), max: chunk}
			}
			var got []cdc.Change
			require.NoError(t, p.route(t.Context(), p.cur.Load(), txn, "prod", func(it *txnItem) error {
				require.Len(t, it.dests, len(it.changes))
				got = append(got, it.changes...)
				return nil
			}))
			var events []cdc.Change
			for i, c := range got {
				if c.Op != cdc.OpSchema {
					want := "1"
					if int(c.Seq) >= tc.at {
						want = "2"
					}
					require.Equal(t, want, c.Headers[schema.HeaderVersion], "change %d", c.Seq)
					continue
				}
				events = append(events, c)
				require.Zero(t, c.TxSize, "an event never ends its transaction")
				// The next change of the event's route: at its position.
				for _, next := range got[i+1:] {
					if next.Op != cdc.OpSchema && next.Dest+schema.Dest == c.Dest {
						require.Equal(t, next.Seq, c.Seq, "at the position of the change it precedes")
						require.Equal(t, next.CommitLSN, c.CommitLSN)
						break
					}
				}
				require.Contains(t, tc.wantDests, c.Dest)
				require.Contains(t, tc.wantSubjects, c.Subject)
				require.Equal(t, "prod:0000000000000063:"+strconv.Itoa(int(c.Seq))+"@"+c.Dest, c.ID())
			}
			require.Len(t, events, tc.wantEventCount)
			var atFirst, atNew []cdc.Change
			for _, e := range events {
				switch int(e.Seq) {
				case 0:
					atFirst = append(atFirst, e) // the table's first change: version 1
				case tc.at:
					atNew = append(atNew, e) // the first change under the new shape: version 2
				default:
					require.Failf(t, "an event elsewhere", "at seq %d", e.Seq)
				}
			}
			require.Len(t, atFirst, len(events)/2)
			require.Len(t, atNew, len(events)/2)
			var ev schema.Event
			require.NoError(t, json.Unmarshal(atNew[0].Payload, &ev))
			require.Equal(t, 2, ev.Version)
			require.Equal(t, "schema", ev.Op)
			require.Equal(t, []schema.Column{{Name: "n", Type: "text"}}, ev.Diff.Added)
			require.NotNil(t, ev.Previous)
			require.Equal(t, 1, ev.Previous.Version)
			require.Equal(t, "app.public.t.2", ev.RegistryKey)
			routed := size
			if tc.routes[0].Name != "" {
				routed = 2 * size // "one" and "two" publish every insert
			}
			require.Equal(t, routed+len(events), len(got), "every change once per route, plus the events")
		})
	}
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 'a' || c > 'z' {
			b[i] = '_'
		}
	}
	return string(b)
}

// TestRouteSchemaDeadLetter: a route with on_schema_change: dead_letter
// puts a breaking change's event and the table's changes from then on
// (a later version that is not breaking too) on its dead-letter subject,
// with the reason and the original subject in headers, while another
// table and a continue route go on; once the operator resumes the source,
// the table's next change accepts the version (recorded in the registry):
// the version is announced again on the route's subject, before that
// change, which goes there too. A replay routes every change as before.
func TestRouteSchemaDeadLetter(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	reg, err := schema.Open(t.Context(), js, "schemas_dl", 1)
	require.NoError(t, err)

	id := cdc.Column{Name: "id", Type: "int4", Key: true, NotNull: true}
	r1 := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{id, {Name: "n", Type: "text"}}}
	r2 := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{id}}                            // n dropped: breaking
	r3 := &cdc.Relation{Schema: "public", Table: "t", Columns: []cdc.Column{id, {Name: "m", Type: "int8"}}} // m added: held all the same
	other := &cdc.Relation{Schema: "public", Table: "u", Columns: []cdc.Column{id}}
	txn := func(lsn cdc.LSN, rels ...*cdc.Relation) *cdc.Txn {
		t := &cdc.Txn{CommitLSN: lsn}
		for i, r := range rels {
			t.Changes = append(t.Changes, cdc.Change{Source: "app", Schema: r.Schema, Table: r.Table, Op: cdc.OpInsert, Rel: r,
				After: make([]any, len(r.Columns)), CommitLSN: lsn, Seq: uint32(i), TxSize: uint32(len(rels))})
		}
		return t
	}
	r, err := route.New(&config.Config{Unrouted: "drop", Schemas: config.Schemas{Enabled: true}, Routes: []config.Route{
		{Name: "audit", Continue: true, Sinks: []string{"a"}, Subject: "audit.{{.Table}}"},
		{Name: "main", Sinks: []string{"a"}, Subject: "cdc.{{.Source}}.{{.Schema}}.{{.Table}}", OnSchemaChange: "dead_letter"},
	}}, map[string]int{"a": 0}, "")
	require.NoError(t, err)
	p := New(Config{Source: "app", Router: r, Schemas: reg, Log: slog.New(slog.DiscardHandler)})
	type out = dlOut
	routeAll := func(txns ...*cdc.Txn) []out {
		var got []out
		for _, tx := range txns {
			require.NoError(t, p.route(t.Context(), p.cur.Load(), tx, "prod", func(it *txnItem) error {
				for _, c := range it.changes {
					if c.Dest != "main" && c.Dest != "main"+schema.Dest {
						continue // the audit route's copies
					}
					o := out{op: string(c.Op), subject: c.Subject, version: c.Headers[schema.HeaderVersion],
						reason: c.Headers[route.HeaderDeadLetterReason], original: c.Headers[route.HeaderOriginalSubject], id: c.ID()}
					if c.Op == cdc.OpSchema {
						var ev schema.Event
						require.NoError(t, json.Unmarshal(c.Payload, &ev))
						o.announce = ev.Announce
					}
					got = append(got, o)
				}
				return nil
			}))
		}
		return got
	}
	held := []*cdc.Txn{txn(0x10, r1), txn(0x20, r2, other), txn(0x30, r3)}
	run := func(published cdc.LSN) []out {
		p.trk, p.holdsRun = p.newTracker(), nil
		p.trk.Resume(0, published)
		return routeAll(held...)
	}
	first := run(0)
	main, dead := "cdc.app.public.t", "cdc._dead_letter.app.public.t"
	require.Equal(t, []string{"schema", "insert", "schema", "insert", "schema", "insert", "schema", "insert"}, opsOf(first))
	require.Equal(t, []string{main, main, dead, dead, "cdc.app.public.u", "cdc.app.public.u", dead, dead}, subjects(first))
	require.Contains(t, first[2].reason, "routes[1].on_schema_change: dead_letter: public.t version 2 (app.public.t.2) held since")
	require.Contains(t, first[2].reason, "a breaking change: dropped n")
	require.Equal(t, main, first[2].original)
	require.Contains(t, first[6].reason, "public.t version 3 (app.public.t.3) held since")
	require.Contains(t, first[6].reason, "it follows a breaking change not accepted yet")
	require.Equal(t, main, first[7].original)
	heldNow := p.Status().Held
	require.Len(t, heldNow, 1)
	require.Equal(t, HeldTable{Table: "public.t", Version: 3, RegistryKey: "app.public.t.3", Policy: "dead_letter", Since: heldNow[0].Since,
		Reason: heldNow[0].Reason, DeadLettered: 2}, heldNow[0])
	pause, dl, marked, versions := p.SchemaStats()
	require.Equal(t, []int{0, 1}, []int{pause, dl})
	require.Equal(t, uint64(2), marked)
	require.Equal(t, uint64(4), versions)

	// A replay before the operator acts: the same.
	require.Equal(t, first, run(0x30))

	// The operator resumes: the table's next change accepts version 3.
	p.setWant(checkpoint.Control{At: time.Now().Add(time.Second), By: "test"})
	require.Empty(t, p.Status().Held, "a resume after the hold accepts it")
	after := routeAll(txn(0x40, r3, r3))
	require.Equal(t, []out{
		{op: "schema", subject: main, version: "3", id: "prod:0000000000000040:0@main~schema", announce: "accepted"},
		{op: "insert", subject: main, version: "3", id: "prod:0000000000000040:0@main"},
		{op: "insert", subject: main, version: "3", id: "prod:0000000000000040:1@main"},
	}, after)
	acc, err := js.KeyValue(t.Context(), "schemas_dl")
	require.NoError(t, err)
	e, err := acc.Get(t.Context(), schema.AcceptKey("app", "public", "t", 3))
	require.NoError(t, err)
	require.Contains(t, string(e.Value()), `"commit_lsn":"0/40","seq":0`)

	// A replay of everything, whatever the operator does now, routes as
	// the first run did.
	p.setWant(checkpoint.Control{At: time.Now().Add(2 * time.Second), By: "test"})
	again := run(0x40)
	again = append(again, routeAll(txn(0x40, r3, r3))...)
	require.Equal(t, append(first, after...), again)
}

// dlOut is what TestRouteSchemaDeadLetter sees of a message.
type dlOut struct{ op, subject, version, reason, original, id, announce string }

func opsOf(os []dlOut) []string {
	var out []string
	for _, o := range os {
		out = append(out, o.op)
	}
	return out
}

func subjects(os []dlOut) []string {
	var out []string
	for _, o := range os {
		out = append(out, o.subject)
	}
	return out
}
