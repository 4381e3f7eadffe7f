package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cli"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// enableSchemas turns the schema registry on in the bridge.yaml at path.
func enableSchemas(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(b, []byte("\nschemas:\n  enabled: true\n")...), 0o644))
}

// registry reads the test's schema registry bucket.
type registry struct {
	t        testing.TB
	kv       jetstream.KeyValue
	nc       *nats.Conn
	got      map[string]*schema.Version
	compiled map[*schema.Version]*jsonschema.Schema
}

func (e *env) registry(t testing.TB) *registry {
	t.Helper()
	nc, err := nats.Connect(e.natsURL(), e.natsOpts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), "bridge_schemas")
	require.NoError(t, err)
	return &registry{t: t, kv: kv, nc: nc, got: map[string]*schema.Version{}, compiled: map[*schema.Version]*jsonschema.Schema{}}
}

// version returns a version the registry must hold.
func (r *registry) version(source, sch, table string, n int) *schema.Version {
	r.t.Helper()
	key := schema.VersionKey(source, sch, table, n)
	if v, ok := r.got[key]; ok {
		return v
	}
	e, err := r.kv.Get(context.Background(), key)
	require.NoError(r.t, err, "registry key %s", key)
	var v schema.Version
	require.NoError(r.t, json.Unmarshal(e.Value(), &v))
	r.got[key] = &v
	return &v
}

func (r *registry) latest(source, sch, table string) int {
	r.t.Helper()
	e, err := r.kv.Get(context.Background(), schema.LatestKey(source, sch, table))
	require.NoError(r.t, err)
	n, err := strconv.Atoi(string(e.Value()))
	require.NoError(r.t, err)
	return n
}

// validate checks row (a native after image) against the version's native
// JSON Schema, compiled once per version.
func (r *registry) validate(v *schema.Version, row any) error {
	r.t.Helper()
	s, ok := r.compiled[v]
	if !ok {
		var doc any
		require.NoError(r.t, json.Unmarshal(v.JSONSchema["native"], &doc))
		c := jsonschema.NewCompiler()
		require.NoError(r.t, c.AddResource("row.json", doc))
		var err error
		s, err = c.Compile("row.json")
		require.NoError(r.t, err)
		r.compiled[v] = s
	}
	return s.Validate(row)
}

