package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
)

// SetupError is sources.SetupError.
type SetupError = sources.SetupError

// SlotInfo is a row of pg_replication_slots.
type SlotInfo struct {
	Name, Plugin, Type, Database string
	WALStatus                    string
	ConfirmedFlush               cdc.LSN
	Active                       bool
	ActivePID                    int
	Exists                       bool
	// Failover and Synced are pg_replication_slots.failover and .synced
	// (PostgreSQL 17 and later; false before): a failover slot, and on a
	// standby a copy kept in sync with the primary's (sync_replication_slots).
	Failover, Synced bool
}

// ReadSlot reads the slot row; Exists is false when there is none.
func ReadSlot(ctx context.Context, c *pgx.Conn, slot string) (SlotInfo, error) {
	var si SlotInfo
	var plugin, walStatus, db, lsn *string
	var pid *int32
	var failover, synced *bool
	// failover and synced exist from PostgreSQL 17 on: read through jsonb,
	// NULL before.
	err := c.QueryRow(ctx, `SELECT slot_name, plugin, slot_type, database, wal_status, confirmed_flush_lsn::text, active, active_pid,
			(to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool
		FROM pg_replication_slots s WHERE slot_name = $1`, slot).Scan(&si.Name, &plugin, &si.Type, &db, &walStatus, &lsn, &si.Active, &pid, &failover, &synced)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotInfo{Name: slot}, nil
	}
	if err != nil {
		return si, fmt.Errorf("reading slot %q: %w", slot, err)
	}
	si.Exists = true
	if plugin != nil {
		si.Plugin = *plugin
	}
	if walStatus != nil {
		si.WALStatus = *walStatus
	}
	if db != nil {
		si.Database = *db
	}
	if pid != nil {
		si.ActivePID = int(*pid)
	}
	if lsn != nil {
		si.ConfirmedFlush, _ = cdc.ParseLSN(*lsn)
	}
	si.Failover = failover != nil && *failover
	si.Synced = synced != nil && *synced
	return si, nil
}

// Check verifies the server setup that every logical source needs:
// wal_level, the REPLICATION privilege, and the slot's type, plugin and
// database when the slot exists. It returns the slot row; a lost or missing
// slot is the caller's to judge (Source.Open applies on_slot_lost).
func Check(ctx context.Context, c *pgx.Conn, slot, plugin string) (SlotInfo, error) {
	_, checks, err := serverChecks(ctx, c)
	if err != nil {
		return SlotInfo{}, err
	}
	si, err := ReadSlot(ctx, c, slot)
	if err != nil {
		return si, err
	}
	sc, err := slotChecks(ctx, c, si, plugin)
	if err != nil {
		return si, err
	}
	return si, failures(append(checks, sc...))
}

// role is the connected role.
type role struct {
	name, database      string // the role's and the database's names
	super, replication  bool
	canCreateInDatabase bool // has CREATE on the database
}

// serverChecks reads what every logical source needs of the server and
// its role: wal_level = logical and the REPLICATION privilege. It changes
// nothing; err is a failed query.
func serverChecks(ctx context.Context, c *pgx.Conn) (role, []config.Check, error) {
	var checks []config.Check
	var walLevel string
	if err := c.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return role{}, nil, fmt.Errorf("reading wal_level: %w", err)
	}
	if walLevel != "logical" {
		checks = append(checks, config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("wal_level is %q; logical replication needs 'logical'", walLevel),
			Fix:  "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
		})
	} else {
		checks = append(checks, config.Check{Status: config.CheckOK, What: "wal_level is logical"})
	}
	var r role
	var rds, rdsMember bool // Amazon RDS and Aurora: replication comes from the rds_replication role
	if err := c.QueryRow(ctx, `SELECT current_user, rolsuper, rolreplication, current_database(),
			has_database_privilege(current_database(), 'CREATE'),
			EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication'),
			EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication' AND pg_has_role(current_user, oid, 'MEMBER'))
		FROM pg_roles WHERE rolname = current_user`).Scan(&r.name, &r.super, &r.replication, &r.database, &r.canCreateInDatabase, &rds, &rdsMember); err != nil {
		return role{}, nil, fmt.Errorf("reading role attributes: %w", err)
	}
	switch {
	case r.super:
		checks = append(checks, config.Check{Status: config.CheckOK, What: fmt.Sprintf("role %q is a superuser (REPLICATION included)", r.name)})
	case r.replication:
		checks = append(checks, config.Check{Status: config.CheckOK, What: fmt.Sprintf("role %q has the REPLICATION privilege", r.name)})
	case rdsMember:
		r.replication = true
		checks = append(checks, config.Check{Status: config.CheckOK, What: fmt.Sprintf("role %q is a member of rds_replication (Amazon RDS, Aurora)", r.name)})
	case rds:
		checks = append(checks, config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("role %q lacks the REPLICATION privilege; on Amazon RDS and Aurora it comes from the rds_replication role", r.name),
			Fix:  fmt.Sprintf("GRANT rds_replication TO %s; (as a member of rds_superuser; set rds.logical_replication = 1 in the parameter group too)", pgx.Identifier{r.name}.Sanitize()),
		})
	default:
		checks = append(checks, config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("role %q lacks the REPLICATION privilege", r.name),
			Fix:  fmt.Sprintf("ALTER ROLE %s WITH REPLICATION;", pgx.Identifier{r.name}.Sanitize()),
		})
	}
	return r, checks, nil
}

