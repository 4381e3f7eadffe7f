package pipeline

import (
	"encoding/json"
	"fmt"
	"maps"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// ddlStep turns c, a logical message of the DDL event trigger
// (cdc.DDLPrefix), into its DDL events, routed (one per route that
// carries the table's DDL events, each with its sinks; none with
// schemas.ddl off). An event keeps c's position (its own ordinal in its
// transaction) and size; the message itself is never published (the
// router consumes it). A message that is not the trigger's JSON is
// dropped with a warning: the same on every replay.
func (p *Pipeline) ddlStep(rr *routerRev, c *cdc.Change) (evs []cdc.Change, dests [][]int, err error) {
	m, err := schema.ParseDDL(c.Content)
	if err != nil {
		p.log.Warn("dropping a DDL message", "commit_lsn", c.CommitLSN.String(), "seq", c.Seq, "error", err)
		return nil, nil, nil
	}
	ds, err := rr.r.DDLDests(c.Source, m.Schema, m.TableName())
	if err != nil {
		return nil, nil, fatal{err}
	}
	if len(ds) == 0 {
		return nil, nil, nil
	}
	body, err := json.Marshal(schema.NewDDLEvent(m, c))
	if err != nil {
		return nil, nil, fatal{fmt.Errorf("encoding the DDL event at %s (change %d): %w", c.CommitLSN, c.Seq+1, err)}
	}
	for _, d := range ds {
		if len(d.Sinks) == 0 {
			continue
		}
		payload, hdr := eventPayload(d, body, nil, c.Database, func(schemasEnable bool) []byte {
			return schema.AppendDebeziumDDLEvent(nil, c, m, schemasEnable)
		})
		evs = append(evs, cdc.Change{
			Producer: c.Producer, Source: c.Source, Database: c.Database,
			CommitLSN: c.CommitLSN, LSN: c.LSN, Seq: c.Seq, TxSize: c.TxSize, Xid: c.Xid, CommitTime: c.CommitTime,
			Schema: m.Schema, Table: m.TableName(), Op: cdc.OpDDL,
			Content: body, Payload: payload, Subject: d.Subject, Dest: d.Dest, Headers: hdr,
		})
		dests = append(dests, d.Sinks)
	}
	return evs, dests, nil
}

// eventPayload returns the payload and headers of a schema change or DDL
// event for d: the bridge's JSON (native) with headers h, or for a route
// of the debezium format, Debezium's schema change value (debezium) and,
// with debezium.key: header, Debezium's schema change key
// ({"databaseName": …}) in the Debezium-Key header.
func eventPayload(d route.SchemaDest, native []byte, h map[string]string, database string, debezium func(schemasEnable bool) []byte) ([]byte, map[string]string) {
	if d.Debezium == nil {
		return native, h
	}
	payload := debezium(d.Debezium.SchemasEnable)
	if d.Debezium.Key {
		hh := make(map[string]string, len(h)+1)
		maps.Copy(hh, h)
		hh[format.HeaderDebeziumKey] = string(schema.DebeziumSchemaChangeKey(nil, database, d.Debezium.SchemasEnable))
		h = hh
	}
	return payload, h
}
