package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

// connectTimeout bounds each connection a check opens.
const connectTimeout = 10 * time.Second

// Check implements sources.Checker: the DSN, a catalog and a replication
// connection, what Check and the plugin's Prepare verify at start, the
// slot as Open would judge it with req.From, and the columns req's
// routes read. It creates nothing: no publication, no slot.
func (s *Source) Check(ctx context.Context, req sources.CheckRequest) []config.Check {
	var out []config.Check
	add := func(cs ...config.Check) { out = append(out, cs...) }
	failed := func(doing string, err error) []config.Check {
		return append(out, config.Check{Status: config.CheckFail, What: config.Redact(fmt.Sprintf("%s: %v", doing, err))})
	}
	dsnKey := fmt.Sprintf("sources.%s.config.dsn", s.name)
	ccfg, err := s.connConfig("bridge:" + s.name + ":validate")
	if err != nil {
		return append(out, config.Check{Status: config.CheckFail,
			What: config.Redact(fmt.Sprintf("%s does not parse: %v", dsnKey, err)),
			Fix:  "write a URL (postgres://user:password@host:5432/database) or key=value pairs (host=db port=5432 user=bridge dbname=shop)"})
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	cat, err := pgx.ConnectConfig(cctx, ccfg)
	cancel()
	if err != nil {
		if what, fix := tlsProblem(s.cfg.DSN, err); what != "" {
			return append(out, config.Check{Status: config.CheckFail, What: config.Redact(what), Fix: fix})
		}
		return append(out, config.Check{Status: config.CheckFail,
			What: config.Redact(fmt.Sprintf("connecting to %s: %v", Redact(s.cfg.DSN), err)), Fix: connectFix(err, dsnKey, ccfg)})
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = cat.Close(cctx)
		cancel()
	}()
	var version, user, db string
	if err := cat.QueryRow(ctx, `SELECT current_setting('server_version'), current_user, current_database()`).Scan(&version, &user, &db); err != nil {
		return failed("reading the server version", err)
	}
	add(config.Check{Status: config.CheckOK, What: fmt.Sprintf("connected to %s as role %q, database %q (PostgreSQL %s)", Redact(s.cfg.DSN), user, db, version)})
	_, sc, err := serverChecks(ctx, cat)
	if err != nil {
		return failed("checking the server", err)
	}
	add(sc...)
	si, err := ReadSlot(ctx, cat, s.cfg.Slot)
	if err != nil {
		return failed("reading the slot", err)
	}
	add(s.replicationCheck(ctx, dsnKey, cat, req, si)...)

	slotc, err := slotChecks(ctx, cat, si, s.plugin.Name())
	if err != nil {
		return failed("checking the slot", err)
	}
	add(slotc...)
	sst, err := s.slotStateChecks(ctx, cat, si, req.From, db)
	if err != nil {
		return failed("checking the slot", err)
	}
	add(sst...)
	add(s.failoverChecks(ctx, cat, si)...) // failovercheck.go

	pc, tables, err := s.plugin.Check(ctx, cat)
	if err != nil {
		return failed("checking the "+s.plugin.Name()+" setup", err)
	}
	add(pc...)
	privc, err := s.privilegeChecks(ctx, cat, tables)
	if err != nil {
		return failed("checking the role's privileges", err)
	}
	add(privc...)
	cc, err := columnChecks(ctx, cat, tables, req.Columns)
	if err != nil {
		return failed("reading the columns of the streamed tables", err)
	}
	add(cc...)
	if req.Tables != nil {
		rels, err := relations(ctx, cat, tables)
		if err != nil {
			return failed("reading the columns of the streamed tables", err)
		}
		add(req.Tables(rels)...)
	}
	return out
}

// relations describes the streamed tables (tables nil: every table) as
// the stream will: the replicated columns in order, their types named as
// the decoders name them, and the key as the sources flag it (the
// replica identity index, or the primary key).
func relations(ctx context.Context, c *pgx.Conn, tables []string) ([]*cdc.Relation, error) {
	rows, err := c.Query(ctx, `SELECT c.oid, n.nspname::text, c.relname::text, c.relreplident::text, a.attname::text, a.atttypid,
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey)
				AND CASE c.relreplident WHEN 'i' THEN i.indisreplident WHEN 'n' THEN false ELSE i.indisprimary END)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		WHERE c.relkind IN ('r', 'p') AND CASE WHEN $1::text[] IS NULL
			THEN NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
			ELSE n.nspname::text || '.' || c.relname::text = ANY ($1) END
		ORDER BY n.nspname, c.relname, a.attnum`, tables)
	if err != nil {
		return nil, err
	}
	type col struct {
		rel *cdc.Relation
		i   int
	}
	var rels []*cdc.Relation
	var oids []uint32
	var cols []col
	for rows.Next() {
		var relOID, typOID uint32
		var schema, table, ident, name string
		var key bool
		if err := rows.Scan(&relOID, &schema, &table, &ident, &name, &typOID, &key); err != nil {
			rows.Close()
			return nil, err
		}
		if len(rels) == 0 || rels[len(rels)-1].ID != relOID {
			rels = append(rels, &cdc.Relation{ID: relOID, Schema: schema, Table: table, ReplicaIdentity: ident[0]})
		}
		r := rels[len(rels)-1]
		r.Columns = append(r.Columns, cdc.Column{Name: name, OID: typOID, Key: key})
		oids = append(oids, typOID)
		cols = append(cols, col{r, len(r.Columns) - 1})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	types := pgtypes.NewResolver(c)
	for k, cl := range cols {
		t, err := types.Lookup(ctx, oids[k])
		if err != nil {
			return nil, fmt.Errorf("the type of %s.%s.%s: %w", cl.rel.Schema, cl.rel.Table, cl.rel.Columns[cl.i].Name, err)
		}
		cl.rel.Columns[cl.i].Type = t.Name
	}
	return rels, nil
}

// replicationCheck opens a replication connection, as Open does, and asks
// for IDENTIFY_SYSTEM: pg_hba.conf and max_wal_senders must let it in.
// Then it judges the server's lineage against req's as Open would
// (lineageCheck).
func (s *Source) replicationCheck(ctx context.Context, dsnKey string, cat *pgx.Conn, req sources.CheckRequest, si SlotInfo) []config.Check {
	rcfg, err := s.replConfig("bridge:" + s.name + ":validate")
	if err != nil {
		return []config.Check{{Status: config.CheckFail, What: config.Redact(fmt.Sprintf("%s does not parse: %v", dsnKey, err))}}
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	repl, err := pgconn.ConnectConfig(cctx, rcfg)
	if err != nil {
		if what, fix := tlsProblem(s.cfg.DSN, err); what != "" {
			return []config.Check{{Status: config.CheckFail, What: config.Redact(what), Fix: fix}}
		}
		return []config.Check{{Status: config.CheckFail,
			What: config.Redact(fmt.Sprintf("opening a replication connection to %s: %v", Redact(s.cfg.DSN), err)),
			Fix:  replicationFix(err)}}
	}
	defer func() { _ = repl.Close(context.Background()) }()
	sys, err := pglogrepl.IdentifySystem(cctx, repl)
	if err != nil {
		return []config.Check{{Status: config.CheckFail, What: fmt.Sprintf("IDENTIFY_SYSTEM on a replication connection: %v", err), Fix: replicationFix(err)}}
	}
	out := []config.Check{{Status: config.CheckOK, What: fmt.Sprintf("replication connection accepted (system %s, timeline %d)", sys.SystemID, sys.Timeline)}}
	var standby bool
	if err := cat.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
		return append(out, config.Check{Status: config.CheckFail, What: fmt.Sprintf("reading pg_is_in_recovery(): %v", err)})
	}
	cur := sources.Lineage{SystemID: sys.SystemID, Timeline: uint32(sys.Timeline), Standby: standby}
	return append(out, s.lineageCheck(req, cur, si, func() (map[uint32]cdc.LSN, error) {
		if cur.Timeline <= 1 {
			return map[uint32]cdc.LSN{}, nil
		}
		h, err := pglogrepl.TimelineHistory(cctx, repl, int32(cur.Timeline))
		if err != nil {
			return nil, fmt.Errorf("TIMELINE_HISTORY %d: %w", cur.Timeline, err)
		}
		return parseHistory(h.Content)
	})...)
}

// lineageCheck is validate's judgement of the server's lineage cur
// against the one recorded with the checkpoint (req), as checkLineage
// judges it at Open, with the checkpoint as the stream's end (Open also
// reads the end the sinks hold, which may be further).
func (s *Source) lineageCheck(req sources.CheckRequest, cur sources.Lineage, si SlotInfo, forks func() (map[uint32]cdc.LSN, error)) []config.Check {
	exp := req.Lineage
	j, err := judgeLineage(exp, cur, req.From, req.From, si.Exists, si.Synced, forks)
	if err != nil {
		return []config.Check{{Status: config.CheckFail, What: fmt.Sprintf("reading the server's timeline history: %v", err)}}
	}
	switch j.kind {
	case lineageSame:
		if exp.Timeline == 0 || req.From == 0 {
			return nil // nothing recorded (a checkpoint of an older version), or nothing streamed
		}
		return []config.Check{{Status: config.CheckOK, What: fmt.Sprintf("the server is on timeline %d, the one the checkpoint was recorded on", cur.Timeline)}}
	case lineageHolds:
		return []config.Check{{Status: config.CheckWarn, What: j.note + fmt.Sprintf(
			"; the checkpoint (%s) is at or before that point: `bridge run` streams on if the sinks hold nothing past it either, "+
				"and stops naming the failover if they do (it reads their end at start)", req.From),
			Fix: "nothing, if nothing was published past the switch point; set synchronized_standby_slots on the primary so that a failover never loses part of the stream (docs/sources.md#failover)"}}
	case lineagePromoted:
		return []config.Check{{Status: config.CheckOK, What: j.note + "; the standby this source reads was promoted, and its slot carries on"}}
	}
	if !si.Exists {
		return nil // as at Open, the slot checks report the missing slot
	}
	what := j.lacksWhat(req.From)
	if s.cfg.OnSlotLost == SlotLostRecreate {
		fix := "nothing to do if consumers re-read on a resync message; set synchronized_standby_slots on the primary to prevent it (docs/sources.md#failover)"
		if j.reason == "system_changed" {
			fix = "nothing to do if this cluster replaces the one the checkpoint was recorded on (consumers re-read on the resync message); if the DSN is wrong, point it back before the next run"
		}
		return []config.Check{{Status: config.CheckWarn,
			What: what + "; `bridge run` publishes a resync message and streams from the slot's confirmed position under a new epoch (on_slot_lost: recreate)",
			Fix:  fix}}
	}
	return []config.Check{{Status: config.CheckFail, What: what + "; `bridge run` stops here (on_slot_lost: fail)", Fix: s.divergedFix(si, j.reason)}}
}

// slotStateChecks judges the slot as Open would: missing (created, or a
// failure without create_slot or with a checkpoint that needs it), lost
// (wal_status = lost), or held by another walsender.
func (s *Source) slotStateChecks(ctx context.Context, cat *pgx.Conn, si SlotInfo, from cdc.LSN, db string) ([]config.Check, error) {
	slot := s.cfg.Slot
	lost := (si.Exists && si.WALStatus == "lost") || (!si.Exists && from != 0)
	switch {
	case lost && s.cfg.OnSlotLost != SlotLostRecreate:
		e := s.slotLostError(si, from, db, "")
		return []config.Check{{Status: config.CheckFail, What: e.What, Fix: e.Fix}}, nil
	case lost:
		e := s.slotLostError(si, from, db, "")
		return []config.Check{{Status: config.CheckWarn,
			What: e.What + "; `bridge run` recreates it under a new epoch and publishes a resync message (on_slot_lost: recreate)",
			Fix:  "nothing to do if consumers re-read on a resync message; raise max_slot_wal_keep_size (or set it to -1) to prevent it"}}, nil
	case !si.Exists && !s.cfg.CreateSlot:
		return []config.Check{{Status: config.CheckFail,
			What: fmt.Sprintf("slot %q does not exist (create_slot is false)", slot),
			Fix:  fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', '%s');", slot, s.plugin.Name())}}, nil
	case !si.Exists:
		var free int
		if err := cat.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)`).Scan(&free); err != nil {
			return nil, fmt.Errorf("counting replication slots: %w", err)
		}
		if free <= 0 {
			return []config.Check{{Status: config.CheckFail,
				What: fmt.Sprintf("slot %q does not exist, and every replication slot is taken (max_replication_slots)", slot),
				Fix:  "drop a slot nobody reads (SELECT slot_name, active FROM pg_replication_slots;), or raise max_replication_slots (ALTER SYSTEM SET max_replication_slots = <n>; then restart PostgreSQL)"}}, nil
		}
		return []config.Check{{Status: config.CheckOK, What: fmt.Sprintf("slot %q does not exist yet: `bridge run` creates it (%s)", slot, s.plugin.Name())}}, nil
	case si.Active:
		return []config.Check{{Status: config.CheckWarn,
			What: fmt.Sprintf("slot %q is in use by PID %d (another bridge, or a walsender whose client died): `bridge run` waits until it is free", slot, si.ActivePID),
			Fix:  fmt.Sprintf("nothing, if that is the bridge or a standby's peer; else SELECT pg_terminate_backend(%d);", si.ActivePID)}}, nil
	}
	return nil, nil
}

// connectFix says what to do about a failed connection.
func connectFix(err error, dsnKey string, cc *pgx.ConnConfig) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01":
			return fmt.Sprintf("check the user and password in %s", dsnKey)
		case "28000":
			return fmt.Sprintf("pg_hba.conf on the server has no entry that lets user %q connect to database %q from this host: add one (then SELECT pg_reload_conf();), or use another role", cc.User, cc.Database)
		case "42501":
			return fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s;", pgx.Identifier{cc.Database}.Sanitize(), pgx.Identifier{cc.User}.Sanitize())
		case "3D000":
			return fmt.Sprintf("create the database (CREATE DATABASE %s;), or fix the database name in %s", pgx.Identifier{cc.Database}.Sanitize(), dsnKey)
		case "53300":
			return "the server has no free connection: raise max_connections, or close idle ones"
		case "57P03":
			return "the server is starting up, shutting down or in recovery: try again when it accepts connections"
		}
		return ""
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("nothing answered at %s:%d within %s: check the host, the port and the firewall", cc.Host, cc.Port, connectTimeout)
	}
	if strings.Contains(err.Error(), "connection refused") {
		return fmt.Sprintf("nothing listens at %s:%d: is PostgreSQL running there, with listen_addresses covering that address?", cc.Host, cc.Port)
	}
	if strings.Contains(err.Error(), "no such host") {
		return fmt.Sprintf("the host %q is not known: fix it in %s", cc.Host, dsnKey)
	}
	return ""
}

// replicationFix says what to do about a refused replication connection.
func replicationFix(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28000":
			return "pg_hba.conf must let this role connect to the database (a logical replication connection matches the database name, not the replication keyword): add an entry, then SELECT pg_reload_conf();"
		case "53300":
			return "every WAL sender is busy: raise max_wal_senders (then restart PostgreSQL), or stop a replication client"
		case "42501":
			return "the role needs the REPLICATION privilege (see above)"
		}
	}
	return ""
}

// column is what the catalog says of one column of a streamed table.
type column struct {
	typ       string
	key       bool // part of the key the sources flag (replica identity index, or primary key)
	generated bool // generated columns are not replicated
}

// columnChecks checks that the columns each route's subject template reads
// exist in every streamed table the route matches (tables nil: every
// table), and that its {{.Key.x}} columns are key columns: one line per
// route and column.
func columnChecks(ctx context.Context, c *pgx.Conn, tables []string, uses []sources.ColumnUse) ([]config.Check, error) {
	if len(uses) == 0 {
		return nil, nil
	}
	rows, err := c.Query(ctx, `SELECT n.nspname::text || '.' || c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod), a.attgenerated <> '',
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey)
				AND CASE c.relreplident WHEN 'i' THEN i.indisreplident WHEN 'n' THEN false ELSE i.indisprimary END)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE c.relkind IN ('r', 'p') AND CASE WHEN $1::text[] IS NULL
			THEN NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
			ELSE n.nspname::text || '.' || c.relname::text = ANY ($1) END
		ORDER BY 1, a.attnum`, tables)
	if err != nil {
		return nil, err
	}
	cols := map[string]map[string]column{}
	var names []string
	for rows.Next() {
		var table, name string
		var col column
		if err := rows.Scan(&table, &name, &col.typ, &col.generated, &col.key); err != nil {
			rows.Close()
			return nil, err
		}
		if cols[table] == nil {
			cols[table] = map[string]column{}
			names = append(names, table)
		}
		cols[table][name] = col
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var checks []config.Check
	for _, u := range uses {
		var matched []string
		for _, t := range names {
			if (len(u.Tables) == 0 || matchAny(u.Tables, t)) && !matchAny(u.Skip, t) {
				matched = append(matched, t)
			}
		}
		if len(matched) == 0 {
			checks = append(checks, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("%s reads %s, but no table the source streams matches the route", u.Route, refs(u)),
				Fix:  "check the route's match.tables against the source's tables or publication"})
			continue
		}
		for _, key := range []bool{false, true} {
			names := u.Col
			if key {
				names = u.Key
			}
			for _, name := range names {
				checks = append(checks, columnCheck(u.Route, name, key, matched, cols))
			}
		}
	}
	return checks, nil
}

// matchAny reports whether table ("schema.table") matches one of globs,
// as a route's match.tables does.
func matchAny(globs []string, table string) bool {
	return slices.ContainsFunc(globs, func(g string) bool { ok, _ := path.Match(g, table); return ok })
}

// columnCheck is the line of one column a route reads from the tables it
// matches.
func columnCheck(route, name string, key bool, matched []string, cols map[string]map[string]column) config.Check {
	ref := fmt.Sprintf("{{.Col.%s}}", name)
	if key {
		ref = fmt.Sprintf("{{.Key.%s}}", name)
	}
	var lack, notKey, generated, have, types []string
	for _, t := range matched {
		col, ok := cols[t][name]
		switch {
		case !ok:
			lack = append(lack, t)
		case col.generated:
			generated = append(generated, t)
		case key && !col.key:
			notKey = append(notKey, t)
		default:
			have = append(have, t)
			if !slices.Contains(types, col.typ) {
				types = append(types, col.typ)
			}
		}
	}
	switch {
	case len(lack) > 0:
		return config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("%s reads %s, but %s has no column %q", route, ref, listNames(lack), name),
			Fix:  "change the template, or limit the route's match.tables to tables that have the column" + only(have)}
	case len(generated) > 0:
		return config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("%s reads %s, but %q is a generated column of %s: generated columns are not replicated", route, ref, name, listNames(generated)),
			Fix:  "read another column, or limit the route's match.tables" + only(have)}
	case len(notKey) > 0:
		return config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("%s reads %s, but %q is not part of the key of %s", route, ref, name, listNames(notKey)),
			Fix:  fmt.Sprintf("write {{.Col.%s}}, or limit the route's match.tables", name) + only(have)}
	}
	return config.Check{Status: config.CheckOK,
		What: fmt.Sprintf("%s reads %s: %s in %s", route, ref, strings.Join(types, "/"), listNames(have))}
}

// only names the tables that have what a route reads, for a fix.
func only(have []string) string {
	if len(have) == 0 {
		return ""
	}
	return " (" + listNames(have) + ")"
}

// refs lists the columns u reads, as in its template.
func refs(u sources.ColumnUse) string {
	var out []string
	for _, c := range u.Col {
		out = append(out, "{{.Col."+c+"}}")
	}
	for _, k := range u.Key {
		out = append(out, "{{.Key."+k+"}}")
	}
	return strings.Join(out, ", ")
}

var _ sources.Checker = (*Source)(nil)