// slotChecks checks an existing slot's type, plugin and database: a FAIL
// line for each mismatch, else one ok line; nothing for a missing slot.
func slotChecks(ctx context.Context, c *pgx.Conn, si SlotInfo, plugin string) ([]config.Check, error) {
	if !si.Exists {
		return nil, nil
	}
	var db string
	if err := c.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return nil, fmt.Errorf("reading current database: %w", err)
	}
	slot := si.Name
	switch {
	case si.Type != "logical":
		return []config.Check{{Status: config.CheckFail,
			What: fmt.Sprintf("slot %q is a %s slot, not a logical one", slot, si.Type),
			Fix:  fmt.Sprintf("use another slot name, or SELECT pg_drop_replication_slot('%s');", slot),
		}}, nil
	case si.Plugin != plugin:
		return []config.Check{{Status: config.CheckFail,
			What: fmt.Sprintf("slot %q was made by the %s plugin, but this source uses %s", slot, si.Plugin, plugin),
			Fix: fmt.Sprintf("set the source's type to %s, or use another slot name, or drop it (its pending changes are lost): SELECT pg_drop_replication_slot('%s');",
				si.Plugin, slot),
		}}, nil
	case si.Database != db:
		return []config.Check{{Status: config.CheckFail,
			What: fmt.Sprintf("slot %q belongs to database %q, but the DSN connects to %q", slot, si.Database, db),
			Fix:  "point the DSN at the slot's database, or use another slot name",
		}}, nil
	}
	return []config.Check{{Status: config.CheckOK, What: fmt.Sprintf("slot %q exists: logical, %s, database %q", slot, plugin, db)}}, nil
}

// failures returns checks' failures as *SetupErrors, joined; nil when none
// failed.
func failures(checks []config.Check) error {
	var errs []error
	for _, c := range checks {
		if c.Status == config.CheckFail {
			errs = append(errs, &SetupError{What: c.What, Fix: c.Fix})
		}
	}
	return errors.Join(errs...)
}

// logWarnings logs checks' warnings with their fix.
func logWarnings(log *slog.Logger, checks []config.Check) {
	for _, c := range checks {
		if c.Status == config.CheckWarn {
			if c.Fix != "" {
				log.Warn(c.What, "fix", c.Fix)
			} else {
				log.Warn(c.What)
			}
		}
	}
}

// EnsurePublication checks the publication and the configured tables,
// creating the publication (before the slot) when missing and create is
// true. It logs warnings about published tables whose replica identity
// cannot carry updates and deletes. source names the source in fixes.
func EnsurePublication(ctx context.Context, c *pgx.Conn, log *slog.Logger, source, pub string, tables []string, create bool) error {
	exists, _, checks, err := PublicationChecks(ctx, c, source, pub, tables, create)
	if err != nil {
		return err
	}
	if err := failures(checks); err != nil {
		return err
	}
	if !exists && create {
		info, err := readTables(ctx, c, tables)
		if err != nil {
			return err
		}
		sql := CreatePublicationSQL(pub, tables, anyPartitioned(info))
		if _, err := c.Exec(ctx, sql); err != nil {
			return fmt.Errorf("creating publication: %s: %w", sql, err)
		}
		log.Info("created publication", "publication", pub, "sql", sql)
		if _, _, checks, err = PublicationChecks(ctx, c, source, pub, tables, false); err != nil {
			return err
		}
		if err := failures(checks); err != nil {
			return err
		}
	}
	logWarnings(log, checks)
	return nil
}

