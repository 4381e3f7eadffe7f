package route

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		pattern, filter string
		want            bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"a.b", "a.*", true},
		{"a.*", "a.b", false},
		{"a.*", "a.*", true},
		{"a.*", "a.>", true},
		{"a", "a.>", false},
		{"a.b.c", "a.>", true},
		{"a.b.c", "a.*", false},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"*.b", "a.>", false},
		{"x.*.y", "*.*.y", true},
		{"x.*.y", ">", true},
	} {
		require.Equal(t, c.want, Within(c.pattern, c.filter), "%s within %s", c.pattern, c.filter)
	}
	require.True(t, WithinAny("a.b", []string{"x.>", "a.*"}))
	require.False(t, WithinAny("a.*", []string{"a.b", "a.c"}), "two literals do not cover a wildcard token")
}

func testConfig(routes ...config.Route) *config.Config {
	return &config.Config{
		Sources: map[string]config.Plugin{"shop": {Type: "pgoutput"}, "crm": {Type: "pgoutput"}},
		Routes:  routes,
	}
}

// TestSubjectPatterns: the known parts of a subject come from the route's
// match (sources, tables without globs, ops), the rest is "*", and the
// control messages go on the first route of each sink.
func TestSubjectPatterns(t *testing.T) {
	cfg := testConfig(
		config.Route{Match: config.Match{Sources: []string{"shop"}, Tables: []string{"public.orders", "sales.*"}, Ops: []string{"insert", "delete"}},
			Sinks: []string{"a"}, Subject: "x.{{.Source}}.{{.Schema}}.{{.Table}}.{{.Op}}.{{.Col.tenant}}"},
		config.Route{Sinks: []string{"a", "b"}},
		config.Route{Match: config.Match{Ops: []string{"message"}}, Sinks: []string{"b"}, Subject: "m.{{.Schema}}.{{.Table}}.v{{.Key.id}}"},
	)
	ps := SubjectPatterns(cfg)
	require.Len(t, ps, 3)
	require.Equal(t, map[string][]string{"shop": {
		"x.shop.public.orders.delete.*", "x.shop.public.orders.insert.*", "x.shop.sales.*.delete.*", "x.shop.sales.*.insert.*",
	}}, ps[0].Data)
	require.Equal(t, map[string]map[string]string{"shop": {"a": "x.shop._control.resync.control._"}}, ps[0].Control)

	require.Equal(t, "cdc.{{.Source}}.{{.Schema}}.{{.Table}}", ps[1].Template)
	require.Equal(t, map[string][]string{"crm": {"cdc.crm.*.*"}, "shop": {"cdc.shop.*.*"}}, ps[1].Data)
	require.Equal(t, map[string]map[string]string{
		"crm":  {"a": "cdc.crm._control.resync", "b": "cdc.crm._control.resync"},
		"shop": {"b": "cdc.shop._control.resync"},
	}, ps[1].Control)

	require.Equal(t, map[string][]string{"crm": {"m._message.*.*"}, "shop": {"m._message.*.*"}}, ps[2].Data)
	require.Empty(t, ps[2].Control, "the earlier routes carry the control messages to b")

	// A transform's values are known only per change.
	out := testConfig(config.Route{Match: config.Match{Sources: []string{"shop"}, Tables: []string{"public.outbox"}}, Sinks: []string{"a"},
		Subject: "ev.{{.Out.kind}}.{{.Table}}", Transform: `{"kind": after.kind}`})
	require.Equal(t, map[string][]string{"shop": {"ev.*.outbox"}}, SubjectPatterns(out)[0].Data)
	require.Equal(t, map[string]map[string]string{"shop": {"a": "ev._.resync"}}, SubjectPatterns(out)[0].Control)

	// A route listing the control op carries them alone, and takes no changes.
	cfg.Routes = append(cfg.Routes, config.Route{Match: config.Match{Ops: []string{"control"}}, Sinks: []string{"b"}, Subject: "ctl.{{.Source}}"})
	ps = SubjectPatterns(cfg)
	require.Empty(t, ps[0].Control)
	require.Empty(t, ps[1].Control)
	require.Empty(t, ps[3].Data)
	require.Equal(t, map[string]map[string]string{"crm": {"b": "ctl.crm"}, "shop": {"b": "ctl.shop"}}, ps[3].Control)
}

