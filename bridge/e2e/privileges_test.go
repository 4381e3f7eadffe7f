package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
)

// leastPrivilegeSetup is what a managed service's administrator does, as
// the tables' owner (here postgres, standing in for the service's admin
// role): tables in public and in a schema of their own, the publication,
// and a role with LOGIN REPLICATION and SELECT on the published tables,
// nothing else: no superuser, no ALTER SYSTEM, no ownership.
var leastPrivilegeSetup = []string{
	`CREATE SCHEMA shop`,
	`CREATE TABLE shop.orders (id int PRIMARY KEY, note text)`,
	`CREATE TABLE public.items (id int PRIMARY KEY, name text)`,
	`INSERT INTO shop.orders VALUES (1, 'snap'), (2, 'snap')`,
	`INSERT INTO public.items VALUES (1, 'snap')`,
	`CREATE PUBLICATION pub_lp FOR TABLE shop.orders, public.items`,
	`CREATE ROLE lp LOGIN REPLICATION`,
	`GRANT USAGE ON SCHEMA shop TO lp`,
	`GRANT SELECT ON shop.orders, public.items TO lp`,
}

// lpConfig writes a bridge.yaml whose source connects as role, streams
// shop.orders and public.items through plugin, snapshots them at the first
// start and beats every 200ms.
func lpConfig(e *env, name, role, plugin string) string {
	e.t.Helper()
	pub := ""
	if plugin == "pgoutput" {
		pub = "      publication: pub_lp\n"
	}
	y := fmt.Sprintf(`name: %[1]s
data_dir: %[2]s
nats:
  url: %[3]s
sources:
  app:
    type: %[4]s
    config:
      dsn: %[5]s
      slot: slot_%[1]s
%[6]s      tables: [shop.orders, public.items]
      heartbeat_interval: 200ms
      snapshot: {mode: initial, request_poll: 200ms}
checkpoint:
  interval: 200ms
http:
  listen: "127.0.0.1:0"
sinks:
  js:
    type: nats_jetstream
    config:
      stream: CDC_%[1]s
      subjects: ["cdc.%[1]s.>"]
routes:
  - sinks: [js]
    subject: "cdc.%[1]s.{{.Schema}}.{{.Table}}"
`, name, filepath.Join(e.dir, name), e.natsURL(), plugin, strings.Replace(e.pg.DSN(""), "postgres://postgres@", "postgres://"+role+"@", 1), pub)
	p := filepath.Join(e.dir, name+".yaml")
	require.NoError(e.t, os.WriteFile(p, []byte(y), 0o644))
	return p
}

