package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
}

// ReadSlot reads the slot row; Exists is false when there is none.
func ReadSlot(ctx context.Context, c *pgx.Conn, slot string) (SlotInfo, error) {
	var si SlotInfo
	var plugin, walStatus, db, lsn *string
	var pid *int32
	err := c.QueryRow(ctx, `SELECT slot_name, plugin, slot_type, database, wal_status, confirmed_flush_lsn::text, active, active_pid
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&si.Name, &plugin, &si.Type, &db, &walStatus, &lsn, &si.Active, &pid)
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
	return si, nil
}

// Check verifies the server setup that every logical source needs:
// wal_level, the REPLICATION privilege, and the slot's type, plugin and
// database when the slot exists. It returns the slot row; a lost or missing
// slot is the caller's to judge (Source.Open applies on_slot_lost).
func Check(ctx context.Context, c *pgx.Conn, slot, plugin string) (SlotInfo, error) {
	var errs []error
	var walLevel string
	if err := c.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return SlotInfo{}, fmt.Errorf("reading wal_level: %w", err)
	}
	if walLevel != "logical" {
		errs = append(errs, &SetupError{
			What: fmt.Sprintf("wal_level is %q; logical replication needs 'logical'", walLevel),
			Fix:  "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
		})
	}
	var user string
	var can bool
	if err := c.QueryRow(ctx, `SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &can); err != nil {
		return SlotInfo{}, fmt.Errorf("reading role attributes: %w", err)
	}
	if !can {
		errs = append(errs, &SetupError{
			What: fmt.Sprintf("role %q lacks the REPLICATION privilege", user),
			Fix:  fmt.Sprintf("ALTER ROLE %s WITH REPLICATION;", pgx.Identifier{user}.Sanitize()),
		})
	}
	si, err := ReadSlot(ctx, c, slot)
	if err != nil {
		return si, err
	}
	if si.Exists {
		var db string
		if err := c.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
			return si, fmt.Errorf("reading current database: %w", err)
		}
		switch {
		case si.Type != "logical":
			errs = append(errs, &SetupError{
				What: fmt.Sprintf("slot %q is a %s slot, not a logical one", slot, si.Type),
				Fix:  fmt.Sprintf("use another slot name, or SELECT pg_drop_replication_slot('%s');", slot),
			})
		case si.Plugin != plugin:
			errs = append(errs, &SetupError{
				What: fmt.Sprintf("slot %q was made by the %s plugin, but this source uses %s", slot, si.Plugin, plugin),
				Fix: fmt.Sprintf("set the source's type to %s, or use another slot name, or drop it (its pending changes are lost): SELECT pg_drop_replication_slot('%s');",
					si.Plugin, slot),
			})
		case si.Database != db:
			errs = append(errs, &SetupError{
				What: fmt.Sprintf("slot %q belongs to database %q, but the DSN connects to %q", slot, si.Database, db),
				Fix:  "point the DSN at the slot's database, or use another slot name",
			})
		}
	}
	return si, errors.Join(errs...)
}

// EnsurePublication checks the publication, creating it (before the slot)
// when missing and create is true. It warns through log about published
// tables whose replica identity cannot carry updates and deletes.
func EnsurePublication(ctx context.Context, c *pgx.Conn, log *slog.Logger, pub string, tables []string, create bool) error {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", pub).Scan(&exists); err != nil {
		return fmt.Errorf("reading publication %q: %w", pub, err)
	}
	if !exists {
		sql := CreatePublicationSQL(pub, tables)
		if !create {
			return &SetupError{What: fmt.Sprintf("publication %q does not exist (create_publication is false)", pub), Fix: sql + ";"}
		}
		if _, err := c.Exec(ctx, sql); err != nil {
			return fmt.Errorf("creating publication: %s: %w", sql, err)
		}
		log.Info("created publication", "publication", pub, "sql", sql)
	}
	rows, err := c.Query(ctx, `SELECT pt.schemaname, pt.tablename, c.relreplident::text,
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
		FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = $1 ORDER BY 1, 2`, pub)
	if err != nil {
		return fmt.Errorf("listing tables of publication %q: %w", pub, err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var schema, table, ident string
		var pk bool
		if err := rows.Scan(&schema, &table, &ident, &pk); err != nil {
			rows.Close()
			return fmt.Errorf("listing tables of publication %q: %w", pub, err)
		}
		name := schema + "." + table
		have[name] = true
		q := pgx.Identifier{schema, table}.Sanitize()
		switch {
		case ident == "n":
			log.Warn("table has REPLICA IDENTITY NOTHING: its UPDATEs and DELETEs fail while it is published",
				"table", name, "fix", "ALTER TABLE "+q+" REPLICA IDENTITY FULL;")
		case ident == "d" && !pk:
			log.Warn("table has no primary key: its UPDATEs and DELETEs fail while it is published, and changes carry no key",
				"table", name, "fix", "ALTER TABLE "+q+" ADD PRIMARY KEY (...); or ALTER TABLE "+q+" REPLICA IDENTITY FULL;")
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("listing tables of publication %q: %w", pub, err)
	}
	var missing []string
	for _, t := range tables {
		if !have[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return &SetupError{
			What: fmt.Sprintf("publication %q lacks configured tables %s (or they do not exist)", pub, strings.Join(missing, ", ")),
			Fix:  fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pgx.Identifier{pub}.Sanitize(), quoteTables(missing)),
		}
	}
	if len(have) == 0 {
		log.Warn("publication has no tables yet; nothing will stream until tables are added", "publication", pub)
	}
	return nil
}

// CreatePublicationSQL returns the statement that creates pub for tables
// (all tables when empty).
func CreatePublicationSQL(pub string, tables []string) string {
	if len(tables) == 0 {
		return fmt.Sprintf("CREATE PUBLICATION %s FOR ALL TABLES", pgx.Identifier{pub}.Sanitize())
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pgx.Identifier{pub}.Sanitize(), quoteTables(tables))
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