// TestCheckSubjects: a route whose subjects can fall outside a sink's is
// refused with the route's path, the subjects, the sink's and the fix; a
// sink that does not know its subjects is not checked.
func TestCheckSubjects(t *testing.T) {
	cfg := testConfig(
		config.Route{Match: config.Match{Sources: []string{"shop"}}, Sinks: []string{"main"}, Subject: "orders.{{.Table}}"},
		config.Route{Match: config.Match{Sources: []string{"shop"}}, Sinks: []string{"other"}, Subject: "orders.{{.Table}}"},
		config.Route{Match: config.Match{Sources: []string{"crm"}}, Sinks: []string{"main"}, Subject: "cdc.crm.{{.Schema}}.{{.Table}}"},
	)
	cfg.Sources = map[string]config.Plugin{"shop": {}, "crm": {}}
	set := sinks.SubjectSet{Filters: []string{"cdc.shop.>", "cdc.crm.public.*"}, Of: `stream "CDC"`, Key: "subjects"}
	err := CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set})
	require.Error(t, err)
	require.Equal(t, `routes[0].subject: "orders.{{.Table}}" gives subjects orders.* for source shop, `+
		`outside stream "CDC"'s subjects [cdc.shop.>, cdc.crm.public.*] (sinks.main.config.subjects); change the subject or add the subjects to the stream`+"\n"+
		`routes[2].subject: "cdc.crm.{{.Schema}}.{{.Table}}" gives subjects cdc.crm.*.* for source crm, `+
		`outside stream "CDC"'s subjects [cdc.shop.>, cdc.crm.public.*] (sinks.main.config.subjects); change the subject or add the subjects to the stream`,
		err.Error())

	set.Filters = []string{"orders.*", "cdc.crm.>"}
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}), "orders.resync is within orders.*")
	require.NoError(t, CheckSubjects(cfg, nil))

	// Tables named in the match give literal subjects; the control
	// messages need their subject too.
	cfg.Routes[2].Match.Tables = []string{"public.orders"}
	set.Filters = []string{"orders.*", "cdc.crm.public.orders"}
	err = CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set})
	require.ErrorContains(t, err, `routes[2].subject: "cdc.crm.{{.Schema}}.{{.Table}}" gives subjects cdc.crm._control.resync (control messages) for source crm, outside`)
	set.Filters = append(set.Filters, "cdc.crm._control.resync")
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}))
}

// TestCheckSubjectsSchemaSubject: a route's schema_subject must fall
// within its sinks' streams too, when schemas are on.
func TestCheckSubjectsSchemaSubject(t *testing.T) {
	cfg := testConfig(config.Route{Sinks: []string{"main"}, Subject: "cdc.{{.Source}}.{{.Table}}", SchemaSubject: "schemas.{{.Source}}.{{.Table}}"})
	cfg.Sources = map[string]config.Plugin{"shop": {}}
	set := sinks.SubjectSet{Filters: []string{"cdc.shop.>"}, Of: `stream "CDC"`, Key: "subjects"}
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}), "schemas off: no events")
	cfg.Schemas.Enabled = true
	require.ErrorContains(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}), "schemas.shop.*")
	set.Filters = append(set.Filters, "schemas.>")
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}))
	cfg.Routes[0].Match.Ops = []string{"insert"}
	set.Filters = []string{"cdc.shop.>"}
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}), "a route whose ops leave schema out carries no events")
}

// TestSchemaDests: which routes carry a table's schema change events.
func TestSchemaDests(t *testing.T) {
	cfg := testConfig(
		config.Route{Name: "a", Continue: true, Match: config.Match{Tables: []string{"public.orders"}}, Sinks: []string{"main"}, SchemaSubject: "schemas.{{.Schema}}.{{.Table}}.{{.Op}}"},
		config.Route{Name: "b", Match: config.Match{Ops: []string{"insert"}}, Sinks: []string{"main"}},
		config.Route{Name: "c", Filter: `op == "delete"`, Sinks: []string{"other"}, Subject: "x.{{.Col.tenant}}.{{.Table}}", OnSchemaChange: "pause"},
		config.Route{Name: "d", Sinks: []string{"main"}},
		config.Route{Name: "e", Sinks: []string{"main"}},
	)
	r, err := New(cfg, map[string]int{"main": 0, "other": 1}, "")
	require.NoError(t, err)
	ds, err := r.SchemaDests("shop", "public", "orders", "~schema")
	require.NoError(t, err)
	require.Equal(t, []SchemaDest{
		{Sinks: []int{0}, Subject: "schemas.public.orders.schema", Dest: "a~schema", Route: "routes[0]"},
		{Sinks: []int{1}, Subject: "x._.orders", Dest: "c~schema", Route: "routes[2]", Hold: true}, // its filter passes other changes on: d sees them
		{Sinks: []int{0}, Subject: "cdc.shop.public.orders", Dest: "d~schema", Route: "routes[3]"}, // takes every change: e sees none
	}, ds)
	ds, err = r.SchemaDests("shop", "public", "users", "~schema")
	require.NoError(t, err)
	require.Equal(t, []string{"c~schema", "d~schema"}, []string{ds[0].Dest, ds[1].Dest})
}

