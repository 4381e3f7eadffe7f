package route

import (
	"fmt"
	"slices"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

// CheckTables checks the shaping of cfg's routes (filter, columns, mask,
// transform) against rels, the tables source streams as its changes will
// describe them, for `bridge validate --connect`: what the first change
// of each table would check at run time, and, for the rules with table
// globs, that each column they name exists in a table they apply to (a
// misspelt column to leave out would otherwise be published). One line
// per route with shaping: ok with the tables checked, or a failure per
// problem naming its YAML path (and CEL position) with the table's
// columns as the fix. Routes of other sources, routes that take no rows,
// and tables an earlier route takes whole are left out.
func CheckTables(cfg *config.Config, source string, rels []*cdc.Relation) []config.Check {
	var out []config.Check
	for i, rc := range cfg.Routes {
		if !takesFrom(rc, source) || !takesRows(rc) {
			continue
		}
		cols, _ := RowRefs(subjectOf(rc))
		rc.WASMFilter, rc.WASMTransform = config.WASM{}, config.WASM{} // opaque to a catalog: the load checked the modules
		s, errs := newShaper(i, rc, cols, options{})
		if s == nil || len(errs) > 0 {
			continue // no shaping, or the load reported it
		}
		var matched []*cdc.Relation
		for _, rel := range rels {
			name := rel.Schema + "." + rel.Table
			if appliesTo(rc.Match.Tables, name) && !shadowed(cfg, i, source, name) {
				matched = append(matched, rel)
			}
		}
		what := shapingParts(rc)
		if len(matched) == 0 {
			out = append(out, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("routes[%d] %s: no table source %s streams reaches the route", i, what, source),
				Fix:  "check the route's match.tables against the source's tables or publication, and the routes before it"})
			continue
		}
		failed := false
		var names []string
		for _, rel := range matched {
			names = append(names, rel.Schema+"."+rel.Table)
			for _, msg := range s.check(rel, &relShape{src: rel, out: rel}) {
				failed = true
				out = append(out, config.Check{Status: config.CheckFail, What: msg, Fix: "the columns of " + rel.Schema + "." + rel.Table + ": " + describeColumns(rel)})
			}
		}
		for _, msg := range unusedColumns(s, matched) {
			failed = true
			out = append(out, config.Check{Status: config.CheckFail, What: msg,
				Fix: "correct the column name: a column to leave out or mask that no table has hides nothing"})
		}
		if !failed {
			out = append(out, config.Check{Status: config.CheckOK,
				What: fmt.Sprintf("routes[%d] %s: checked against %s", i, what, listTables(names))})
		}
	}
	return out
}

// takesFrom reports whether rc takes changes of source.
func takesFrom(rc config.Route, source string) bool {
	return len(rc.Match.Sources) == 0 || slices.Contains(rc.Match.Sources, source)
}

// takesRows reports whether rc takes changes that carry a table.
func takesRows(rc config.Route) bool {
	if len(rc.Match.Ops) == 0 {
		return true
	}
	return slices.ContainsFunc(rc.Match.Ops, func(op string) bool {
		switch cdc.Op(op) {
		case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead, cdc.OpTruncate:
			return true
		}
		return false
	})
}

// shadowed reports whether a route before route i takes every change of
// table from source (no ops, no filter), so that none reaches route i.
func shadowed(cfg *config.Config, i int, source, table string) bool {
	for _, rc := range cfg.Routes[:i] {
		if takesFrom(rc, source) && len(rc.Match.Ops) == 0 && rc.Filter == "" && appliesTo(rc.Match.Tables, table) {
			return true
		}
	}
	return false
}

// shapingParts names what rc shapes: "filter, mask".
func shapingParts(rc config.Route) string {
	var p []string
	if rc.Filter != "" {
		p = append(p, "filter")
	}
	if len(rc.Columns) > 0 {
		p = append(p, "columns")
	}
	if len(rc.Mask) > 0 {
		p = append(p, "mask")
	}
	if rc.Transform != "" {
		p = append(p, "transform")
	}
	return strings.Join(p, ", ")
}

// unusedColumns reports the columns that rules for several tables (or a
// glob) name and that no table in rels they apply to has; a rule for one
// named table is checked with that table.
func unusedColumns(s *shaper, rels []*cdc.Relation) []string {
	var msgs []string
	check := func(tables []string, exact bool, at func(k int) string, names []string) {
		if exact {
			return
		}
		for k, n := range names {
			found, applies := false, false
			for _, rel := range rels {
				if !appliesTo(tables, rel.Schema+"."+rel.Table) {
					continue
				}
				applies = true
				if slices.ContainsFunc(rel.Columns, func(c cdc.Column) bool { return c.Name == n }) {
					found = true
					break
				}
			}
			if applies && !found {
				msgs = append(msgs, fmt.Sprintf("%s: no table the rule applies to has a column %q", at(k), n))
			}
		}
	}
	for _, r := range s.columns {
		check(r.tables, r.exact, func(k int) string { return fmt.Sprintf("%s.include[%d]", r.path, k) }, r.include)
		check(r.tables, r.exact, func(k int) string { return fmt.Sprintf("%s.exclude[%d]", r.path, k) }, r.exclude)
	}
	for _, r := range s.masks {
		check(r.tables, r.exact, func(k int) string { return fmt.Sprintf("%s.redact[%d]", r.path, k) }, r.redact)
		check(r.tables, r.exact, func(k int) string { return fmt.Sprintf("%s.hash[%d]", r.path, k) }, r.hash)
		var trunc []string
		for n := range r.truncate {
			trunc = append(trunc, n)
		}
		slices.Sort(trunc)
		check(r.tables, r.exact, func(k int) string { return r.path + ".truncate." + trunc[k] }, trunc)
	}
	return msgs
}

// describeColumns lists rel's columns with their types as a filter sees
// them: "id int4 (int, key), status text (string)".
func describeColumns(rel *cdc.Relation) string {
	var parts []string
	for _, c := range rel.Columns {
		t := columnType(c).String()
		if c.Key {
			t += ", key"
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s)", c.Name, c.Type, t))
	}
	return strings.Join(parts, ", ")
}

// listTables joins table names, at most ten of them.
func listTables(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}
