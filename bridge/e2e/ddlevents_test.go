package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// enableDDLEvents turns schemas.enabled (the registry and schema change
// events) and schemas.ddl (DDL events) on in the bridge.yaml at path.
func enableDDLEvents(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(b, []byte("\nschemas:\n  enabled: true\n  ddl: true\n")...), 0o644))
}

// installDDLTrigger runs `bridge setup ddl --apply` for source of cfg.
func installDDLTrigger(t *testing.T, cfg, source string, extra ...string) string {
	t.Helper()
	code, out, errs := execCLI(t, append([]string{"setup", "ddl", "--apply", "-c", cfg, "--source", source}, extra...)...)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	return out
}

// splitDDL returns the DDL events of ms and the rest, in stream order.
func splitDDL(ms []msg) (ddl, rest []msg) {
	for _, m := range ms {
		if m.Header.Get("Bridge-Op") == "ddl" {
			ddl = append(ddl, m)
		} else {
			rest = append(rest, m)
		}
	}
	return ddl, rest
}

// withoutSchemaEvents returns ms without the schema change events (which
// share their change's position).
func withoutSchemaEvents(ms []msg) []msg {
	var out []msg
	for _, m := range ms {
		if m.Header.Get("Bridge-Op") != "schema" {
			out = append(out, m)
		}
	}
	return out
}

// TestDDLEvents installs the DDL event trigger with `bridge setup ddl
// --apply` and runs DDL between row changes, in and out of transactions,
// with pgoutput (and wal2json where the plugin exists): each DDL command
// arrives once as a DDL event with its text, at its own position in WAL
// order among the row changes (before the schema change event of the
// first change under the new shape), on its table's subject; CREATE
// TABLE of a table no change has named yet and a command on no table
// (CREATE FUNCTION) arrive too, temporary tables do not. A restart
// publishes nothing again; --remove stops the events. On every major of
// the version matrix (wal2json where it exists: Debian's 15).
func TestDDLEvents(t *testing.T) {
	defer parallel(t)()
	eachMajor(t, ddlEvents)
}