// TestDeadLetterSubjects: a dead_letter route's dead-letter subject is its
// template's, else the message's subject with "_dead_letter" as its second
// token; it must fall within the sinks' streams; a change marked held goes
// there, with the reason and its subject in headers, on dead_letter
// routes only.
func TestDeadLetterSubjects(t *testing.T) {
	require.Equal(t, "cdc._dead_letter.shop.public.orders", DeadLetterDefault("cdc.shop.public.orders"))
	require.Equal(t, "orders._dead_letter", DeadLetterDefault("orders"))

	cfg := testConfig(config.Route{Sinks: []string{"main"}, Subject: "cdc.{{.Source}}.{{.Table}}", OnSchemaChange: "dead_letter"})
	cfg.Sources = map[string]config.Plugin{"shop": {}}
	cfg.Schemas.Enabled = true
	set := sinks.SubjectSet{Filters: []string{"cdc.shop.>"}, Of: `stream "CDC"`, Key: "subjects"}
	require.ErrorContains(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": set}), "cdc._dead_letter.shop.*")
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": {Filters: []string{"cdc.>"}}}))
	cfg.Routes[0].DeadLetterSubject = "dead.{{.Source}}.{{.Table}}.{{.Op}}"
	require.ErrorContains(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": {Filters: []string{"cdc.>"}}}), "dead.shop.*.schema")
	require.NoError(t, CheckSubjects(cfg, map[string]sinks.SubjectSet{"main": {Filters: []string{"cdc.>", "dead.>"}}}))

	cfg = testConfig(
		config.Route{Name: "keep", Continue: true, Sinks: []string{"main"}, Subject: "all.{{.Table}}"},
		config.Route{Name: "dl", Sinks: []string{"main"}, Subject: "cdc.{{.Source}}.{{.Table}}", OnSchemaChange: "dead_letter"},
	)
	r, err := New(cfg, map[string]int{"main": 0}, "")
	require.NoError(t, err)
	rel := &cdc.Relation{Schema: "public", Table: "orders", Columns: []cdc.Column{{Name: "id", Type: "int4", Key: true}}}
	c := &cdc.Change{Source: "shop", Schema: "public", Table: "orders", Op: cdc.OpInsert, Rel: rel, After: []any{int64(1)},
		DeadLetter: "held", Headers: map[string]string{"x": "y"}}
	var got []*cdc.Change
	_, err = r.Each(c, func(d *cdc.Change, _ []int) error { got = append(got, d); return nil })
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "all.orders", got[0].Subject)
	require.Equal(t, map[string]string{"x": "y"}, got[0].Headers, "a continue route is not held")
	require.Equal(t, "cdc._dead_letter.shop.orders", got[1].Subject)
	require.Equal(t, map[string]string{"x": "y", HeaderDeadLetterReason: "held", HeaderOriginalSubject: "cdc.shop.orders"}, got[1].Headers)
	require.Equal(t, map[string]string{"x": "y"}, c.Headers, "the change's own headers are left alone")
	ds, err := r.SchemaDests("shop", "public", "orders", "~schema")
	require.NoError(t, err)
	require.Equal(t, []SchemaDest{
		{Sinks: []int{0}, Subject: "all.orders", Dest: "keep~schema", Route: "routes[0]"},
		{Sinks: []int{0}, Subject: "cdc.shop.orders", Dest: "dl~schema", Route: "routes[1]", DeadLetter: true, DeadLetterSubject: "cdc._dead_letter.shop.orders"},
	}, ds)
}