// checkSchemaStream checks what a stream of source's changes holds about
// schemas, and returns its schema change events in stream order: each
// event is followed by the row change at its position (one route) and
// its id is that change's id + "@~schema"; each table's versions are
// announced once each, 1, 2, 3, … in order, as the registry holds them
// (first seen at the event's position); every row change names in
// Bridge-Schema-Version the version announced last for its table, and its
// after image validates against that version's JSON Schema.
func checkSchemaStream(t *testing.T, reg *registry, source string, ms []msg) (events []msg, rows []msg) {
	t.Helper()
	defer func() {
		if !t.Failed() || os.Getenv("SCHEMA_DEBUG") == "" {
			return
		}
		for _, m := range ms {
			cols := []string{}
			if a, ok := m.Body["after"].(map[string]any); ok {
				for k := range a {
					cols = append(cols, k)
				}
				slices.Sort(cols)
			}
			t.Logf("seq %d %s %s v%s %v", m.Seq, m.ID, m.Header.Get("Bridge-Op"), m.Header.Get(schema.HeaderVersion), cols)
		}
		for n := 1; ; n++ {
			e, err := reg.kv.Get(context.Background(), schema.VersionKey(source, "public", "kt", n))
			if err != nil {
				break
			}
			var v schema.Version
			_ = json.Unmarshal(e.Value(), &v)
			var cols []string
			for _, c := range v.Columns {
				cols = append(cols, c.Name)
			}
			t.Logf("version %d since %+v %v", n, v.Since, cols)
		}
	}()
	cur := map[string]int{}
	for i, m := range ms {
		table := m.Header.Get("Bridge-Table")
		if m.Header.Get("Bridge-Op") == "schema" {
			require.Less(t, i+1, len(ms), "stream seq %d: a schema change event at the stream's end", m.Seq)
			next := ms[i+1]
			require.NotEqual(t, "schema", next.Header.Get("Bridge-Op"), "stream seq %d", m.Seq)
			require.Equal(t, table, next.Header.Get("Bridge-Table"))
			var ev schema.Event
			require.NoError(t, json.Unmarshal(m.Raw, &ev))
			require.Equal(t, cur[table]+1, ev.Version, "stream seq %d: %s's versions come once each, in order", m.Seq, table)
			cur[table] = ev.Version
			require.Equal(t, m.Header.Get(schema.HeaderVersion), strconv.Itoa(ev.Version))
			v := reg.version(source, ev.Schema, ev.Table, ev.Version)
			require.Equal(t, v.Columns, ev.Columns)
			if v.Since.Snapshot != "" {
				// First seen by a snapshot read: the event has the
				// snapshot's id, and comes before the first message
				// under the version (announced again after a crash,
				// it is stored once).
				require.Equal(t, v.EventMsgID()+"@"+schema.Dest, m.ID, "stream seq %d: a snapshot's version", m.Seq)
			} else {
				require.Equal(t, next.ID+"@"+schema.Dest, m.ID, "stream seq %d: the event's id is its change's + @~schema", m.Seq)
				require.Equal(t, next.Pos.LSN.String(), v.Since.CommitLSN, "the version was first seen at its event's position")
				require.Equal(t, next.Pos.Seq, v.Since.Seq)
			}
			require.Equal(t, schema.VersionKey(source, ev.Schema, ev.Table, ev.Version), ev.RegistryKey)
			events = append(events, m)
			continue
		}
		rows = append(rows, m)
		if table == "" {
			continue
		}
		hv := m.Header.Get(schema.HeaderVersion)
		require.Equal(t, strconv.Itoa(cur[table]), hv, "stream seq %d (%s): the version announced last", m.Seq, m.ID)
		if after, ok := m.Body["after"].(map[string]any); ok {
			sch, tbl, _ := strings.Cut(table, ".")
			v := reg.version(source, sch, tbl, cur[table])
			var row any
			raw, err := json.Marshal(after)
			require.NoError(t, err)
			row, err = jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
			require.NoError(t, err)
			require.NoError(t, reg.validate(v, row), "stream seq %d: %s", m.Seq, raw)
		}
	}
	for table, n := range cur {
		sch, tbl, _ := strings.Cut(table, ".")
		require.Equal(t, n, reg.latest(source, sch, tbl), "the registry's latest %s", table)
	}
	return events, rows
}

