package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
)

// privilegeChecks checks what a role that is not a superuser needs beyond
// the REPLICATION attribute (serverChecks) and a publication its tables'
// owner made (PublicationChecks), for the streamed tables (nil: every
// table): USAGE on each table's schema and SELECT on each table, which
// snapshots read (streaming itself needs neither), and EXECUTE on
// pg_logical_emit_message, which heartbeats and snapshot watermarks call.
// A missing privilege fails when the first start snapshots the tables
// (snapshot.mode initial, initial_only or when_needed), and is a warning
// otherwise: only a requested snapshot, or the heartbeat, would fail. Each
// names the GRANT that fixes it. Nothing for a superuser.
func (s *Source) privilegeChecks(ctx context.Context, c *pgx.Conn, tables []string) ([]config.Check, error) {
	var user, emitMessage string
	var super, canEmit bool
	// The variant heartbeats and watermarks call, with text content:
	// (boolean, text, text), and from PostgreSQL 17 (boolean, text, text,
	// boolean), whose flush argument has a default.
	if err := c.QueryRow(ctx, `SELECT current_user, rolsuper, p.oid::pg_catalog.regprocedure::text, has_function_privilege(p.oid, 'EXECUTE')
		FROM pg_catalog.pg_roles r, pg_catalog.pg_proc p
		WHERE r.rolname = current_user AND p.proname = 'pg_logical_emit_message'
			AND p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.proargtypes[2] = 'text'::pg_catalog.regtype`,
	).Scan(&user, &super, &emitMessage, &canEmit); err != nil {
		return nil, fmt.Errorf("reading the role's privileges: %w", err)
	}
	emitMessage = "pg_catalog." + strings.TrimPrefix(strings.ReplaceAll(emitMessage, ",", ", "), "pg_catalog.")
	if super {
		return nil, nil
	}
	ident := pgx.Identifier{user}.Sanitize()
	atStart := s.cfg.Snapshot.Mode != sources.SnapshotNever
	status, later := config.CheckWarn, "; only a requested snapshot (bridge snapshot) needs it"
	if atStart {
		status, later = config.CheckFail, fmt.Sprintf("; sources.%s.config.snapshot.mode is %s", s.name, s.cfg.Snapshot.Mode)
	}
	rows, err := c.Query(ctx, `SELECT n.nspname::text, c.relname::text, has_schema_privilege(n.oid, 'USAGE'),
			has_table_privilege(c.oid, 'SELECT')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND CASE WHEN $1::text[] IS NULL
			THEN NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
			ELSE n.nspname::text || '.' || c.relname::text = ANY ($1) END
		ORDER BY 1, 2`, tables)
	if err != nil {
		return nil, fmt.Errorf("reading the role's privileges on the streamed tables: %w", err)
	}
	noUsage := map[string]bool{}
	var schemas, unreadable []string
	n := 0
	for rows.Next() {
		var nsp, rel string
		var usage, sel bool
		if err := rows.Scan(&nsp, &rel, &usage, &sel); err != nil {
			return nil, fmt.Errorf("reading the role's privileges on the streamed tables: %w", err)
		}
		n++
		if !usage && !noUsage[nsp] {
			noUsage[nsp] = true
			schemas = append(schemas, nsp)
		}
		if !sel {
			unreadable = append(unreadable, pgx.Identifier{nsp, rel}.Sanitize())
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the role's privileges on the streamed tables: %w", err)
	}
	var checks []config.Check
	for _, nsp := range schemas {
		q := pgx.Identifier{nsp}.Sanitize()
		checks = append(checks, config.Check{Status: status,
			What: fmt.Sprintf("role %q lacks USAGE on schema %s, which snapshots of its tables need%s", user, q, later),
			Fix:  fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", q, ident)})
	}
	if len(unreadable) > 0 {
		checks = append(checks, config.Check{Status: status,
			What: fmt.Sprintf("role %q lacks SELECT on %s, which snapshots read%s", user, strings.Join(unreadable, ", "), later),
			Fix:  fmt.Sprintf("GRANT SELECT ON %s TO %s;", strings.Join(unreadable, ", "), ident)})
	}
	if !canEmit {
		var needs []string
		if s.cfg.HeartbeatInterval > 0 {
			needs = append(needs, fmt.Sprintf("heartbeats (sources.%s.config.heartbeat_interval)", s.name))
		}
		needs = append(needs, "snapshot watermarks")
		why := later
		if !atStart && s.cfg.HeartbeatInterval > 0 {
			why = "; every heartbeat fails, and so would a requested snapshot"
		}
		checks = append(checks, config.Check{Status: status,
			What: fmt.Sprintf("role %q may not execute pg_logical_emit_message, which %s call%s", user, strings.Join(needs, " and "), why),
			Fix:  fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", emitMessage, ident)})
	}
	if len(checks) == 0 {
		checks = append(checks, config.Check{Status: config.CheckOK,
			What: fmt.Sprintf("role %q may read the %d streamed tables (SELECT, USAGE on their schemas) and write logical messages (heartbeats, snapshot watermarks)", user, n)})
	}
	return checks, nil
}

// checkPrivileges runs privilegeChecks at start, on the tables the plugin
// streams: their failures stop the start, their warnings are logged.
func (s *Source) checkPrivileges(ctx context.Context) error {
	_, tables, err := s.plugin.Check(ctx, s.cat)
	if err != nil {
		return err
	}
	checks, err := s.privilegeChecks(ctx, s.cat, tables)
	if err != nil {
		return err
	}
	if err := failures(checks); err != nil {
		return err
	}
	logWarnings(s.log, checks)
	return nil
}

// noConnect is the SetupError for a role refused for lack of CONNECT on
// the database (managed services often revoke it from PUBLIC); nil for
// any other error.
func noConnect(cc *pgx.ConnConfig, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return nil
	}
	return &SetupError{What: fmt.Sprintf("role %q may not connect to database %q: %s", cc.User, cc.Database, pe.Message),
		Fix: fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s;", pgx.Identifier{cc.Database}.Sanitize(), pgx.Identifier{cc.User}.Sanitize())}
}
