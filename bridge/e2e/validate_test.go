package e2e_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgtest"
)

// checkLines returns the checklist lines of `validate --connect` output
// with status st ("ok", "warn", "FAIL"), their status and padding cut.
func checkLines(out, st string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, fmt.Sprintf("  %-4s  ", st)); ok {
			lines = append(lines, rest)
		}
	}
	return lines
}

// requireLine asserts that one line of status st contains want.
func requireLine(t *testing.T, out, st, want string) {
	t.Helper()
	for _, l := range checkLines(out, st) {
		if strings.Contains(l, want) {
			return
		}
	}
	t.Fatalf("no %s line contains %q in:\n%s", st, want, out)
}

// withConfig rewrites the YAML at p with each old → new replacement, each
// of which must apply.
func withConfig(t *testing.T, p string, repl ...string) string {
	t.Helper()
	y, err := os.ReadFile(p)
	require.NoError(t, err)
	s := string(y)
	for i := 0; i < len(repl); i += 2 {
		require.Contains(t, s, repl[i])
		s = strings.Replace(s, repl[i], repl[i+1], 1)
	}
	q := strings.TrimSuffix(p, ".yaml") + fmt.Sprintf("-%d.yaml", time.Now().UnixNano())
	require.NoError(t, os.WriteFile(q, []byte(s), 0o644))
	return q
}

const vcRoutes = `  - match: { tables: [public.orders] }
    sinks: [js]
    subject: "cdc.vc.{{.Table}}.{{.Col.tenant}}.{{.Key.id}}"
  - sinks: [js]
    subject: "cdc.vc.{{.Schema}}.{{.Table}}"
`

