package schema

import (
	"fmt"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// The event trigger of `bridge setup ddl` (docs/schemas.md#ddl-events).
//
// Two event triggers: bridge_ddl_sql_drop (sql_drop) keeps the objects a
// command drops in a transaction-local setting (bridge.ddl_dropped), and
// bridge_ddl_command_end (ddl_command_end) writes, for each table the
// command created, altered or dropped (or something of: a column, an
// index, a constraint, a trigger, a rule, a policy, a default, an owned
// sequence), one transactional logical message with the statement's
// text, the command's objects and what it dropped; for a command on no
// table, one message with no table, then an empty message with the
// bridge's heartbeat prefix (commandEndFunction says why). Commands on
// temporary objects only write nothing, nor does anything with wal_level
// below logical. A failure in building the messages is a WARNING, never
// the command's failure. The functions run as the role running the command
// (SECURITY INVOKER), under its search_path (which the messages record):
// they name every catalog table and function with its schema.

// ddlTrailerPrefix is the prefix of the empty message after a command's
// DDL messages: the bridge's heartbeat prefix (sources/internal/pgrepl's
// HeartbeatPrefix), which every bridge source drops before numbering a
// transaction's changes.
const ddlTrailerPrefix = "bridge_heartbeat"

// DDLTriggerNames are the event triggers DDLSetupSQL creates.
var DDLTriggerNames = []string{"bridge_ddl_command_end", "bridge_ddl_sql_drop"}

// DDLSetupSQL returns the SQL that installs (or replaces) the event
// triggers and their functions, the functions in schema fnSchema, in
// one transaction.
func DDLSetupSQL(fnSchema string) string {
	s := quoteIdent(fnSchema)
	var b strings.Builder
	b.WriteString("-- bridge setup ddl: every DDL command into the WAL, for the bridge's DDL events (docs/schemas.md#ddl-events).\n")
	b.WriteString("-- Needs a superuser (or the managed service's administrator role that may create event triggers).\n")
	b.WriteString("BEGIN;\n")
	for _, t := range DDLTriggerNames {
		fmt.Fprintf(&b, "DROP EVENT TRIGGER IF EXISTS %s;\n", t)
	}
	fmt.Fprintf(&b, sqlDropFunction, s)
	fmt.Fprintf(&b, commandEndFunction, s, cdc.DDLPrefix, ddlTrailerPrefix)
	fmt.Fprintf(&b, "CREATE EVENT TRIGGER bridge_ddl_sql_drop ON sql_drop EXECUTE FUNCTION %s.bridge_ddl_sql_drop();\n", s)
	fmt.Fprintf(&b, "CREATE EVENT TRIGGER bridge_ddl_command_end ON ddl_command_end EXECUTE FUNCTION %s.bridge_ddl_command_end();\n", s)
	b.WriteString("COMMIT;\n")
	return b.String()
}

// DDLRemoveSQL returns the SQL that removes what DDLSetupSQL installs.
func DDLRemoveSQL(fnSchema string) string {
	s := quoteIdent(fnSchema)
	var b strings.Builder
	b.WriteString("-- bridge setup ddl --remove: the bridge's DDL event triggers and their functions.\n")
	b.WriteString("BEGIN;\n")
	for _, t := range DDLTriggerNames {
		fmt.Fprintf(&b, "DROP EVENT TRIGGER IF EXISTS %s;\n", t)
	}
	fmt.Fprintf(&b, "DROP FUNCTION IF EXISTS %s.bridge_ddl_command_end();\n", s)
	fmt.Fprintf(&b, "DROP FUNCTION IF EXISTS %s.bridge_ddl_sql_drop();\n", s)
	b.WriteString("COMMIT;\n")
	return b.String()
}

// sqlDropFunction (%[1]s: the schema) keeps the dropped objects, with the
// table each belongs to (from its address: the objects are gone from the
// catalogs), for bridge_ddl_command_end.
const sqlDropFunction = `CREATE OR REPLACE FUNCTION %[1]s.bridge_ddl_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY INVOKER AS $bridge$
DECLARE
  dropped jsonb;
BEGIN
  SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
           'type', o.object_type, 'temporary', CASE WHEN o.is_temporary THEN true END, 'identity', o.object_identity, 'schema', o.schema_name,
           'table', CASE WHEN o.object_type IN ('table', 'view', 'materialized view', 'foreign table', 'table column',
                                                'table constraint', 'trigger', 'rule', 'policy', 'default value')
                          AND cardinality(o.address_names) >= 2
                         THEN jsonb_build_object('schema', o.address_names[1], 'name', o.address_names[2]) END,
           'original', CASE WHEN o.original THEN true END)) ORDER BY o.ord), '[]'::jsonb)
    INTO dropped
    FROM (SELECT x.*, row_number() OVER () AS ord FROM pg_catalog.pg_event_trigger_dropped_objects() x) o;
  PERFORM pg_catalog.set_config('bridge.ddl_dropped',
    (coalesce(nullif(pg_catalog.current_setting('bridge.ddl_dropped', true), ''), '[]')::jsonb || dropped)::text, true);
EXCEPTION WHEN OTHERS THEN
  RAISE WARNING 'bridge DDL capture (sql_drop) failed: %%: the DDL event of this command may lack what it dropped', SQLERRM;
END
$bridge$;
`

// commandEndFunction (%[1]s: the schema, %[2]s: the prefix, %[3]s: the
// trailer's prefix) writes the messages. It builds them in a block of its
// own (a subtransaction, which catches a failure) but writes them after
// it, in the command's transaction: a transactional message is ordered in
// decoding by the end of its record, the start of the next one, and a
// message in a subtransaction of its own could come after a change of the
// transaction that starts there. The trailer (an empty message with the
// bridge's heartbeat prefix, which every bridge source drops) keeps the
// last message before the next change also when the command itself runs
// in a subtransaction (SAVEPOINT, a plpgsql EXCEPTION block).
const commandEndFunction = `CREATE OR REPLACE FUNCTION %[1]s.bridge_ddl_command_end() RETURNS event_trigger
LANGUAGE plpgsql SECURITY INVOKER AS $bridge$
DECLARE
  objs jsonb;
  dropped jsonb;
  total bigint;
  tb jsonb;
  msg jsonb;
  msgs jsonb[] := '{}';
BEGIN
  IF pg_catalog.current_setting('wal_level') <> 'logical' THEN
    RETURN;
  END IF;
  BEGIN
    dropped := coalesce(nullif(pg_catalog.current_setting('bridge.ddl_dropped', true), ''), '[]')::jsonb;
    PERFORM pg_catalog.set_config('bridge.ddl_dropped', '', true);
    total := jsonb_array_length(dropped);
    SELECT coalesce(jsonb_agg(e), '[]'::jsonb) INTO dropped FROM jsonb_array_elements(dropped) e WHERE NOT e ? 'temporary';
    total := total + (SELECT count(*) FROM pg_catalog.pg_event_trigger_ddl_commands());
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
             'type', d.object_type, 'identity', d.object_identity, 'schema', d.schema_name,
             'table', CASE WHEN tc.oid IS NOT NULL THEN jsonb_build_object('schema', tn.nspname, 'name', tc.relname) END,
             'in_extension', CASE WHEN d.in_extension THEN true END)) ORDER BY d.ord), '[]'::jsonb)
      INTO objs
      FROM (SELECT x.classid, x.objid, x.object_type, x.schema_name, x.object_identity, x.in_extension,
                   row_number() OVER () AS ord
              FROM pg_catalog.pg_event_trigger_ddl_commands() x) d
      LEFT JOIN LATERAL (SELECT CASE
          WHEN d.classid = 'pg_catalog.pg_class'::regclass THEN (
            SELECT CASE
              WHEN c.relkind IN ('r', 'p', 'f', 'v', 'm') THEN c.oid
              WHEN c.relkind IN ('i', 'I') THEN (SELECT i.indrelid FROM pg_catalog.pg_index i WHERE i.indexrelid = c.oid)
              WHEN c.relkind = 'S' THEN (SELECT dp.refobjid FROM pg_catalog.pg_depend dp
                                          WHERE dp.classid = 'pg_catalog.pg_class'::regclass AND dp.objid = c.oid
                                            AND dp.refclassid = 'pg_catalog.pg_class'::regclass AND dp.deptype IN ('a', 'i') LIMIT 1)
              WHEN c.relkind = 't' THEN (SELECT o.oid FROM pg_catalog.pg_class o WHERE o.reltoastrelid = c.oid)
            END FROM pg_catalog.pg_class c WHERE c.oid = d.objid)
          WHEN d.classid = 'pg_catalog.pg_constraint'::regclass THEN (SELECT nullif(k.conrelid, 0) FROM pg_catalog.pg_constraint k WHERE k.oid = d.objid)
          WHEN d.classid = 'pg_catalog.pg_trigger'::regclass THEN (SELECT g.tgrelid FROM pg_catalog.pg_trigger g WHERE g.oid = d.objid)
          WHEN d.classid = 'pg_catalog.pg_rewrite'::regclass THEN (SELECT w.ev_class FROM pg_catalog.pg_rewrite w WHERE w.oid = d.objid)
          WHEN d.classid = 'pg_catalog.pg_policy'::regclass THEN (SELECT p.polrelid FROM pg_catalog.pg_policy p WHERE p.oid = d.objid)
          WHEN d.classid = 'pg_catalog.pg_attrdef'::regclass THEN (SELECT a.adrelid FROM pg_catalog.pg_attrdef a WHERE a.oid = d.objid)
          WHEN d.classid = 'pg_catalog.pg_statistic_ext'::regclass THEN (SELECT s.stxrelid FROM pg_catalog.pg_statistic_ext s WHERE s.oid = d.objid)
        END AS rel) r ON true
      LEFT JOIN pg_catalog.pg_class tc ON tc.oid = r.rel
      LEFT JOIN pg_catalog.pg_namespace tn ON tn.oid = tc.relnamespace
     WHERE (d.schema_name IS NULL OR d.schema_name NOT LIKE 'pg\_temp\_%%' AND d.schema_name NOT LIKE 'pg\_toast\_temp\_%%')
       AND (tn.nspname IS NULL OR tn.nspname NOT LIKE 'pg\_temp\_%%');
    IF total > 0 AND jsonb_array_length(objs) = 0 AND jsonb_array_length(dropped) = 0 THEN
      RETURN; -- temporary objects only
    END IF;
    msg := jsonb_build_object('v', 1, 'tag', tg_tag, 'ddl', pg_catalog.current_query(), 'objects', objs, 'dropped', dropped,
                              'user', current_user, 'search_path', pg_catalog.current_setting('search_path'));
    FOR tb IN
      SELECT e.value->'table' FROM jsonb_array_elements(objs || dropped) WITH ORDINALITY AS e(value, i)
       WHERE e.value ? 'table' GROUP BY e.value->'table' ORDER BY min(e.i)
    LOOP
      msgs := msgs || (msg || jsonb_build_object('schema', tb->>'schema', 'table', tb->>'name'));
    END LOOP;
    IF cardinality(msgs) = 0 THEN
      msgs := msgs || (msg || jsonb_build_object('schema', (SELECT e->>'schema' FROM jsonb_array_elements(objs || dropped) e
                                                             WHERE e ? 'schema' LIMIT 1), 'table', NULL));
    END IF;
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'bridge DDL capture (ddl_command_end) failed: %%: no DDL event for this command', SQLERRM;
    RETURN;
  END;
  FOREACH msg IN ARRAY msgs LOOP
    PERFORM pg_catalog.pg_logical_emit_message(true, '%[2]s', msg::text);
  END LOOP;
  PERFORM pg_catalog.pg_logical_emit_message(true, '%[3]s', '');
END
$bridge$;
`
