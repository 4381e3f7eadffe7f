package sinktest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

var (
	orders = &cdc.Relation{ID: 16390, Schema: "public", Table: "orders", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true},
		{Name: "customer", Type: "text", OID: 25},
		{Name: "total", Type: "numeric", OID: 1700},
		{Name: "tags", Type: "_text", OID: 1009},
		{Name: "placed_at", Type: "timestamptz", OID: 1184},
		{Name: "note", Type: "text", OID: 25},
	}}
	customers = &cdc.Relation{ID: 16401, Schema: "public", Table: "customers", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true},
		{Name: "name", Type: "text", OID: 25},
		{Name: "email", Type: "text", OID: 25},
	}}
	txSizes = []int{1, 3, 2, 5, 4}
	names   = []string{"ada", "grace", "edsger", "barbara", "ken", "dennis", "frances"}
)

// Changes returns n changes of producer ("<bridge>.<source>.<epoch>") as the
// router hands them to a sink: whole transactions of 1 to 5 changes (the
// last one cut short to make n), commit LSNs increasing, inserts, updates
// and deletes of public.orders and public.customers with typed values, and
// now and then a logical decoding message. Subject is
// "cdc.<source>.<schema>.<table>" ("cdc.<source>._message.<prefix>" for a
// message), Payload a JSON object of its own (see payload), and Headers a
// W3C traceparent. The result depends only on n and
// producer, so calling Changes again gives the same changes and IDs: a replay.
func Changes(n int, producer string) []cdc.Change {
	source := "main"
	if parts := strings.Split(producer, "."); len(parts) == 3 && parts[1] != "" {
		source = parts[1]
	}
	out := make([]cdc.Change, 0, n)
	lsn := cdc.LSN(0x16B37000)
	base := time.Date(2026, 3, 14, 15, 9, 26, 535000000, time.UTC)
	for tx := 0; len(out) < n; tx++ {
		size := min(txSizes[tx%len(txSizes)], n-len(out))
		commit := lsn + cdc.LSN(size+1)*0x80
		for j := range size {
			out = append(out, change(len(out), tx, j, size, producer, source, lsn+cdc.LSN(j)*0x80, commit,
				base.Add(time.Duration(tx)*time.Second+time.Duration(tx*j)*time.Microsecond)))
		}
		lsn = commit + 0x100
	}
	return out
}

// change builds change #i of the sequence: the j-th of transaction tx.
func change(i, tx, j, size int, producer, source string, lsn, commit cdc.LSN, at time.Time) cdc.Change {
	c := cdc.Change{
		Producer:   producer,
		Source:     source,
		Database:   "shop",
		CommitLSN:  commit,
		LSN:        lsn,
		Seq:        uint32(j),
		TxSize:     uint32(size),
		Xid:        uint32(7000 + tx),
		CommitTime: at,
		Schema:     "public",
		Headers:    map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", tx+1, i+1)},
	}
	id := int64(i/3 + 1)
	switch {
	case i%17 == 16:
		c.Schema = ""
		c.Op = cdc.OpMessage
		c.Prefix = "app"
		c.Transactional = true
		c.Content = fmt.Appendf(nil, `{"event":"checkpoint","n":%d}`, i)
	case i%5 == 3:
		c.Table, c.Rel = customers.Table, customers
		name := names[i%len(names)]
		c.Op = cdc.OpUpdate
		c.Before = []any{id, cdc.Absent, cdc.Absent}
		c.After = []any{id, name, name + "@example.com"}
	default:
		c.Table, c.Rel = orders.Table, orders
		row := []any{id, names[i%len(names)], cdc.Numeric(fmt.Sprintf("%d.%02d", 10+i, i%100)),
			[]any{"new", fmt.Sprintf("batch-%d", tx)}, at.Add(-time.Minute), strings.Repeat("ü", i%40)}
		switch i % 3 {
		case 0:
			c.Op, c.After = cdc.OpInsert, row
		case 1:
			c.Op, c.After = cdc.OpUpdate, row
			c.Before = []any{id, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent}
		default:
			c.Op = cdc.OpDelete
			c.Before = []any{id, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent, cdc.Absent}
		}
	}
	if c.Op == cdc.OpMessage {
		c.Subject = "cdc." + source + "._message." + c.Prefix
	} else {
		c.Subject = "cdc." + source + "." + c.Schema + "." + c.Table
	}
	c.Payload = payload(&c)
	return c
}

// payload is c's message body: one JSON object whose "id" is c.ID(), as in
// the bridge's native format, with c's operation, table, position and row
// images (named by column, absent columns left out) or message, so every
// change has a body of its own. Sinks carry it as opaque bytes; Run
// compares it byte for byte. It is built here rather than by the bridge's
// encoder so that the suite, which sinks import, needs only bridge/cdc.
func payload(c *cdc.Change) []byte {
	type message struct {
		Prefix        string `json:"prefix"`
		Transactional bool   `json:"transactional"`
		Content       string `json:"content"`
	}
	body := struct {
		ID         string         `json:"id"`
		Op         cdc.Op         `json:"op"`
		Source     string         `json:"source"`
		Schema     string         `json:"schema,omitempty"`
		Table      string         `json:"table,omitempty"`
		CommitLSN  string         `json:"commit_lsn"`
		LSN        string         `json:"lsn"`
		Seq        uint32         `json:"seq"`
		TxSize     uint32         `json:"tx_size"`
		Xid        uint32         `json:"xid"`
		CommitTime time.Time      `json:"commit_time"`
		Before     map[string]any `json:"before,omitempty"`
		After      map[string]any `json:"after,omitempty"`
		Message    *message       `json:"message,omitempty"`
	}{
		ID: c.ID(), Op: c.Op, Source: c.Source, Schema: c.Schema, Table: c.Table,
		CommitLSN: c.CommitLSN.String(), LSN: c.LSN.String(), Seq: c.Seq, TxSize: c.TxSize, Xid: c.Xid,
		CommitTime: c.CommitTime, Before: named(c.Rel, c.Before), After: named(c.Rel, c.After),
	}
	if c.Op == cdc.OpMessage {
		body.Message = &message{Prefix: c.Prefix, Transactional: c.Transactional, Content: string(c.Content)}
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic("sinktest: encoding the payload of " + c.ID() + ": " + err.Error())
	}
	return b
}

// named returns row as an object keyed by rel's column names, without the
// columns it does not carry (cdc.Absent); nil for no row.
func named(rel *cdc.Relation, row []any) map[string]any {
	if rel == nil || row == nil {
		return nil
	}
	out := make(map[string]any, len(row))
	for i, v := range row {
		if v != cdc.Absent {
			out[rel.Columns[i].Name] = v
		}
	}
	return out
}