// TestValidateConnectGoodSetup: against a fresh database and NATS,
// `validate --connect` passes every line, says what `bridge run` will
// create, and creates nothing; once the bridge has run, it passes again
// with everything existing.
func TestValidateConnectGoodSetup(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant text, total int)`, `CREATE TABLE items (id int PRIMARY KEY)`)
	p := e.configRoutes("vc", "", vcRoutes)

	code, out, errs := execCLI(t, "validate", "--connect", "-c", p)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	require.Empty(t, checkLines(out, "FAIL"), out)
	for _, want := range []string{
		`as role "postgres", database "postgres"`,
		"wal_level is logical",
		`role "postgres" is a superuser`,
		"replication connection accepted",
		`slot "slot_vc" does not exist yet: ` + "`bridge run`" + ` creates it (pgoutput)`,
		`publication "pub_vc" does not exist yet: ` + "`bridge run`" + ` creates it (CREATE PUBLICATION "pub_vc" FOR ALL TABLES;)`,
		"routes[0].subject reads {{.Col.tenant}}: text in public.orders",
		"routes[0].subject reads {{.Key.id}}: integer in public.orders",
		`stream "CDC_vc" does not exist yet`,
		`checkpoint bucket "bridge_checkpoints" does not exist yet`,
		"routes[0].subject: cdc.vc.orders.*.* may be published, into stream \"CDC_vc\"",
		"routes[1].subject: cdc.vc.*.* may be published",
		"delivery: exactly once: after a crash the bridge reads what the destination holds past the checkpoint",
	} {
		requireLine(t, out, "ok", want)
	}
	require.Contains(t, out, "every check passed")

	// Nothing was created.
	conn := e.pg.Conn(t, "")
	var n int
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_replication_slots)`).Scan(&n))
	require.Zero(t, n, "validate --connect created a publication or a slot")
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	names := js.StreamNames(t.Context())
	var streams []string
	for s := range names.Name() {
		streams = append(streams, s)
	}
	require.NoError(t, names.Err())
	require.Empty(t, streams, "validate --connect created a stream or a bucket")

	// After a run everything exists, and still passes.
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO orders VALUES (1, 'acme', 5)`)
	e.waitStored("CDC_vc", 1, 30*time.Second)
	r.stop(t)
	code, out, errs = execCLI(t, "validate", "--connect", "-c", p)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	require.Empty(t, checkLines(out, "FAIL"), out)
	for _, want := range []string{
		`slot "slot_vc" exists: logical, pgoutput, database "postgres"`,
		`publication "pub_vc" exists and publishes public.items, public.orders (FOR ALL TABLES)`,
		`stream "CDC_vc" exists`,
		`checkpoint bucket "bridge_checkpoints" exists`,
		"source app's checkpoint (key vc.app): ",
		"routes[0].subject: cdc.vc.orders.*.* may be published, into stream \"CDC_vc\"",
	} {
		requireLine(t, out, "ok", want)
	}
	// The probes stored nothing.
	require.Len(t, e.messages("CDC_vc"), 1)
}

// TestValidateConnectFailures: each broken item of the setup gives its own
// FAIL line, with the fix, and exit status 1.
func TestValidateConnectFailures(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant text, total int)`,
		`CREATE ROLE norepl LOGIN`,
		`SELECT pg_create_logical_replication_slot('slot_other', 'test_decoding')`)
	base := e.configRoutes("vc", "", vcRoutes)
	run := func(t *testing.T, p string) string {
		t.Helper()
		code, out, errs := execCLI(t, "validate", "--connect", "-c", p)
		require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", out, errs)
		require.Contains(t, out, "`bridge run` would stop")
		require.True(t, strings.HasPrefix(errs, "bridge: "), "stderr: %q", errs)
		require.Contains(t, errs, "failed against the servers")
		return out
	}
	fixOf := func(t *testing.T, out, what string) string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^  FAIL  .*` + regexp.QuoteMeta(what) + `.*\n        fix: (.*)$`).FindStringSubmatch(out)
		require.NotNil(t, m, "no FAIL line with a fix contains %q in:\n%s", what, out)
		return m[1]
	}

	t.Run("role without REPLICATION", func(t *testing.T) {
		out := run(t, withConfig(t, base, "postgres://postgres@", "postgres://norepl@"))
		require.Equal(t, `ALTER ROLE "norepl" WITH REPLICATION;`, fixOf(t, out, `role "norepl" lacks the REPLICATION privilege`))
		// norepl may not create a publication FOR ALL TABLES either.
		requireLine(t, out, "FAIL", `publication "pub_vc" does not exist, and creating it FOR ALL TABLES needs a superuser; role "norepl" is not one`)
	})
	t.Run("wal_level replica", func(t *testing.T) {
		pg2 := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"wal_level": "replica"}})
		pg2.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant text, total int)`)
		out := run(t, withConfig(t, base, e.pg.DSN(""), pg2.DSN("")))
		require.Equal(t, "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL", fixOf(t, out, `wal_level is "replica"; logical replication needs 'logical'`))
	})
	t.Run("missing table", func(t *testing.T) {
		out := run(t, withConfig(t, base, "message_prefixes:", `tables: [public.orders, public.nosuch, public.Orders]
      message_prefixes:`))
		require.Equal(t, "create the table, or remove public.nosuch from sources.app.config.tables",
			fixOf(t, out, `table public.nosuch (in sources.app.config.tables) does not exist in database "postgres"`))
		require.Equal(t, "write public.orders in sources.app.config.tables (names are case-sensitive), or create the table",
			fixOf(t, out, `table public.Orders (in sources.app.config.tables) does not exist`))
		require.NotContains(t, out, "ALTER PUBLICATION")
	})
	t.Run("missing publication, create_publication false", func(t *testing.T) {
		out := run(t, withConfig(t, base, "message_prefixes:", `create_publication: false
      message_prefixes:`))
		require.Equal(t, `CREATE PUBLICATION "pub_vc" FOR ALL TABLES;`, fixOf(t, out, `publication "pub_vc" does not exist (create_publication is false)`))
	})
	t.Run("slot of the other plugin", func(t *testing.T) {
		out := run(t, withConfig(t, base, "slot: slot_vc", "slot: slot_other"))
		require.Contains(t, fixOf(t, out, `slot "slot_other" was made by the test_decoding plugin, but this source uses pgoutput`),
			"SELECT pg_drop_replication_slot('slot_other');")
	})
	t.Run("template column missing", func(t *testing.T) {
		out := run(t, withConfig(t, base, "{{.Col.tenant}}", "{{.Col.tenant_id}}"))
		require.Contains(t, fixOf(t, out, `routes[0].subject reads {{.Col.tenant_id}}, but public.orders has no column "tenant_id"`),
			"change the template, or limit the route's match.tables")
	})
	t.Run("key column not in the key", func(t *testing.T) {
		out := run(t, withConfig(t, base, "{{.Key.id}}", "{{.Key.total}}"))
		require.Contains(t, fixOf(t, out, `routes[0].subject reads {{.Key.total}}, but "total" is not part of the key of public.orders`), "write {{.Col.total}}")
	})
	t.Run("subject outside an existing stream", func(t *testing.T) {
		nc, err := nats.Connect(e.natsURL())
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "CDC_vc", Subjects: []string{"cdc.vc.orders.>"}})
		require.NoError(t, err)
		defer func() { _ = js.DeleteStream(context.Background(), "CDC_vc") }()
		out := run(t, withConfig(t, base, "duplicate_window: 1s", "duplicate_window: 1s\n      create_stream: false"))
		require.Contains(t, fixOf(t, out, `routes[1].subject: cdc.vc.*.* gives subjects outside stream "CDC_vc"'s subjects [cdc.vc.orders.>]`), "add cdc.vc.*.* to the stream's subjects")
		requireLine(t, out, "ok", `routes[0].subject: cdc.vc.orders.*.* may be published, into stream "CDC_vc"`)
	})
	t.Run("subject outside the stream, static", func(t *testing.T) {
		code, _, errs := execCLI(t, "validate", "--connect", "-c", withConfig(t, base, `subject: "cdc.vc.{{.Schema}}.{{.Table}}"`, `subject: "vc.{{.Schema}}.{{.Table}}"`))
		require.Equal(t, 1, code)
		require.Contains(t, errs, `routes[1].subject: "vc.{{.Schema}}.{{.Table}}" gives subjects vc.*.* for source app, outside stream "CDC_vc"'s subjects [cdc.vc.>] (sinks.js.config.subjects); change the subject or add the subjects to the stream`)
	})
	t.Run("database that does not exist", func(t *testing.T) {
		out := run(t, withConfig(t, base, "/postgres?", "/nosuchdb?"))
		require.Contains(t, fixOf(t, out, `database "nosuchdb" does not exist`), `create the database (CREATE DATABASE "nosuchdb";), or fix the database name in sources.app.config.dsn`)
	})
	t.Run("NATS not running", func(t *testing.T) {
		out := run(t, withConfig(t, base, e.natsURL(), fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))))
		require.Contains(t, fixOf(t, out, "connecting to nats://127.0.0.1:"), "is nats-server running at nats://127.0.0.1:")
	})
	t.Run("replicas on a server that is not clustered", func(t *testing.T) {
		out := run(t, withConfig(t, base, "duplicate_window: 1s", "duplicate_window: 1s\n      replicas: 3"))
		require.Equal(t, "set sinks.js.config.replicas: 1, or connect to a cluster of at least 3 servers",
			fixOf(t, out, `replicas is 3, but the NATS server at `+e.natsURL()+` is not clustered`))
	})
}

