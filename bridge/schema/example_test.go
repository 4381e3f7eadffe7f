package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// A consumer of a bridge's stream (docs/schemas.md#consuming): for each
// change it fetches, from the registry bucket, the version its
// Bridge-Schema-Version header names (once per version), validates the
// row against that version's JSON Schema for the route's format, and
// follows schema change events (Bridge-Op: schema).
type consumer struct {
	kv      jetstream.KeyValue // the registry: schemas.bucket, default "bridge_schemas"
	format  string             // the route's format: native, debezium, cloudevents
	schemas map[string]*jsonschema.Schema
}

// version returns the registry's version of the message's table named by
// its headers. The source is the second part of the producer that begins
// its Nats-Msg-Id ("<bridge>.<source>.<epoch>:<position>").
func (c *consumer) version(ctx context.Context, h nats.Header) (*schema.Version, error) {
	producer, _, _ := strings.Cut(h.Get(jetstream.MsgIDHeader), ":")
	source := strings.Split(producer, ".")[1]
	sch, table, _ := strings.Cut(h.Get("Bridge-Table"), ".")
	n, err := strconv.Atoi(h.Get(schema.HeaderVersion))
	if err != nil {
		return nil, fmt.Errorf("no %s header: %w", schema.HeaderVersion, err)
	}
	e, err := c.kv.Get(ctx, schema.VersionKey(source, sch, table, n)) // "shop.public.orders.2"
	if err != nil {
		return nil, err // never jetstream.ErrKeyNotFound: the version is there before the message
	}
	var v schema.Version
	return &v, json.Unmarshal(e.Value(), &v)
}

// handle validates one message of the stream.
func (c *consumer) handle(ctx context.Context, m jetstream.Msg) error {
	h := m.Headers()
	if h.Get("Bridge-Op") == "schema" {
		var ev schema.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return err
		}
		fmt.Printf("%s.%s is now version %d; breaking: %t\n", ev.Schema, ev.Table, ev.Version, ev.Diff.Breaking)
		return nil
	}
	key := h.Get("Bridge-Table") + "@" + h.Get(schema.HeaderVersion)
	s := c.schemas[key]
	if s == nil {
		v, err := c.version(ctx, h)
		if err != nil {
			return err
		}
		var doc any
		if err := json.Unmarshal(v.JSONSchema[c.format], &doc); err != nil {
			return err
		}
		comp := jsonschema.NewCompiler()
		if err := comp.AddResource("mem://row.json", doc); err != nil {
			return err
		}
		if s, err = comp.Compile("mem://row.json"); err != nil {
			return err
		}
		c.schemas[key] = s
	}
	var change struct {
		After json.RawMessage `json:"after"` // the native format's row
	}
	if err := json.Unmarshal(m.Data(), &change); err != nil {
		return err
	}
	row, err := jsonschema.UnmarshalJSON(strings.NewReader(string(change.After)))
	if err != nil {
		return err
	}
	if err := s.Validate(row); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	fmt.Printf("%s: valid\n", key)
	return nil
}

// Example_consume: a stream as a bridge writes it (a schema change event,
// then a change naming the version), read by the consumer above.
func Example_consume() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, _ := os.MkdirTemp("", "schema-example")
	defer os.RemoveAll(dir)
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown(context.Background())
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	js, _ := jetstream.New(nc)

	// What the bridge does: the version in the registry, then the event
	// and the change in the stream.
	reg, _ := schema.Open(ctx, js, "bridge_schemas", 1)
	rel := &cdc.Relation{Schema: "public", Table: "orders", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int4", OID: 23, NotNull: true, Key: true},
		{Name: "code", Type: "varchar", OID: 1043, Declared: "character varying(8)", NotNull: true}}}
	v := schema.FromRelation(rel)
	v.Source, v.Version, v.Since = "shop", 1, schema.Since{Producer: "b.shop.e1", CommitLSN: "0/10"}
	_ = reg.Put(ctx, &v)
	stream, _ := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	c := &cdc.Change{Producer: "b.shop.e1", CommitLSN: 0x10, Schema: "public", Table: "orders"}
	ev, _ := json.Marshal(schema.NewEvent(&v, nil, c))
	for _, m := range []struct {
		op, id string
		data   []byte
	}{
		{"schema", c.ID() + "@" + schema.Dest, ev},
		{"insert", c.ID(), []byte(`{"op":"insert","after":{"id":1,"code":"A-1"}}`)},
		{"insert", "b.shop.e1:0000000000000020:0", []byte(`{"op":"insert","after":{"id":2,"code":"much too long"}}`)},
	} {
		msg := nats.NewMsg("cdc.shop.public.orders")
		msg.Header.Set("Bridge-Op", m.op)
		msg.Header.Set("Bridge-Table", "public.orders")
		msg.Header.Set(schema.HeaderVersion, "1")
		msg.Header.Set(jetstream.MsgIDHeader, m.id)
		msg.Data = m.data
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			panic(err)
		}
	}

	// The consumer.
	kv, _ := js.KeyValue(ctx, "bridge_schemas")
	cons := &consumer{kv: kv, format: "native", schemas: map[string]*jsonschema.Schema{}}
	cc, _ := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	batch, _ := cc.FetchNoWait(3)
	for m := range batch.Messages() {
		if err := cons.handle(ctx, m); err != nil {
			fmt.Println("invalid:", err)
		}
	}
	// Output:
	// public.orders is now version 1; breaking: false
	// public.orders@1: valid
	// invalid: public.orders@1: jsonschema validation failed with 'mem://row.json#'
	// - at '/code': maxLength: got 13, want 8
}
