package route

import (
	"fmt"
	"maps"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
)

// SchemaDest is one copy of a schema change event: the sinks it goes to,
// its subject, and the destination that ends its message id.
type SchemaDest struct {
	Sinks   []int
	Subject string
	// Dest is "<route name>~schema", or "~schema" for an unnamed route
	// (schema.Dest).
	Dest string
	// Hold: the route's on_schema_change is pause; Route its YAML path.
	Hold  bool
	Route string
	// DeadLetter: the route's on_schema_change is dead_letter, and
	// DeadLetterSubject where it puts the event of a held version.
	DeadLetter        bool
	DeadLetterSubject string
	// Debezium is the route's debezium options when its format is
	// debezium (the event in Debezium's shape), else nil.
	Debezium *format.DebeziumOptions
}

// The headers of a change a route puts on its dead-letter subject (the
// same as a sink's dead letters').
const (
	// HeaderDeadLetterReason says why: the held version and its change.
	HeaderDeadLetterReason = "Bridge-Dead-Letter-Reason"
	// HeaderOriginalSubject is the subject the change would have had.
	HeaderOriginalSubject = "Bridge-Original-Subject"
)

// DeadLetterDefault returns the default dead-letter subject of a message
// on subject: "_dead_letter" inserted as its second token
// ("cdc.shop.public.orders" → "cdc._dead_letter.shop.public.orders").
func DeadLetterDefault(subject string) string {
	first, rest, ok := strings.Cut(subject, ".")
	if !ok {
		return subject + "._dead_letter"
	}
	return first + "._dead_letter." + rest
}

// deadLetterSubject returns where the route puts a held change (or event)
// whose subject would be subj.
func (rt *route) deadLetterSubject(source, schema, table string, op cdc.Op, subj string) (string, error) {
	if rt.deadLetter == nil {
		return DeadLetterDefault(subj), nil
	}
	s, err := render(rt.deadLetter, SubjectData{Source: Token(source), Schema: Token(schema), Table: Token(table), Op: string(op),
		Prefix: "_", Key: map[string]string{}, Col: map[string]string{}})
	if err != nil {
		return "", fmt.Errorf("routes[%d].dead_letter_subject for %s.%s: %w", rt.idx, schema, table, err)
	}
	return s, nil
}

// DeadLetterHeaders returns h with the headers of a message a route puts
// on its dead-letter subject: reason, and subject, the one it would have
// had (a new map: h may be shared).
func DeadLetterHeaders(h map[string]string, reason, subject string) map[string]string {
	out := make(map[string]string, len(h)+2)
	maps.Copy(out, h)
	out[HeaderDeadLetterReason] = reason
	out[HeaderOriginalSubject] = subject
	return out
}

// SchemaDests returns where the schema change event of source's table
// schema.table goes: a copy for every route that can see a change of the
// table and carries events (its match takes the table, by sources and
// tables, and its ops are empty or list schema), in config order, up to
// the first route without continue, ops or filter that takes the table
// (it takes every change of the table: the routes after it see none).
// Filters and shaping do not apply to events. Each copy is on the route's
// schema_subject (default: its subject), rendered with Op "schema" and row
// values "_". destSuffix is schema.Dest.
func (r *Router) SchemaDests(source, schema, table, destSuffix string) ([]SchemaDest, error) {
	return r.eventDests(source, schema, table, cdc.OpSchema, func(rt *route, subj string) (SchemaDest, error) {
		sd := SchemaDest{Sinks: rt.sinks, Subject: subj, Dest: rt.name + destSuffix,
			Hold: rt.onSchema == "pause", Route: fmt.Sprintf("routes[%d]", rt.idx), DeadLetter: rt.onSchema == "dead_letter",
			Debezium: rt.deb}
		if sd.DeadLetter {
			var err error
			if sd.DeadLetterSubject, err = rt.deadLetterSubject(source, schema, table, cdc.OpSchema, subj); err != nil {
				return sd, err
			}
		}
		return sd, nil
	})
}

// eventDests walks the routes for an event of op (schema or ddl) on
// source's schema.table (table "" for an event on no table, which only
// routes without a tables list take): each route that matches it, in
// config order, up to the first one without continue, ops or filter (it
// takes every change of the table: the routes after it see none). For
// each, the route's schema_subject (default: its subject) is rendered with
// op and row values "_", and dest turns the route and subject into the
// SchemaDest.
func (r *Router) eventDests(source, schema, table string, op cdc.Op, dest func(rt *route, subj string) (SchemaDest, error)) ([]SchemaDest, error) {
	probe := &cdc.Change{Source: source, Schema: schema, Table: table, Op: op}
	var out []SchemaDest
	for _, rt := range r.routes {
		if table == "" && len(rt.tables) > 0 {
			continue
		}
		if !rt.matches(probe) {
			continue
		}
		d := SubjectData{Source: Token(source), Schema: Token(schema), Table: Token(table), Op: string(op),
			Prefix: "_", Key: map[string]string{}, Col: map[string]string{}}
		tmpl := rt.subject
		if rt.schemaSubject != nil {
			tmpl = rt.schemaSubject
		} else {
			for _, v := range rt.cols {
				d.Col[v] = "_"
			}
			for _, v := range rt.keys {
				d.Key[v] = "_"
			}
			if len(rt.outs) > 0 {
				d.Out = map[string]string{}
				for _, v := range rt.outs {
					d.Out[v] = "_"
				}
			}
		}
		subj, err := render(tmpl, d)
		if err != nil {
			return nil, fmt.Errorf("routes[%d].schema_subject for the %s event of %s.%s: %w", rt.idx, op, schema, table, err)
		}
		sd, err := dest(rt, subj)
		if err != nil {
			return nil, err
		}
		out = append(out, sd)
		if !rt.cont && (rt.shape == nil || rt.shape.filter == "") && len(rt.ops) == 0 {
			break
		}
	}
	return out, nil
}