// tableInfo is what the catalog says of one relation.
type tableInfo struct {
	kind  string // relkind: r (table), p (partitioned table), v, m, f, ...
	ident string // relreplident: d, n, f, i
	pk    bool   // has a primary key
	owned bool   // the current role owns it (or is a member of its owner)
}

// readTables returns the catalog's description of the relations named
// ("schema.table"), or of every user table when names is nil. A name
// missing from the result does not exist.
func readTables(ctx context.Context, c *pgx.Conn, names []string) (map[string]tableInfo, error) {
	rows, err := c.Query(ctx, `SELECT n.nspname::text || '.' || c.relname::text, c.relkind::text, c.relreplident::text,
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
			pg_has_role(c.relowner, 'USAGE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE CASE WHEN $1::text[] IS NULL
			THEN c.relkind IN ('r', 'p') AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
			ELSE n.nspname::text || '.' || c.relname::text = ANY ($1) END`, names)
	if err != nil {
		return nil, fmt.Errorf("reading tables: %w", err)
	}
	out := map[string]tableInfo{}
	for rows.Next() {
		var name string
		var t tableInfo
		if err := rows.Scan(&name, &t.kind, &t.ident, &t.pk, &t.owned); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading tables: %w", err)
		}
		out[name] = t
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading tables: %w", err)
	}
	return out, nil
}

// tableChecks checks that each configured table exists and is a table:
// a FAIL line for each one that is not, naming it as configured with what
// to do (a table of the same name in other letter case is suggested).
// missing severity is what a missing table is: FAIL for a publication,
// which cannot hold it, warn for wal2json, which streams it once created.
func tableChecks(ctx context.Context, c *pgx.Conn, source, db string, tables []string, info map[string]tableInfo, missing config.CheckStatus) ([]config.Check, error) {
	var checks []config.Check
	key := fmt.Sprintf("sources.%s.config.tables", source)
	for _, t := range tables {
		ti, ok := info[t]
		switch {
		case !ok:
			fix := fmt.Sprintf("create the table, or remove %s from %s", t, key)
			var like []string
			rows, err := c.Query(ctx, `SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE lower(n.nspname::text || '.' || c.relname::text) = lower($1) AND c.relkind IN ('r', 'p') ORDER BY 1`, t)
			if err != nil {
				return nil, fmt.Errorf("looking for table %s: %w", t, err)
			}
			for rows.Next() {
				var n string
				if err := rows.Scan(&n); err == nil {
					like = append(like, n)
				}
			}
			rows.Close()
			if len(like) > 0 {
				fix = fmt.Sprintf("write %s in %s (names are case-sensitive), or create the table", strings.Join(like, " or "), key)
			}
			what := fmt.Sprintf("table %s (in %s) does not exist in database %q", t, key, db)
			if missing == config.CheckWarn {
				what += "; its changes stream once it is created"
			}
			checks = append(checks, config.Check{Status: missing, What: what, Fix: fix})
		case ti.kind != "r" && ti.kind != "p":
			checks = append(checks, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("%s (in %s) is a %s, not a table: only tables are replicated", t, key, relkind(ti.kind)),
				Fix:  fmt.Sprintf("remove %s from %s, and list the tables it reads instead", t, key)})
		}
	}
	return checks, nil
}

func relkind(k string) string {
	switch k {
	case "v":
		return "view"
	case "m":
		return "materialized view"
	case "f":
		return "foreign table"
	case "S":
		return "sequence"
	case "i", "I":
		return "index"
	}
	return "relation of kind " + k
}