func ddlEvents(t *testing.T, major int) {
	e := newEnvMajor(t, major)
	// The publication exists before the trigger: the bridge's own CREATE
	// PUBLICATION is DDL too, and with two sources the wal2json one may
	// create its slot before the pgoutput one creates the publication,
	// and so rightly publish that statement's event first.
	e.pg.ExecT(t, `CREATE TABLE d (id int PRIMARY KEY, a text)`, `CREATE PUBLICATION pub_dev FOR ALL TABLES`)
	streams := map[string]string{"CDC_dev": "app"}
	prefix := map[string]string{"CDC_dev": "cdc.dev"}
	cfg := e.config("dev", "")
	if pgtest.HasWal2json(major) {
		cfg = e.parityConfig("dev")
		streams = map[string]string{"CDC_dev_pg": "pg", "CDC_dev_wj": "wj"}
		prefix = map[string]string{"CDC_dev_pg": "cdc.dev.pg", "CDC_dev_wj": "cdc.dev.wj"}
	}
	enableDDLEvents(t, cfg)

	// Printing needs no database; the SQL is what --apply runs.
	code, printed, errs := execCLI(t, "setup", "ddl", "-c", cfg)
	require.Equal(t, 0, code, errs)
	require.Contains(t, printed, "CREATE EVENT TRIGGER bridge_ddl_command_end ON ddl_command_end")
	require.Contains(t, printed, "CREATE EVENT TRIGGER bridge_ddl_sql_drop ON sql_drop")
	var first string
	for _, s := range streams {
		first = s
		break
	}
	out := installDDLTrigger(t, cfg, first)
	require.Contains(t, out, "installed the DDL event triggers")
	installDDLTrigger(t, cfg, first) // again: replaces them

	r := e.start(cfg)
	waitReady(t, r)
	tx := `BEGIN; INSERT INTO d VALUES (3, 'three', 3); ALTER TABLE d RENAME COLUMN a TO name; INSERT INTO d VALUES (4, 'four', 4); COMMIT`
	e.pg.ExecT(t,
		`INSERT INTO d VALUES (1, 'one')`,
		`ALTER TABLE d ADD COLUMN b int`,
		`INSERT INTO d VALUES (2, 'two', 2)`,
		`CREATE TABLE fresh (id int PRIMARY KEY, v text)`,
		tx,
		`CREATE TEMP TABLE scratch (x int); DROP TABLE scratch`,
		`DROP TABLE fresh`,
		`CREATE FUNCTION ddl_f() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
	)
	type want struct {
		op, table, tag, ddl string
	}
	wants := []want{
		{"schema", "public.d", "", ""},
		{"insert", "public.d", "", ""},
		{"ddl", "public.d", "ALTER TABLE", `ALTER TABLE d ADD COLUMN b int`},
		{"schema", "public.d", "", ""},
		{"insert", "public.d", "", ""},
		{"ddl", "public.fresh", "CREATE TABLE", `CREATE TABLE fresh (id int PRIMARY KEY, v text)`},
		{"insert", "public.d", "", ""},
		{"ddl", "public.d", "ALTER TABLE", tx},
		{"schema", "public.d", "", ""},
		{"insert", "public.d", "", ""},
		{"ddl", "public.fresh", "DROP TABLE", `DROP TABLE fresh`},
		{"ddl", "", "CREATE FUNCTION", `CREATE FUNCTION ddl_f() RETURNS int LANGUAGE sql AS 'SELECT 1'`},
	}
	check := func(stream string, ms []msg, wants []want) {
		t.Helper()
		require.Len(t, ms, len(wants), "%s: %v", stream, ops(ms))
		checkOrdered(t, withoutSchemaEvents(ms))
		for i, w := range wants {
			m := ms[i]
			what := fmt.Sprintf("%s: message %d", stream, i)
			require.Equal(t, w.op, m.Header.Get("Bridge-Op"), "%s: %v", what, ops(ms))
			require.Equal(t, w.table, m.Header.Get("Bridge-Table"), what)
			if w.op != "ddl" {
				continue
			}
			var ev schema.DDLEvent
			require.NoError(t, json.Unmarshal(m.Raw, &ev), what)
			require.Equal(t, "ddl", ev.Op, what)
			require.Equal(t, streams[stream], ev.Source, what)
			require.Equal(t, w.tag, ev.Tag, what)
			require.Equal(t, w.ddl, ev.DDL, what)
			require.Equal(t, m.Pos.LSN.String(), ev.CommitLSN, what)
			require.Equal(t, m.Pos.Seq, ev.Seq, what)
			require.NotNil(t, ev.TxSize, what)
			require.Equal(t, fmt.Sprint(*ev.TxSize), m.Header.Get("Bridge-Tx-Size"), what)
			require.Empty(t, m.Header.Get(schema.HeaderVersion), what)
			if w.table == "" {
				require.Nil(t, ev.Table, what)
				require.Equal(t, prefix[stream]+".public._", m.Subject, what)
				require.Equal(t, "public.ddl_f()", ev.Objects[0].Identity, what)
				continue
			}
			sch, tbl, _ := strings.Cut(w.table, ".")
			require.Equal(t, sch, ev.Schema, what)
			require.Equal(t, tbl, *ev.Table, what)
			require.Equal(t, prefix[stream]+"."+w.table, m.Subject, what)
			require.Equal(t, "postgres", ev.User, what)
		}
		// The transaction's DDL event sits between its two inserts, at
		// its own ordinal.
		require.Equal(t, ms[6].Pos.LSN, ms[7].Pos.LSN, stream)
		require.Equal(t, ms[6].Pos.Seq+1, ms[7].Pos.Seq, stream)
		require.Equal(t, ms[7].Pos.Seq+1, ms[9].Pos.Seq, stream)
		var dropped schema.DDLEvent
		require.NoError(t, json.Unmarshal(ms[10].Raw, &dropped))
		require.NotEmpty(t, dropped.Dropped, stream)
		require.Equal(t, "public.fresh", dropped.Dropped[0].Identity, stream)
		require.True(t, dropped.Dropped[0].Original, stream)
	}
	for stream := range streams {
		check(stream, e.waitCount(stream, len(wants), 30*time.Second), wants)
	}

	// A restart publishes nothing again; the next DDL comes once.
	r.stop(t)
	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `ALTER TABLE d ADD COLUMN c text`, `INSERT INTO d VALUES (5, 'five', 5, 'c')`)
	wants = append(wants, want{"ddl", "public.d", "ALTER TABLE", `ALTER TABLE d ADD COLUMN c text`},
		want{"schema", "public.d", "", ""}, want{"insert", "public.d", "", ""})
	for stream := range streams {
		e.waitStored(stream, len(wants), 30*time.Second)
		time.Sleep(300 * time.Millisecond)
		check(stream, e.messages(stream), wants)
	}

	// --remove: no more events.
	installDDLTrigger(t, cfg, first, "--remove")
	e.pg.ExecT(t, `ALTER TABLE d ADD COLUMN z int`, `INSERT INTO d VALUES (6, 'six', 6, 'c', 6)`)
	wants = append(wants, want{"schema", "public.d", "", ""}, want{"insert", "public.d", "", ""})
	for stream := range streams {
		e.waitStored(stream, len(wants), 30*time.Second)
		time.Sleep(300 * time.Millisecond)
		check(stream, e.messages(stream), wants)
	}
}

func ops(ms []msg) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Header.Get("Bridge-Op")+" "+m.Header.Get("Bridge-Table"))
	}
	return out
}

// TestDDLEventsKill9 kills the bridge with SIGKILL at random moments while
// four writers commit changes to a table whose shape a fifth connection
// keeps changing (a column added, renamed, retyped, dropped, again and
// again), with the DDL event trigger installed, schema change events and
// DDL events on, restarting it each time, with a 1 s duplicate window,
// with pgoutput and with wal2json (where the plugin exists): every
// committed change is in the stream once, and every DDL statement that
// committed arrives once as a DDL event, with its text, in the order they
// committed, in WAL order among the changes.
func TestDDLEventsKill9(t *testing.T) {
	defer parallel(t)()
	for _, plugin := range []string{"pgoutput", "wal2json"} {
		t.Run(plugin, func(t *testing.T) {
			defer parallelLong(t)()
			if plugin == "wal2json" && !pgtest.HasWal2json(0) {
				t.Skip("no wal2json for this PostgreSQL")
			}
			ddlEventsKill9(t, plugin)
		})
	}
}

func ddlEventsKill9(t *testing.T, plugin string) {
	changes := 8000
	if testing.Short() {
		changes = 3000
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg := e.configPlugin(plugin, "dkill", "")
	enableDDLEvents(t, cfg)
	installDDLTrigger(t, cfg, "app")
	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_dkill")

	stop := make(chan struct{})
	var mu sync.Mutex
	var committed []string // the DDL statements that committed, in order
	ddlDone := make(chan struct{})
	conn := e.pg.Conn(t, "")
	go func() {
		defer close(ddlDone)
		for i := 0; ; i++ {
			for _, stmt := range []string{
				fmt.Sprintf(`ALTER TABLE kt ADD COLUMN x%d int`, i),
				fmt.Sprintf(`ALTER TABLE kt RENAME COLUMN x%d TO y%d`, i, i),
				fmt.Sprintf(`ALTER TABLE kt ALTER COLUMN y%d TYPE bigint`, i),
				fmt.Sprintf(`ALTER TABLE kt DROP COLUMN y%d`, i),
			} {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond): // several while the writers write (-short: about a second)
				}
				if _, err := conn.Exec(context.Background(), "SET lock_timeout = '2s'"); err != nil {
					t.Logf("SET lock_timeout: %v", err)
				}
				if _, err := conn.Exec(context.Background(), stmt); err != nil {
					t.Logf("%s: %v", stmt, err)
					continue
				}
				mu.Lock()
				committed = append(committed, stmt)
				mu.Unlock()
			}
		}
	}()
	p, kills := killWhileWriting(t, p, bin, cfg, w, changes, 8)
	close(stop)
	<-ddlDone

	want, total := w.expected()
	deadline := time.Now().Add(3 * time.Minute)
	var ms, ddl, rows []msg
	for {
		// Reading and splitting the whole stream costs: only once it holds
		// as many messages as the rows and DDL events wanted, or to report.
		if storedCount(t, e, "CDC_dkill") < uint64(total+len(committed)) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		ms = e.messages("CDC_dkill")
		var rest []msg
		ddl, rest = splitDDL(ms)
		rows = withoutSchemaEvents(rest)
		if (len(rows) >= total && len(ddl) >= len(committed)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	checkOrdered(t, withoutSchemaEvents(ms)) // rows and DDL events: once each, in WAL order
	checkEvents(t, "stream CDC_dkill", rows, want, total)
	require.Len(t, ddl, len(committed), "every committed DDL statement once")
	for i, m := range ddl {
		var ev schema.DDLEvent
		require.NoError(t, json.Unmarshal(m.Raw, &ev))
		require.Equal(t, committed[i], ev.DDL, "DDL event %d (stream seq %d)", i, m.Seq)
		require.Equal(t, "kt", *ev.Table)
		require.Equal(t, "cdc.dkill.public.kt", m.Subject)
	}
	// The schema change events around them are still right.
	_, rest := splitDDL(ms)
	events, _ := checkSchemaStream(t, e.registry(t), "app", rest)
	require.GreaterOrEqual(t, len(events), 4)
	p.term(t)
	t.Logf("%d kills, %d DDL events, %d schema change events, %d row changes", kills, len(ddl), len(events), len(rows))
}

// TestDebeziumAsItsUsersRunIt: a route of the debezium format with
// schemas_enable, key: header and tombstones_on_delete, schema change
// events and DDL events on: every value is {"schema", "payload"}, each
// change's key is in Debezium-Key, a delete is followed by a tombstone
// (an empty message on its subject, with its key), and the schema change
// and DDL events are Debezium's schema change values (the table's
// columns from the registry; the statement), each once, through a
// restart.
func TestDebeziumAsItsUsersRunIt(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE p (id int PRIMARY KEY, a text)`)
	cfg := e.config("dbz", "")
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	route := "    subject: \"cdc.dbz.{{.Schema}}.{{.Table}}\"\n"
	require.Contains(t, string(b), route)
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(b), route, route+
		"    format: debezium\n    debezium:\n      schemas_enable: true\n      key: header\n      tombstones_on_delete: true\n", 1)), 0o644))
	enableDDLEvents(t, cfg)
	installDDLTrigger(t, cfg, "app")
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t,
		`INSERT INTO p VALUES (1, 'one')`,
		`ALTER TABLE p ADD COLUMN n int`,
		`INSERT INTO p VALUES (2, 'two', 2)`,
		`DELETE FROM p WHERE id = 1`,
	)
	check := func(ms []msg) {
		t.Helper()
		require.Len(t, ms, 7, "%v", ops(ms))
		type env struct {
			Schema  map[string]any `json:"schema"`
			Payload map[string]any `json:"payload"`
		}
		decode := func(m msg) env {
			var v env
			require.NoError(t, json.Unmarshal(m.Raw, &v), "%s", m.Raw)
			require.NotNil(t, v.Schema, "%s", m.Raw)
			return v
		}
		// 0: the table's first version, a CREATE.
		v := decode(ms[0])
		require.Equal(t, "schema", ms[0].Header.Get("Bridge-Op"))
		require.Equal(t, "io.debezium.connector.postgresql.SchemaChangeValue", v.Schema["name"])
		tc := v.Payload["tableChanges"].([]any)[0].(map[string]any)
		require.Equal(t, "CREATE", tc["type"])
		require.Equal(t, `"public"."p"`, tc["id"])
		require.Len(t, tc["table"].(map[string]any)["columns"], 2)
		require.Nil(t, v.Payload["ddl"])
		require.Contains(t, ms[0].Header.Get("Debezium-Key"), `"payload":{"databaseName":"postgres"}`)
		// 1: the insert, with its envelope and key.
		v = decode(ms[1])
		require.Equal(t, "app.public.p.Envelope", v.Schema["name"])
		require.Equal(t, "c", v.Payload["op"])
		require.Contains(t, ms[1].Header.Get("Debezium-Key"), `"payload":{"id":1}`)
		// 2: the DDL event, with the statement.
		v = decode(ms[2])
		require.Equal(t, "ddl", ms[2].Header.Get("Bridge-Op"))
		require.Equal(t, "ALTER TABLE p ADD COLUMN n int", v.Payload["ddl"])
		require.Empty(t, v.Payload["tableChanges"])
		// 3: the next version, an ALTER with the new column; 4: its insert.
		v = decode(ms[3])
		tc = v.Payload["tableChanges"].([]any)[0].(map[string]any)
		require.Equal(t, "ALTER", tc["type"])
		require.Len(t, tc["table"].(map[string]any)["columns"], 3)
		v = decode(ms[4])
		require.Len(t, v.Schema["fields"].([]any)[1].(map[string]any)["fields"], 3, "the after struct has the new column")
		// 5: the delete, 6: its tombstone.
		v = decode(ms[5])
		require.Equal(t, "d", v.Payload["op"])
		require.Empty(t, ms[6].Raw)
		require.Equal(t, "delete", ms[6].Header.Get("Bridge-Op"))
		require.Equal(t, ms[5].Subject, ms[6].Subject)
		require.Equal(t, ms[5].Header.Get("Debezium-Key"), ms[6].Header.Get("Debezium-Key"))
		require.Equal(t, ms[5].ID+"@~tombstone", ms[6].ID)
		require.Empty(t, ms[6].Header.Get("Bridge-Tx-Size"))
	}
	check(e.waitCount("CDC_dbz", 7, 30*time.Second))
	r.stop(t)
	r = e.start(cfg)
	waitReady(t, r)
	time.Sleep(500 * time.Millisecond)
	check(e.messages("CDC_dbz"))
}
