package pgoutput_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
)

// fixSQL is the first SQL statement of a printed fix.
var fixSQL = regexp.MustCompile(`(?:ALTER|CREATE|SELECT|GRANT) [^;]*;`)

// setupFix opens src and returns the fix of the setup error it stops with,
// which must name what.
func setupFix(t *testing.T, src sources.Source, what string) string {
	t.Helper()
	err := openErr(t, src, 0)
	var se *sources.SetupError
	require.True(t, errors.As(err, &se), "want a SetupError naming %q, got %v", what, err)
	require.Contains(t, err.Error(), what)
	return se.Fix
}

// applyFix runs the first SQL statement of fix as the superuser.
func applyFix(t *testing.T, pg *pgtest.Server, fix string) {
	t.Helper()
	sql := fixSQL.FindString(fix)
	require.NotEmpty(t, sql, "the fix holds no SQL: %s", fix)
	pg.ExecT(t, sql)
}

// TestSetupFixesWork: every fix a setup error prints is SQL that works in
// that situation: run as printed, the next start passes that check.
func TestSetupFixesWork(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`, `CREATE TABLE b (id int PRIMARY KEY)`)
	open := func(name string, block map[string]any) sources.Source {
		return newSource(t, name, block)
	}

	t.Run("REPLICATION privilege, then a publication FOR ALL TABLES", func(t *testing.T) {
		pg.ExecT(t, `CREATE ROLE plain LOGIN`)
		dsn := strings.Replace(pg.DSN(""), "postgres@", "plain@", 1)
		block := map[string]any{"dsn": dsn, "slot": "s_plain", "publication": "p_plain"}
		applyFix(t, pg, setupFix(t, open("plain", block), `role "plain" lacks the REPLICATION privilege`))
		// Now a replication role, but not a superuser: it may not create a
		// publication FOR ALL TABLES, and says so before trying.
		fix := setupFix(t, open("plain", block), `publication "p_plain" does not exist, and creating it FOR ALL TABLES needs a superuser; role "plain" is not one`)
		require.Contains(t, fix, `as a superuser: CREATE PUBLICATION "p_plain" FOR ALL TABLES;`)
		applyFix(t, pg, fix)
		require.NoError(t, openErr(t, open("plain", block), 0))
	})
	t.Run("a role that does not own the tables", func(t *testing.T) {
		pg.ExecT(t, `CREATE ROLE repl LOGIN REPLICATION`)
		dsn := strings.Replace(pg.DSN(""), "postgres@", "repl@", 1)
		block := map[string]any{"dsn": dsn, "slot": "s_repl", "publication": "p_repl", "tables": []any{"public.a"}}
		fix := setupFix(t, open("repl", block), `publication "p_repl" does not exist, and role "repl" may not create it: it lacks CREATE on database "postgres"; it does not own public.a`)
		require.True(t, strings.HasPrefix(fix, `as a superuser: CREATE PUBLICATION "p_repl" FOR TABLE "public"."a";`), fix)
		applyFix(t, pg, fix)
		require.NoError(t, openErr(t, open("repl", block), 0))
	})
	t.Run("physical slot", func(t *testing.T) {
		pg.ExecT(t, `SELECT pg_create_physical_replication_slot('phys')`)
		block := map[string]any{"dsn": pg.DSN(""), "slot": "phys", "publication": "p_phys"}
		applyFix(t, pg, setupFix(t, open("x", block), `slot "phys" is a physical slot, not a logical one`))
		require.NoError(t, openErr(t, open("x", block), 0))
	})
	t.Run("slot of another plugin", func(t *testing.T) {
		pg.ExecT(t, `SELECT pg_create_logical_replication_slot('td', 'test_decoding')`)
		block := map[string]any{"dsn": pg.DSN(""), "slot": "td", "publication": "p_td"}
		applyFix(t, pg, setupFix(t, open("x", block), `slot "td" was made by the test_decoding plugin`))
		require.NoError(t, openErr(t, open("x", block), 0))
	})
	t.Run("slot missing, create_slot false", func(t *testing.T) {
		block := map[string]any{"dsn": pg.DSN(""), "slot": "manual", "create_slot": false, "publication": "p_manual"}
		applyFix(t, pg, setupFix(t, open("x", block), `slot "manual" does not exist (create_slot is false)`))
		require.NoError(t, openErr(t, open("x", block), 0))
	})
	t.Run("publication missing, create_publication false", func(t *testing.T) {
		block := map[string]any{"dsn": pg.DSN(""), "slot": "s_nopub", "publication": "nopub", "create_publication": false, "tables": []any{"public.a", "public.b"}}
		fix := setupFix(t, open("x", block), `publication "nopub" does not exist (create_publication is false)`)
		require.Equal(t, `CREATE PUBLICATION "nopub" FOR TABLE "public"."a", "public"."b";`, fix)
		applyFix(t, pg, fix)
		require.NoError(t, openErr(t, open("x", block), 0))
	})
	t.Run("publication lacks a configured table", func(t *testing.T) {
		pg.ExecT(t, `CREATE PUBLICATION only_a FOR TABLE a`)
		block := map[string]any{"dsn": pg.DSN(""), "slot": "s_only_a", "publication": "only_a", "tables": []any{"public.a", "public.b"}}
		applyFix(t, pg, setupFix(t, open("x", block), `publication "only_a" lacks configured tables public.b`))
		require.NoError(t, openErr(t, open("x", block), 0))
	})
	t.Run("configured table does not exist", func(t *testing.T) {
		// The publication exists: the fix is not ALTER PUBLICATION … ADD
		// TABLE, which fails for a table that does not exist.
		pg.ExecT(t, `CREATE PUBLICATION with_a FOR TABLE a`)
		block := map[string]any{"dsn": pg.DSN(""), "slot": "s_with_a", "publication": "with_a", "tables": []any{"public.a", "public.later"}}
		fix := setupFix(t, open("x", block), `table public.later (in sources.x.config.tables) does not exist in database "postgres"`)
		require.Equal(t, "create the table, or remove public.later from sources.x.config.tables", fix)
		err := openErr(t, open("x", block), 0)
		require.NotContains(t, err.Error(), "ALTER PUBLICATION")
		// The publication missing too: one error, about the table, not a
		// CREATE PUBLICATION that would fail.
		block = map[string]any{"dsn": pg.DSN(""), "slot": "s_new", "publication": "p_new", "tables": []any{"public.later"}}
		err = openErr(t, open("x", block), 0)
		require.ErrorContains(t, err, "table public.later (in sources.x.config.tables) does not exist")
		require.NotContains(t, err.Error(), "creating publication")
		// Created, the table is added: to a new publication by the
		// bridge, to an existing one by the fix printed then.
		pg.ExecT(t, `CREATE TABLE later (id int PRIMARY KEY)`)
		require.NoError(t, openErr(t, open("x", block), 0))
		block = map[string]any{"dsn": pg.DSN(""), "slot": "s_with_a", "publication": "with_a", "tables": []any{"public.a", "public.later"}}
		applyFix(t, pg, setupFix(t, open("x", block), `publication "with_a" lacks configured tables public.later`))
		require.NoError(t, openErr(t, open("x", block), 0))
	})
	t.Run("a view in tables", func(t *testing.T) {
		pg.ExecT(t, `CREATE VIEW v AS SELECT * FROM a`)
		block := map[string]any{"dsn": pg.DSN(""), "slot": "s_v", "publication": "p_v", "tables": []any{"public.v"}}
		fix := setupFix(t, open("x", block), `public.v (in sources.x.config.tables) is a view, not a table`)
		require.Contains(t, fix, "remove public.v from sources.x.config.tables")
	})
}

// TestReplicaIdentityFixesWork: the warnings about replica identities
// carry SQL that, run as printed, ends the warning.
func TestReplicaIdentityFixesWork(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE nothing_pk (id int PRIMARY KEY)`, `ALTER TABLE nothing_pk REPLICA IDENTITY NOTHING`,
		`CREATE TABLE nothing_nopk (v int)`, `ALTER TABLE nothing_nopk REPLICA IDENTITY NOTHING`,
		`CREATE TABLE nopk (v int)`, `CREATE TABLE fine (id int PRIMARY KEY)`)
	src := newSource(t, "x", map[string]any{"dsn": pg.DSN("")})
	warnings := func() []config.Check {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out []config.Check
		for _, c := range src.(sources.Checker).Check(ctx, sources.CheckRequest{}) {
			require.NotEqual(t, config.CheckFail, c.Status, "%s", c.What)
			if c.Status == config.CheckWarn {
				out = append(out, c)
			}
		}
		return out
	}
	ws := warnings()
	require.Len(t, ws, 3)
	want := map[string]string{
		"table public.nopk has no primary key":                   `ALTER TABLE "public"."nopk" REPLICA IDENTITY FULL;`,
		"table public.nothing_nopk has REPLICA IDENTITY NOTHING": `ALTER TABLE "public"."nothing_nopk" REPLICA IDENTITY FULL;`,
		"table public.nothing_pk has REPLICA IDENTITY NOTHING":   `ALTER TABLE "public"."nothing_pk" REPLICA IDENTITY DEFAULT;`,
	}
	for _, w := range ws {
		var found bool
		for what, sql := range want {
			if strings.HasPrefix(w.What, what) {
				found = true
				require.Equal(t, sql, fixSQL.FindString(w.Fix))
				applyFix(t, pg, w.Fix)
			}
		}
		require.True(t, found, "unexpected warning %s", w.What)
	}
	require.Empty(t, warnings())
}