// TestLeastPrivilegeRole runs the bridge as a role with only LOGIN
// REPLICATION, USAGE on the tables' schema and SELECT on them, against a
// publication the tables' owner made, as on a managed service: `validate
// --connect` passes, the initial snapshot reads every row, changes stream,
// and the heartbeat advances the slot while the tables are idle.
func TestLeastPrivilegeRole(t *testing.T) {
	defer parallel(t)()
	for _, plugin := range []string{"pgoutput", "wal2json"} {
		t.Run(plugin, func(t *testing.T) {
			defer parallel(t)()
			e := newEnv(t)
			e.pg.ExecT(t, leastPrivilegeSetup...)
			name := "lp" + plugin[:3]
			cfg := lpConfig(e, name, "lp", plugin)

			code, out, errs := execCLI(t, "validate", "--connect", "-c", cfg)
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
			require.Empty(t, checkLines(out, "FAIL"), out)
			requireLine(t, out, "ok", `role "lp" has the REPLICATION privilege`)
			requireLine(t, out, "ok", `role "lp" may read the 2 streamed tables`)

			log, tap := newLogTap(t)
			r := e.startWith(cfg, app.WithLogger(log))
			waitReady(t, r)
			e.waitSnapshotDone(name, time.Minute, nil)
			e.pg.ExecT(t, `INSERT INTO shop.orders VALUES (3, 'live')`, `UPDATE public.items SET name = 'live' WHERE id = 1`)
			ms := e.waitCount("CDC_"+name, 5, time.Minute)
			var got []string
			for _, m := range ms {
				got = append(got, fmt.Sprintf("%s %s.%s %v", m.Body["op"], m.Body["schema"], m.Body["table"], m.Body["after"].(map[string]any)["id"]))
			}
			require.ElementsMatch(t, []string{"read shop.orders 1", "read shop.orders 2", "read public.items 1",
				"insert shop.orders 3", "update public.items 1"}, got)

			// The heartbeat writes WAL the slot then confirms, with no
			// change to any table.
			conn := e.pg.Conn(t, "")
			var lsn string
			require.NoError(t, conn.QueryRow(t.Context(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
			require.Eventually(t, func() bool {
				var past bool
				err := conn.QueryRow(t.Context(), `SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`, lsn, "slot_"+name).Scan(&past)
				return err == nil && past
			}, 30*time.Second, 100*time.Millisecond, "the slot never moved past %s", lsn)
			_, failed := tap.first("heartbeat failed")
			require.False(t, failed, "a heartbeat failed")
			var super, repl bool
			require.NoError(t, conn.QueryRow(t.Context(), `SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = 'lp'`).Scan(&super, &repl))
			require.True(t, repl && !super)
		})
	}
}

// TestLeastPrivilegePreflight takes one privilege at a time from the
// least-privileged role and checks that `validate --connect` and the start
// of `bridge run` name it, with the GRANT (or setting) that fixes it, and
// that the fix works: run as a superuser, then validate passes.
func TestLeastPrivilegePreflight(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, leastPrivilegeSetup...)
	fixOf := func(t *testing.T, out, what string) string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^  (?:FAIL|warn)  .*` + regexp.QuoteMeta(what) + `.*\n        fix: (.*)$`).FindStringSubmatch(out)
		require.NotNil(t, m, "no line with a fix contains %q in:\n%s", what, out)
		return m[1]
	}
	cases := []struct {
		name, role, plugin string
		setup              []string // as postgres, for role
		what, fix          string
		status             string
		cfg                []string // replacements in the config
		before             []string // as postgres, in the subtest
		fixUntested        bool     // the fix needs a service this test does not have
	}{
		{name: "no REPLICATION", role: "lp_norepl", plugin: "pgoutput",
			setup: []string{`CREATE ROLE lp_norepl LOGIN`, `GRANT USAGE ON SCHEMA shop TO lp_norepl`, `GRANT SELECT ON shop.orders, public.items TO lp_norepl`},
			what:  `role "lp_norepl" lacks the REPLICATION privilege`, fix: `ALTER ROLE "lp_norepl" WITH REPLICATION;`, status: "FAIL"},
		{name: "no SELECT", role: "lp_nosel", plugin: "pgoutput",
			setup: []string{`CREATE ROLE lp_nosel LOGIN REPLICATION`, `GRANT USAGE ON SCHEMA shop TO lp_nosel`, `GRANT SELECT ON public.items TO lp_nosel`},
			what:  `role "lp_nosel" lacks SELECT on "shop"."orders", which snapshots read; sources.app.config.snapshot.mode is initial`,
			fix:   `GRANT SELECT ON "shop"."orders" TO "lp_nosel";`, status: "FAIL"},
		{name: "no SELECT, wal2json", role: "lp_nosel_w", plugin: "wal2json",
			setup: []string{`CREATE ROLE lp_nosel_w LOGIN REPLICATION`, `GRANT USAGE ON SCHEMA shop TO lp_nosel_w`, `GRANT SELECT ON public.items TO lp_nosel_w`},
			what:  `role "lp_nosel_w" lacks SELECT on "shop"."orders", which snapshots read; sources.app.config.snapshot.mode is initial`,
			fix:   `GRANT SELECT ON "shop"."orders" TO "lp_nosel_w";`, status: "FAIL"},
		{name: "no SELECT, no snapshot at start", role: "lp_nosel_n", plugin: "pgoutput",
			setup: []string{`CREATE ROLE lp_nosel_n LOGIN REPLICATION`, `GRANT USAGE ON SCHEMA shop TO lp_nosel_n`, `GRANT SELECT ON public.items TO lp_nosel_n`},
			what:  `role "lp_nosel_n" lacks SELECT on "shop"."orders", which snapshots read; only a requested snapshot (bridge snapshot) needs it`,
			fix:   `GRANT SELECT ON "shop"."orders" TO "lp_nosel_n";`, status: "warn", cfg: []string{"mode: initial", "mode: never"}},
		{name: "no USAGE on the schema", role: "lp_nousage", plugin: "pgoutput",
			setup: []string{`CREATE ROLE lp_nousage LOGIN REPLICATION`, `GRANT SELECT ON shop.orders, public.items TO lp_nousage`},
			what:  `role "lp_nousage" lacks USAGE on schema "shop", which snapshots of its tables need`,
			fix:   `GRANT USAGE ON SCHEMA "shop" TO "lp_nousage";`, status: "FAIL"},
		{name: "no EXECUTE on pg_logical_emit_message", role: "lp_noemit", plugin: "pgoutput",
			setup: []string{`CREATE ROLE lp_noemit LOGIN REPLICATION`, `GRANT USAGE ON SCHEMA shop TO lp_noemit`, `GRANT SELECT ON shop.orders, public.items TO lp_noemit`},
			what:  `role "lp_noemit" may not execute pg_logical_emit_message, which heartbeats (sources.app.config.heartbeat_interval) and snapshot watermarks call`,
			fix:   `GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO "lp_noemit";`, status: "FAIL"},
		{name: "no CONNECT on the database", role: "lp_noconn", plugin: "pgoutput",
			setup: []string{`CREATE ROLE lp_noconn LOGIN REPLICATION`, `GRANT USAGE ON SCHEMA shop TO lp_noconn`, `GRANT SELECT ON shop.orders, public.items TO lp_noconn`},
			what:  `permission denied for database "postgres"`, fix: `GRANT CONNECT ON DATABASE "postgres" TO "lp_noconn";`, status: "FAIL"},
		// Amazon RDS: replication comes from membership in rds_replication,
		// which a vanilla server does not honour, so the fix is not run.
		{name: "RDS without rds_replication", role: "lp_rds", plugin: "pgoutput",
			setup:  []string{`CREATE ROLE lp_rds LOGIN`, `GRANT USAGE ON SCHEMA shop TO lp_rds`, `GRANT SELECT ON shop.orders, public.items TO lp_rds`},
			before: []string{`CREATE ROLE rds_replication NOLOGIN`},
			what:   `role "lp_rds" lacks the REPLICATION privilege; on Amazon RDS and Aurora it comes from the rds_replication role`,
			fix:    `GRANT rds_replication TO "lp_rds"; (as a member of rds_superuser; set rds.logical_replication = 1 in the parameter group too)`, status: "FAIL", fixUntested: true},
	}
	for _, c := range cases {
		e.pg.ExecT(t, c.setup...)
	}
	// Managed services take these from PUBLIC; so does this test, granting
	// them back to every role but the one the case is about.
	e.pg.ExecT(t, `REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC`,
		`REVOKE CONNECT ON DATABASE postgres FROM PUBLIC`)
	for _, r := range []string{"lp", "lp_norepl", "lp_nosel", "lp_nosel_w", "lp_nosel_n", "lp_nousage", "lp_noemit", "lp_noconn", "lp_rds"} {
		if r != "lp_noconn" {
			e.pg.ExecT(t, `GRANT CONNECT ON DATABASE postgres TO `+r)
		}
		if r != "lp_noemit" {
			e.pg.ExecT(t, `GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO `+r)
		}
	}

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.pg.ExecT(t, c.before...)
			name := fmt.Sprintf("pf%d", i)
			cfg := lpConfig(e, name, c.role, c.plugin)
			if len(c.cfg) > 0 {
				cfg = withConfig(t, cfg, c.cfg...)
			}
			code, out, errs := execCLI(t, "validate", "--connect", "-c", cfg)
			if c.status == "FAIL" {
				require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", out, errs)
			}
			require.Equal(t, c.fix, fixOf(t, out, c.what))
			if c.status != "FAIL" {
				return
			}
			// The start of `bridge run` stops with the same words.
			code, out, errs = execCLI(t, "run", "-c", cfg)
			require.NotEqual(t, 0, code)
			require.Contains(t, strings.ReplaceAll(out+errs, `\"`, `"`), c.fix, "stdout:\n%s\nstderr:\n%s", out, errs) // the log is JSON
			if c.fixUntested {
				// Membership now counts as the privilege.
				e.pg.ExecT(t, `GRANT rds_replication TO lp_rds`)
				_, out, _ = execCLI(t, "validate", "--connect", "-c", cfg)
				requireLine(t, out, "ok", `role "lp_rds" is a member of rds_replication (Amazon RDS, Aurora)`)
				return
			}
			// The fix, run as the owner, is enough.
			e.pg.ExecT(t, strings.TrimSuffix(c.fix, ";"))
			code, out, errs = execCLI(t, "validate", "--connect", "-c", cfg)
			require.Equal(t, 0, code, "after %s:\nstdout:\n%s\nstderr:\n%s", c.fix, out, errs)
		})
	}
}