// identityChecks warns about each table of info whose replica identity
// cannot carry UPDATEs and DELETEs (pgoutput: Postgres refuses them while
// the table is published), with the statement that fixes it.
func identityChecks(names []string, info map[string]tableInfo) []config.Check {
	var checks []config.Check
	for _, name := range names {
		t, ok := info[name]
		if !ok {
			continue
		}
		schema, table, _ := strings.Cut(name, ".")
		q := pgx.Identifier{schema, table}.Sanitize()
		switch {
		case t.ident == "n" && t.pk:
			checks = append(checks, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("table %s has REPLICA IDENTITY NOTHING: its UPDATEs and DELETEs fail while it is published", name),
				Fix:  "ALTER TABLE " + q + " REPLICA IDENTITY DEFAULT;"})
		case t.ident == "n":
			checks = append(checks, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("table %s has REPLICA IDENTITY NOTHING: its UPDATEs and DELETEs fail while it is published", name),
				Fix:  "ALTER TABLE " + q + " REPLICA IDENTITY FULL; (or add a primary key and set REPLICA IDENTITY DEFAULT)"})
		case t.ident == "d" && !t.pk:
			checks = append(checks, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("table %s has no primary key: its UPDATEs and DELETEs fail while it is published, and changes carry no key", name),
				Fix:  "ALTER TABLE " + q + " REPLICA IDENTITY FULL; (or add a primary key)"})
		}
	}
	return checks
}