// TestPublicationDroppedFixWorks: the fix printed when the publication is
// dropped under a streaming source (recreate it, skip the slot past the
// drop) is SQL that, run as printed, lets a new source stream again.
func TestPublicationDroppedFixWorks(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`)
	block := map[string]any{"dsn": pg.DSN(""), "slot": "s_drop", "publication": "p_drop", "tables": []any{"public.a"}}
	read := func(src sources.Source) (*cdc.Txn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return src.Read(ctx)
	}
	src := newSource(t, "x", block)
	require.NoError(t, openErr(t, src, 0))
	pg.ExecT(t, `INSERT INTO a VALUES (1)`)
	_, err := read(src)
	require.NoError(t, err)
	pg.ExecT(t, `DROP PUBLICATION p_drop`, `INSERT INTO a VALUES (2)`)
	_, err = read(src)
	var se *sources.SetupError
	require.True(t, errors.As(err, &se), "%v", err)
	require.Contains(t, se.What, `publication "p_drop" of database "postgres" is gone while slot "s_drop" needs it`)
	require.NoError(t, src.Close(context.Background()))
	sqls := fixSQL.FindAllString(se.Fix, -1)
	require.Equal(t, []string{`CREATE PUBLICATION "p_drop" FOR TABLE "public"."a";`, `SELECT pg_replication_slot_advance('s_drop', pg_current_wal_lsn());`}, sqls)
	require.Eventually(t, func() bool { // the walsender lets the slot go
		var active bool
		return pg.Conn(t, "").QueryRow(t.Context(), `SELECT active FROM pg_replication_slots WHERE slot_name = 's_drop'`).Scan(&active) == nil && !active
	}, 30*time.Second, 50*time.Millisecond)
	pg.ExecT(t, sqls...)

	src = newSource(t, "x", block)
	require.NoError(t, openErr(t, src, 0))
	pg.ExecT(t, `INSERT INTO a VALUES (3)`)
	tx, err := read(src)
	require.NoError(t, err)
	require.Equal(t, []any{int64(3)}, tx.Changes[0].After)
}