// TestSchemaChangeEvents adds, drops, renames and retypes columns and
// changes the key of a published table between its changes, in and out
// of transactions, with pgoutput (and wal2json where the plugin exists),
// and checks the stream: a schema change event before the first change
// of the table and before the first change under each new shape, with its
// difference; each row change naming its version, which the registry
// holds and the row validates against. A restart announces nothing again.
func TestSchemaChangeEvents(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE d (id int PRIMARY KEY, a text, n int)`)
	streams := map[string]string{"CDC_sch": "app"}
	cfg := e.config("sch", "")
	if pgtest.HasWal2json(0) {
		cfg, streams = e.parityConfig("sch"), map[string]string{"CDC_sch_pg": "pg", "CDC_sch_wj": "wj"}
	}
	enableSchemas(t, cfg)
	r := e.start(cfg)
	waitReady(t, r)
	// Each step's row is in every stream before the next step: pgoutput
	// reads NOT NULL from the catalog when a Relation message arrives,
	// which must not be newer than the step (docs/schemas.md#what-the-wal-says).
	rowOf := func(id int) func() {
		return func() {
			for stream := range streams {
				require.Eventually(t, func() bool {
					for _, m := range e.messages(stream) {
						if after, ok := m.Body["after"].(map[string]any); ok && after["id"] == float64(id) {
							return true
						}
					}
					return false
				}, 30*time.Second, 20*time.Millisecond, "%s: row %d", stream, id)
			}
		}
	}
	for _, step := range []struct {
		sql  []string
		wait func()
	}{
		{[]string{`INSERT INTO d VALUES (1, 'one', 1)`}, rowOf(1)},
		{[]string{`ALTER TABLE d ADD COLUMN b int DEFAULT 7`, `INSERT INTO d (id, a, n) VALUES (2, 'two', 2)`, `UPDATE d SET a = 'uno' WHERE id = 1`}, rowOf(2)},
		{[]string{`ALTER TABLE d DROP COLUMN n`, `INSERT INTO d VALUES (3, 'three', 3)`}, rowOf(3)},
		{[]string{`ALTER TABLE d RENAME COLUMN a TO name`, `ALTER TABLE d ALTER COLUMN b TYPE bigint`, `INSERT INTO d VALUES (4, 'four', 9007199254740993)`}, rowOf(4)},
		{[]string{`BEGIN; INSERT INTO d VALUES (5, 'five', 5); ALTER TABLE d ADD COLUMN c text; INSERT INTO d VALUES (6, 'six', 6, 'c'); COMMIT`}, rowOf(6)},
		{[]string{`ALTER TABLE d DROP CONSTRAINT d_pkey, ADD PRIMARY KEY (id, name)`, `INSERT INTO d VALUES (7, 'seven', 7, 'c')`}, rowOf(7)},
		{[]string{`ALTER TABLE d ADD COLUMN code varchar(10)`, `INSERT INTO d VALUES (8, 'eight', 8, 'c', 'abc')`}, rowOf(8)},
		{[]string{`ALTER TABLE d ALTER COLUMN code TYPE varchar(20)`, `INSERT INTO d VALUES (9, 'nine', 9, 'c', 'abcdefghijklmnop')`}, rowOf(9)},
		{[]string{`UPDATE d SET c = 'c' WHERE c IS NULL`}, func() { e.waitCount(firstStream(streams), 15+8, 30*time.Second) }},
		{[]string{`ALTER TABLE d ALTER COLUMN c SET NOT NULL`, `INSERT INTO d VALUES (10, 'ten', 10, 'c', 'x')`}, rowOf(10)},
	} {
		e.pg.ExecT(t, step.sql...)
		step.wait()
	}
	type want struct {
		version                          int
		added, dropped, retyped, changed []string
		key                              []string
		keyChanged, breaking             bool
	}
	wants := []want{
		{1, []string{"id:int4", "a:text", "n:int4"}, nil, nil, nil, []string{"id"}, false, false},
		{2, []string{"b:int4"}, nil, nil, nil, []string{"id"}, false, false},
		{3, nil, []string{"n:int4"}, nil, nil, []string{"id"}, false, true},
		{4, []string{"name:text"}, []string{"a:text"}, []string{"b:int4>int8"}, nil, []string{"id"}, false, true},
		{5, []string{"c:text"}, nil, nil, nil, []string{"id"}, false, false},
		// ADD PRIMARY KEY makes name NOT NULL: not breaking.
		{6, nil, nil, nil, []string{"name:not_null:null>not null"}, []string{"id", "name"}, true, true},
		{7, []string{"code:character varying(10)"}, nil, nil, nil, []string{"id", "name"}, false, false},
		// A longer varchar is breaking: a consumer of version 7 may take
		// no more than 10 characters.
		{8, nil, nil, nil, []string{"code:modifier:character varying(10)>character varying(20)"}, []string{"id", "name"}, false, true},
		{9, nil, nil, nil, []string{"c:not_null:null>not null"}, []string{"id", "name"}, false, false},
	}
	const rowCount = 16                               // 10 inserts and 6 updates
	eventsBefore := []int{0, 1, 3, 4, 6, 7, 8, 9, 15} // the row change (0-based) each event precedes
	reg := e.registry(t)
	for stream, source := range streams {
		ms := e.waitCount(stream, rowCount+len(wants), 30*time.Second)
		events, rows := checkSchemaStream(t, reg, source, ms)
		require.Len(t, rows, rowCount, stream)
		checkOrdered(t, rows)
		require.Len(t, events, len(wants), stream)
		for i, w := range wants {
			var ev schema.Event
			require.NoError(t, json.Unmarshal(events[i].Raw, &ev))
			cols := func(cs []schema.Column) []string {
				var out []string
				for _, c := range cs {
					out = append(out, c.Name+":"+c.TypeName())
				}
				return out
			}
			var retyped, changed []string
			for _, r := range ev.Diff.Retyped {
				retyped = append(retyped, r.Name+":"+r.From+">"+r.To)
			}
			for _, c := range ev.Diff.Changed {
				changed = append(changed, c.Name+":"+c.What+":"+c.From+">"+c.To)
			}
			what := fmt.Sprintf("%s: event %d", stream, i)
			require.Equal(t, w.version, ev.Version, what)
			require.Equal(t, "schema", ev.Op, what)
			require.Equal(t, source, ev.Source, what)
			require.Equal(t, w.added, cols(ev.Diff.Added), what)
			require.Equal(t, w.dropped, cols(ev.Diff.Dropped), what)
			require.Equal(t, w.retyped, retyped, what)
			require.Equal(t, w.changed, changed, what)
			require.Equal(t, w.key, ev.Key, what)
			require.Equal(t, w.keyChanged, ev.Diff.KeyChanged, what)
			require.Equal(t, w.breaking, ev.Diff.Breaking, what)
			if w.version == 1 {
				require.Nil(t, ev.Previous, what)
			} else {
				require.Equal(t, w.version-1, ev.Previous.Version, what)
			}
			// The event sits right before the change it announces.
			idx := 0
			for k, m := range ms {
				if m.ID == events[i].ID {
					idx = k
				}
			}
			require.Equal(t, ms[idx+1].ID, rows[eventsBefore[i]].ID, what)
		}
		// What each plugin says of NOT NULL: pgoutput reads it from the
		// catalog, wal2json has it in the WAL.
		v := reg.version(source, "public", "d", len(wants))
		if source == "wj" {
			require.Equal(t, []string{"replica_identity"}, v.Inferred, stream)
		} else {
			require.Equal(t, []string{"not_null"}, v.Inferred, stream)
		}
		byName := map[string]schema.Column{}
		for _, c := range v.Columns {
			byName[c.Name] = c
		}
		require.True(t, byName["c"].NotNull && byName["name"].NotNull && byName["id"].NotNull && !byName["b"].NotNull, "%s: %+v", stream, v.Columns)
		require.Equal(t, "character varying(20)", byName["code"].Declared)
		require.Empty(t, byName["c"].Declared)
	}
	// Both plugins give the same shapes.
	if len(streams) == 2 {
		for n := 1; n <= len(wants); n++ {
			pg, wj := reg.version("pg", "public", "d", n), reg.version("wj", "public", "d", n)
			require.Equal(t, pg.Fingerprint, wj.Fingerprint, "version %d: %+v\n%+v", n, pg.Columns, wj.Columns)
		}
	}

	// The registry from the command line, no database needed.
	source := "app"
	if len(streams) == 2 {
		source = "pg"
	}
	bridgeCLI := func(args ...string) string {
		var out, errb bytes.Buffer
		code := cli.Execute(append(args, "-c", cfg, "--source", source), &out, &errb)
		require.Equal(t, 0, code, "bridge %v: %s%s", args, out.String(), errb.String())
		return out.String()
	}
	require.Regexp(t, source+`\s+public\.d\s+9\n`, bridgeCLI("schema", "ls"))
	shown := bridgeCLI("schema", "show", "public.d", "--version", "4")
	require.Contains(t, shown, source+" public.d version 4 (previous 3)")
	require.Regexp(t, `name\s+text\s*\n`, shown)
	require.Regexp(t, `b\s+int8\s*\n`, shown)
	require.Regexp(t, `id\s+int4\s+not null\s+key\n`, shown)
	require.Regexp(t, `code\s+character varying\(20\)\s*\n`, bridgeCLI("schema", "show", "public.d"))
	require.Equal(t, source+" public.d version 3 → 4\n+ name text\n- a text\n~ b int4 → int8\nbreaking: true\n",
		bridgeCLI("schema", "diff", "public.d", "3", "4"))
	require.Equal(t, source+" public.d version 5 → 6\n~ name not null: null → not null\nkey: id → id, name\nbreaking: true\n", bridgeCLI("schema", "diff", "public.d", "5", "6"))
	require.Equal(t, source+" public.d version 7 → 8\n~ code modifier: character varying(10) → character varying(20)\nbreaking: true\n", bridgeCLI("schema", "diff", "public.d", "latest-2", "latest-1"))

	// A restart: the registry remembers every table's version, so the
	// next change names version 6 and nothing is announced again.
	r.stop(t)
	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO d VALUES (11, 'eleven', 11, 'c', 'y')`)
	for stream, source := range streams {
		var ms []msg
		require.Eventually(t, func() bool {
			ms = e.messages(stream)
			return ms[len(ms)-1].Body["op"] == "insert" && ms[len(ms)-1].Body["after"].(map[string]any)["id"] == 11.0
		}, 30*time.Second, 50*time.Millisecond, stream)
		before := len(ms)
		time.Sleep(300 * time.Millisecond)
		ms = e.messages(stream)
		require.Len(t, ms, before, stream)
		events, rows := checkSchemaStream(t, reg, source, ms)
		require.Len(t, rows, rowCount+1, stream)
		require.NotEqual(t, "schema", ms[len(ms)-2].Header.Get("Bridge-Op"), "%s: nothing announced again after a restart", stream)
		require.Equal(t, strconv.Itoa(len(events)), ms[len(ms)-1].Header.Get(schema.HeaderVersion))
	}
}