// PublicationChecks checks, without changing anything, what
// EnsurePublication needs: the publication pub exists (or, with create,
// can be created: the role may, and every configured table exists and is
// a table), it publishes every configured table, and the replica identity
// of each table it publishes (or would publish) carries UPDATEs and
// DELETEs. exists reports whether pub exists; streamed is what the source
// streams: pub's tables, or those it would be created with ("schema.table";
// nil for all tables). source names the source in fixes; err is a failed
// query.
func PublicationChecks(ctx context.Context, c *pgx.Conn, source, pub string, tables []string, create bool) (exists bool, streamed []string, checks []config.Check, err error) {
	var all bool
	err = c.QueryRow(ctx, "SELECT puballtables FROM pg_publication WHERE pubname = $1", pub).Scan(&all)
	exists = err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, nil, nil, fmt.Errorf("reading publication %q: %w", pub, err)
	}
	var r role
	if err := c.QueryRow(ctx, `SELECT current_user, rolsuper, current_database(), has_database_privilege(current_database(), 'CREATE')
		FROM pg_roles WHERE rolname = current_user`).Scan(&r.name, &r.super, &r.database, &r.canCreateInDatabase); err != nil {
		return false, nil, nil, fmt.Errorf("reading role attributes: %w", err)
	}
	var info map[string]tableInfo
	if len(tables) > 0 {
		if info, err = readTables(ctx, c, tables); err != nil {
			return false, nil, nil, err
		}
	}
	if checks, err = tableChecks(ctx, c, source, r.database, tables, info, config.CheckFail); err != nil {
		return false, nil, nil, err
	}
	if !exists {
		if len(tables) == 0 {
			if info, err = readTables(ctx, c, nil); err != nil {
				return false, nil, nil, err
			}
		}
		sql := CreatePublicationSQL(pub, tables, anyPartitioned(info)) + ";"
		switch {
		case !create:
			checks = append(checks, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("publication %q does not exist (create_publication is false)", pub), Fix: sql})
		case len(tables) == 0 && !r.super:
			checks = append(checks, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("publication %q does not exist, and creating it FOR ALL TABLES needs a superuser; role %q is not one", pub, r.name),
				Fix:  fmt.Sprintf("as a superuser: %s or list the tables in sources.%s.config.tables (the bridge then creates it FOR TABLE, which needs only ownership of them)", sql, source)})
		default:
			// CREATE PUBLICATION needs CREATE on the database, and FOR
			// TABLE the ownership of each table.
			var why []string
			if !r.super && !r.canCreateInDatabase {
				why = append(why, fmt.Sprintf("it lacks CREATE on database %q", r.database))
			}
			var notOwned []string
			for _, t := range tables {
				if ti, ok := info[t]; ok && !ti.owned && !r.super {
					notOwned = append(notOwned, t)
				}
			}
			if len(notOwned) > 0 {
				why = append(why, "it does not own "+strings.Join(notOwned, ", "))
			}
			switch {
			case len(why) > 0:
				checks = append(checks, config.Check{Status: config.CheckFail,
					What: fmt.Sprintf("publication %q does not exist, and role %q may not create it: %s", pub, r.name, strings.Join(why, "; ")),
					Fix: fmt.Sprintf("as a superuser: %s or give role %s CREATE on the database (GRANT CREATE ON DATABASE %s TO %s;) and the ownership of the tables",
						sql, pgx.Identifier{r.name}.Sanitize(), pgx.Identifier{r.database}.Sanitize(), pgx.Identifier{r.name}.Sanitize())})
			case failures(checks) == nil:
				checks = append(checks, config.Check{Status: config.CheckOK,
					What: fmt.Sprintf("publication %q does not exist yet: `bridge run` creates it (%s)", pub, sql)})
			}
		}
		if len(tables) > 0 {
			streamed = tables
		}
		checks = append(checks, identityChecks(slices.Sorted(maps.Keys(info)), info)...)
		return false, streamed, checks, nil
	}
	rows, err := c.Query(ctx, `SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, pub)
	if err != nil {
		return false, nil, nil, fmt.Errorf("listing tables of publication %q: %w", pub, err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return false, nil, nil, fmt.Errorf("listing tables of publication %q: %w", pub, err)
		}
		streamed = append(streamed, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, nil, nil, fmt.Errorf("listing tables of publication %q: %w", pub, err)
	}
	if streamed == nil {
		streamed = []string{} // none, not all
	}
	var missing []string
	for _, t := range tables {
		if ti, ok := info[t]; ok && !slices.Contains(streamed, t) {
			if ti.kind == "p" {
				// Without publish_via_partition_root the publication
				// lists a partitioned table's partitions, not the table.
				var in bool
				schema, table, _ := strings.Cut(t, ".")
				if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partition_tree($1::regclass) p
						JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace
						WHERE n.nspname::text || '.' || c.relname::text = ANY ($2))`, pgx.Identifier{schema, table}.Sanitize(), streamed).Scan(&in); err != nil {
					return false, nil, nil, fmt.Errorf("reading the partitions of %s: %w", t, err)
				}
				if in {
					continue
				}
			}
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		checks = append(checks, config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("publication %q lacks configured tables %s", pub, strings.Join(missing, ", ")),
			Fix:  fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pgx.Identifier{pub}.Sanitize(), quoteTables(missing)),
		})
	}
	switch {
	case len(streamed) == 0:
		checks = append(checks, config.Check{Status: config.CheckWarn,
			What: fmt.Sprintf("publication %q has no tables yet: nothing streams until tables are added", pub),
			Fix:  fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE <schema.table>; (takes effect while the bridge runs)", pgx.Identifier{pub}.Sanitize())})
	default:
		what := fmt.Sprintf("publication %q exists and publishes %s", pub, listNames(streamed))
		if all {
			what += " (FOR ALL TABLES)"
		}
		var extra []string
		for _, t := range streamed {
			if len(tables) > 0 && !slices.Contains(tables, t) {
				extra = append(extra, t)
			}
		}
		if len(extra) > 0 {
			what += fmt.Sprintf("; %s stream too although not in tables (tables only creates and checks the publication)", listNames(extra))
		}
		checks = append(checks, config.Check{Status: config.CheckOK, What: what})
	}
	if info, err = readTables(ctx, c, streamed); err != nil {
		return false, nil, nil, err
	}
	checks = append(checks, identityChecks(streamed, info)...)
	return true, streamed, checks, nil
}

// listNames lists names for a message, the first ten of them.
func listNames(names []string) string {
	if len(names) <= 10 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:10], ", "), len(names)-10)
}

// CreatePublicationSQL returns the statement that creates pub for tables
// (all tables when empty).
//
// viaRoot, for publications with a partitioned table, adds
// publish_via_partition_root, so that its changes carry its own name, as
// the user named it in tables, rather than each partition's.
func CreatePublicationSQL(pub string, tables []string, viaRoot bool) string {
	with := ""
	if viaRoot {
		with = " WITH (publish_via_partition_root = true)"
	}
	if len(tables) == 0 {
		return fmt.Sprintf("CREATE PUBLICATION %s FOR ALL TABLES%s", pgx.Identifier{pub}.Sanitize(), with)
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s%s", pgx.Identifier{pub}.Sanitize(), quoteTables(tables), with)
}

// anyPartitioned reports whether info holds a partitioned table.
func anyPartitioned(info map[string]tableInfo) bool {
	for _, t := range info {
		if t.kind == "p" {
			return true
		}
	}
	return false
}

func quoteTables(tables []string) string {
	q := make([]string, len(tables))
	for i, t := range tables {
		s, tb, _ := strings.Cut(t, ".")
		q[i] = pgx.Identifier{s, tb}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// Redact hides the password in a DSN for messages.
func Redact(dsn string) string { return config.Redact(dsn) }