// TestValidateConnectPermissions: against a NATS user that may not publish
// a route's subjects, the line says "permission denied on <subject>";
// the subjects it may publish pass.
func TestValidateConnectPermissions(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant text)`)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "bridge", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>", "$KV.>", "cdc.vc.ok.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}}})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	url := strings.Replace(ns.ClientURL(), "nats://", "nats://bridge:pw@", 1)
	p := withConfig(t, e.configRoutes("vc", "", `  - match: { tables: [public.orders] }
    sinks: [js]
    subject: "cdc.vc.ok.{{.Table}}"
  - sinks: [js]
    subject: "cdc.vc.no.{{.Table}}"
`), e.natsURL(), url)
	code, out, errs := execCLI(t, "validate", "--connect", "-c", p)
	require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	requireLine(t, out, "FAIL", "routes[1].subject: permission denied on cdc.vc.no._")
	requireLine(t, out, "ok", "routes[0].subject: cdc.vc.ok.orders may be published")
	require.NotContains(t, out+errs, "pw@", "the password was printed")
}

// TestValidateConnectEmbedded: with nats.url empty, validate --connect
// starts no server: with no bridge running it leaves the NATS checks to
// `bridge run`; with one running it checks its embedded server, found
// through data_dir.
func TestValidateConnectEmbedded(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant text)`)
	p := withConfig(t, e.configRoutes("vce", "", `  - sinks: [js]
    subject: "cdc.vce.{{.Schema}}.{{.Table}}"
`), "  url: "+e.natsURL(), "  embedded: { port: -1 }")
	code, out, errs := execCLI(t, "validate", "--connect", "-c", p)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	requireLine(t, out, "ok", "no bridge is running with this data_dir: `bridge run` starts its embedded NATS server")
	requireLine(t, out, "warn", "not checked: it uses the embedded NATS server, which is not running")
	requireLine(t, out, "ok", `publication "pub_vce" does not exist yet`)

	r := e.start(p)
	waitReady(t, r)
	code, out, errs = execCLI(t, "validate", "--connect", "-c", p)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	require.Empty(t, checkLines(out, "FAIL"), out)
	requireLine(t, out, "ok", "; the bridge (or another server) is running there")
	requireLine(t, out, "ok", `stream "CDC_vce" exists`)
	requireLine(t, out, "ok", `checkpoint bucket "bridge_checkpoints" exists`)
	requireLine(t, out, "warn", `slot "slot_vce" is in use by PID`)
	requireLine(t, out, "ok", `routes[0].subject: cdc.vce.*.* may be published, into stream "CDC_vce"`)
}