// TestSchemaEventsKill9 kills the bridge with SIGKILL at random moments
// while four writers commit changes to a table whose shape a fifth
// connection keeps changing (a column added, renamed, made NOT NULL,
// made part of the primary key, retyped, taken out of the key, made
// nullable again; a varchar added and lengthened; both dropped; again and
// again), restarting it each time, with a 1 s duplicate window,
// with pgoutput and with wal2json (where the plugin exists): every
// committed change is in the stream once, in order, and every schema
// change event once, before the first change under its shape, its version
// the next of its table, registered before any message names it.
func TestSchemaEventsKill9(t *testing.T) {
	defer parallel(t)()
	for _, plugin := range []string{"pgoutput", "wal2json"} {
		t.Run(plugin, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			if plugin == "wal2json" && !pgtest.HasWal2json(0) {
				t.Skip("no wal2json for this PostgreSQL")
			}
			schemaEventsKill9(t, plugin)
		})
	}
}

func schemaEventsKill9(t *testing.T, plugin string) {
	changes := 10000
	if testing.Short() {
		changes = 4000
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg := e.configPlugin(plugin, "skill", "")
	enableSchemas(t, cfg)
	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_skill")

	// The shape changer: add x<i>, rename it y<i>, retype it, drop it,
	// next i.
	stop := make(chan struct{})
	ddlDone := make(chan int)
	conn := e.pg.Conn(t, "")
	go func() {
		n := 0
		defer func() { ddlDone <- n }()
		for i := 0; ; i++ {
			for _, stmt := range []string{
				fmt.Sprintf(`ALTER TABLE kt ADD COLUMN x%d int DEFAULT 0`, i),
				fmt.Sprintf(`ALTER TABLE kt RENAME COLUMN x%d TO y%d`, i, i),
				fmt.Sprintf(`ALTER TABLE kt ALTER COLUMN y%d SET NOT NULL`, i),
				// The key gains the column, is retyped with it, and
				// loses it again (a key column cannot drop NOT NULL).
				fmt.Sprintf(`ALTER TABLE kt DROP CONSTRAINT kt_pkey, ADD CONSTRAINT kt_pkey PRIMARY KEY (id, y%d)`, i),
				fmt.Sprintf(`ALTER TABLE kt ALTER COLUMN y%d TYPE bigint`, i),
				`ALTER TABLE kt DROP CONSTRAINT kt_pkey, ADD CONSTRAINT kt_pkey PRIMARY KEY (id)`,
				fmt.Sprintf(`ALTER TABLE kt ALTER COLUMN y%d DROP NOT NULL`, i),
				fmt.Sprintf(`ALTER TABLE kt ADD COLUMN s%d varchar(10)`, i),
				fmt.Sprintf(`ALTER TABLE kt ALTER COLUMN s%d TYPE varchar(20)`, i),
				fmt.Sprintf(`ALTER TABLE kt DROP COLUMN y%d, DROP COLUMN s%d`, i, i),
			} {
				select {
				case <-stop:
					return
				case <-time.After(60 * time.Millisecond): // several cycles while the writers write
				}
				if _, err := conn.Exec(context.Background(), "SET lock_timeout = '2s'; "+stmt); err != nil {
					t.Logf("%s: %v", stmt, err)
					continue
				}
				n++
			}
		}
	}()
	p, kills := killWhileWriting(t, p, bin, cfg, w, changes, 8)
	close(stop)
	ddl := <-ddlDone

	want, total := w.expected()
	// Wait for every row change; the events come on top.
	deadline := time.Now().Add(3 * time.Minute)
	var ms, rows []msg
	for {
		// Reading and splitting the whole stream costs: only once it holds
		// at least as many messages as row changes wanted, or to report.
		if storedCount(t, e, "CDC_skill") < uint64(total) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		ms = e.messages("CDC_skill")
		rows = rows[:0]
		for _, m := range ms {
			if m.Header.Get("Bridge-Op") != "schema" {
				rows = append(rows, m)
			}
		}
		if len(rows) >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(rows) < total {
		t.Logf("the last bridge's log:\n%s", p.out.String())
	}
	checkOrdered(t, rows)
	checkEvents(t, "stream CDC_skill", rows, want, total)
	events, _ := checkSchemaStream(t, e.registry(t), "app", ms)
	ids := map[string]bool{}
	kinds := map[string]int{}
	keyChanges := 0
	for _, m := range events {
		require.False(t, ids[m.ID], "event %s stored twice", m.ID)
		ids[m.ID] = true
		var ev schema.Event
		require.NoError(t, json.Unmarshal(m.Raw, &ev))
		for _, c := range ev.Diff.Changed {
			kinds[c.What]++
		}
		if ev.Diff.KeyChanged {
			keyChanges++
		}
	}
	require.Positive(t, keyChanges, "a primary key change is a version")
	require.GreaterOrEqual(t, len(events), 8, "the shape changed %d times", ddl)
	// A modifier change is in the WAL for both plugins; NOT NULL for
	// wal2json (pgoutput reads it from the catalog: its changes may come
	// with others).
	require.Positive(t, kinds["modifier"], "varchar(10) → varchar(20) is a version")
	if plugin == "wal2json" {
		require.Positive(t, kinds["not_null"], "SET NOT NULL is a version")
	}
	p.term(t)
	t.Logf("%d kills, %d DDL statements, %d schema change events (%d key changes), %d row changes", kills, ddl, len(events), keyChanges, len(rows))
}

// TestSchemaChangePause: a route with on_schema_change: pause publishes
// an added column's event and goes on, but pauses the source before the
// transaction of the first change after a dropped column, with the change
// as the pause's reason, and publishes nothing more until the operator
// resumes the source; then the event and the changes follow, once, and a
// restart does not hold the same version again.
func TestSchemaChangePause(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE h (id int PRIMARY KEY, a text, n int)`)
	cfg := e.config("shold", "")
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	route := "    subject: \"cdc.shold.{{.Schema}}.{{.Table}}\"\n"
	require.Contains(t, string(b), route)
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(b), route, route+"    on_schema_change: pause\n", 1)), 0o644))
	enableSchemas(t, cfg)
	r := e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t,
		`INSERT INTO h VALUES (1, 'one', 1)`,
		`ALTER TABLE h ADD COLUMN b int`, // not breaking: goes on
		`INSERT INTO h VALUES (2, 'two', 2, 2)`,
		`ALTER TABLE h DROP COLUMN n`, // breaking: held
		`INSERT INTO h VALUES (3, 'three', 3)`,
		`INSERT INTO h VALUES (4, 'four', 4)`,
	)
	e.waitCount("CDC_shold", 4, 30*time.Second)
	require.Eventually(t, func() bool {
		st := r.app.Pipelines()[0].Status()
		return st.State == "paused"
	}, 30*time.Second, 20*time.Millisecond)
	st := r.app.Pipelines()[0].Status()
	require.True(t, st.Control.Paused)
	require.Contains(t, st.Control.Reason, "routes[0].on_schema_change: pause: public.h version 3 changed at")
	require.Contains(t, st.Control.Reason, "a breaking change: dropped n")
	time.Sleep(time.Second)
	ms := e.messages("CDC_shold")
	require.Len(t, ms, 4, "nothing after the held change is published")
	require.Equal(t, 3, e.registry(t).latest("app", "public", "h"), "the version is registered, its event held")

	code, out, errs := execCLI(t, "resume", "-c", cfg)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	ms = e.waitCount("CDC_shold", 7, 30*time.Second)
	require.Len(t, ms, 7)
	reg := e.registry(t)
	events, rows := checkSchemaStream(t, reg, "app", ms)
	require.Len(t, events, 3)
	require.Len(t, rows, 4)
	checkOrdered(t, rows)

	// A restart lets the released version through without holding again.
	r.stop(t)
	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO h VALUES (5, 'five', 5)`)
	ms = e.waitCount("CDC_shold", 8, 30*time.Second)
	require.Len(t, ms, 8)
	checkSchemaStream(t, reg, "app", ms)
	require.Equal(t, pipeline.StateStreaming, r.app.Pipelines()[0].Status().State)
}

// firstStream returns one of streams' names (the first in order).
func firstStream(streams map[string]string) string {
	var names []string
	for n := range streams {
		names = append(names, n)
	}
	slices.Sort(names)
	return names[0]
}
