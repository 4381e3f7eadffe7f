package route

import (
	"fmt"
	"maps"
	"slices"
	"text/template"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/config"
)

// IsDDLMessage reports whether c is a logical message of the DDL event
// trigger (cdc.DDLPrefix): the pipeline publishes it as a DDL event
// (DDLDests) or not at all; no route publishes it as a message.
func IsDDLMessage(c *cdc.Change) bool {
	return c.Op == cdc.OpMessage && c.Prefix == cdc.DDLPrefix
}

// tombstone returns the tombstone that follows d, a delete as route name
// publishes it: its subject and headers, an empty payload, no
// transaction size (it is not one of the transaction's changes), the
// destination name + cdc.TombstoneDest.
func tombstone(d *cdc.Change, name string) *cdc.Change {
	t := *d
	t.Payload = []byte{}
	t.TxSize = 0
	t.Dest = name + cdc.TombstoneDest
	return &t
}

// setDebeziumKey sets c's Debezium-Key header (a copy of the headers:
// they may be shared); a change without a key gets none.
func (rt *route) setDebeziumKey(c *cdc.Change) {
	key, ok := rt.debKey(nil, c)
	if !ok {
		return
	}
	h := make(map[string]string, len(c.Headers)+1)
	maps.Copy(h, c.Headers)
	h[format.HeaderDebeziumKey] = string(key)
	c.Headers = h
}

// DDLDests returns nothing when schemas.ddl is off. Else it returns where the DDL event of a command on source's table
// schema.table goes (table "": a command on no table, which only routes
// without match.tables take): a copy for every route that can see a
// change of the table and carries DDL events (its match takes the table,
// by sources and tables, and its ops are empty or list ddl), in config
// order, up to the first route without continue, ops or filter that
// takes the table, as SchemaDests. Filters and shaping do not apply. Each
// copy is on the route's schema_subject (default: its subject), rendered
// with Op "ddl" and row values "_", and its Dest is the route's name: the
// event has its own position in its transaction.
func (r *Router) DDLDests(source, schema, table string) ([]SchemaDest, error) {
	if !r.ddl {
		return nil, nil // schemas.ddl off: the messages are dropped
	}
	return r.eventDests(source, schema, table, cdc.OpDDL, func(rt *route, subj string) (SchemaDest, error) {
		return SchemaDest{Sinks: rt.sinks, Subject: subj, Dest: rt.name,
			Route: fmt.Sprintf("routes[%d]", rt.idx), Debezium: rt.deb}, nil
	})
}

// ddlTemplate returns rc's schema_subject when rc carries DDL events on
// it (schemas.ddl on, its ops empty or listing ddl); nil when not.
func ddlTemplate(cfg *config.Config, rc config.Route) *template.Template {
	if !cfg.Schemas.DDL || rc.SchemaSubject == "" || (len(rc.Match.Ops) > 0 && !slices.Contains(rc.Match.Ops, string(cdc.OpDDL))) {
		return nil
	}
	t, err := template.New("").Option("missingkey=zero").Parse(rc.SchemaSubject)
	if err != nil {
		return nil
	}
	return t
}
