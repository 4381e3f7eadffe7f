package wal2json

import (
	"context"
	"errors"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
)

// One private cluster serves every test in the package that needs one.
var (
	pgOnce sync.Once
	pgSrv  *pgtest.Server
	pgErr  error
)

func server(t *testing.T) *pgtest.Server {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgSrv, pgErr = pgtest.Start(ctx, pgtest.Options{})
	})
	if pgErr != nil {
		t.Fatalf("starting postgres: %v", pgErr)
	}
	return pgSrv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pgSrv != nil {
		pgSrv.Destroy()
	}
	os.Exit(code)
}

func newSource(t *testing.T, name string, block map[string]any) sources.Source {
	t.Helper()
	src, err := New((&config.Config{}).Decoder("sources."+name+".config", block), sources.Env{Name: name})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close(context.Background()) })
	return src
}

func openErr(t *testing.T, src sources.Source) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return src.Open(ctx, 0)
}

func requireSetup(t *testing.T, err error, what, fix string) {
	t.Helper()
	require.Error(t, err)
	var se *sources.SetupError
	require.True(t, errors.As(err, &se), "want a SetupError, got %T: %v", err, err)
	require.Contains(t, se.What, what)
	require.Contains(t, se.Fix, fix)
}

func TestWal2jsonSetup(t *testing.T) {
	pg := server(t)
	pg.ExecT(t, `SELECT pg_create_logical_replication_slot('made_by_pgoutput', 'pgoutput')`)

	t.Run("slot made by pgoutput", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "made_by_pgoutput"}))
		requireSetup(t, err, `slot "made_by_pgoutput" was made by the pgoutput plugin, but this source uses wal2json`,
			"set the source's type to pgoutput")
	})

	t.Run("plugin not installed", func(t *testing.T) {
		// A server that cannot find the library: the same error as one
		// without the package installed.
		dsn := pg.DSN("") + "&options=-c%20dynamic_library_path%3D/nonexistent"
		err := openErr(t, newSource(t, "nolib", map[string]any{"dsn": dsn}))
		requireSetup(t, err, `the wal2json output plugin is not installed on the PostgreSQL server (could not access file "wal2json": No such file or directory)`,
			"apt-get install postgresql-15-wal2json")
	})

	t.Run("error mapping on the real error text", func(t *testing.T) {
		conn := pg.Conn(t, "")
		_, err := conn.Exec(t.Context(), `SELECT pg_create_logical_replication_slot('missing_plugin', 'wal2json_missing')`)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, `could not access file "wal2json_missing": No such file or directory`, pe.Message)
		wrapped := errors.Join(errors.New("creating slot"), err)
		requireSetup(t, mapError(wrapped, "wal2json_missing", 16), "wal2json_missing output plugin is not installed", "apt-get install postgresql-16-wal2json")
		requireSetup(t, mapError(err, "wal2json_missing", 0), "not installed", "postgresql-<major>-wal2json")
		// Other errors pass unchanged.
		require.Equal(t, err, mapError(err, "wal2json", 15))
		other := errors.New("boom")
		require.Equal(t, other, mapError(other, "wal2json", 15))
		require.NoError(t, mapError(nil, "wal2json", 15))
	})

	t.Run("old wal2json rejects numbers as text", func(t *testing.T) {
		conn := pg.Conn(t, "")
		_, err := conn.Exec(t.Context(), `SELECT pg_create_logical_replication_slot('probe', 'wal2json', true)`)
		require.NoError(t, err)
		_, err = conn.Exec(t.Context(), `SELECT pg_logical_slot_peek_changes('probe', NULL, NULL, 'format-version', '2', '`+optNumbersAsText+`', '1')`)
		if err == nil {
			t.Skip("this wal2json accepts " + optNumbersAsText)
		}
		require.True(t, isUnknownOption(err, optNumbersAsText), "%v", err)
		require.False(t, isUnknownOption(err, "include-xids"))
	})

	t.Run("streams and creates the slot with wal2json", func(t *testing.T) {
		pg.ExecT(t, `CREATE TABLE t1 (id int PRIMARY KEY, v text)`)
		src := newSource(t, "made", map[string]any{"dsn": pg.DSN(""), "tables": []any{"public.t1"}, "message_prefixes": []any{"m"}})
		require.NoError(t, openErr(t, src))
		pg.ExecT(t, `CREATE TABLE t2 (id int PRIMARY KEY)`, `INSERT INTO t2 VALUES (1)`, // filtered by add-tables
			`SELECT pg_logical_emit_message(false, 'other', 'filtered')`,
			`INSERT INTO t1 VALUES (1, 'a')`, `SELECT pg_logical_emit_message(false, 'm', 'kept')`)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		tx, err := src.Read(ctx)
		require.NoError(t, err)
		require.Len(t, tx.Changes, 1)
		c := tx.Changes[0]
		require.Equal(t, cdc.OpInsert, c.Op)
		require.Equal(t, "t1", c.Table)
		require.Equal(t, "postgres", c.Database)
		require.Equal(t, []any{int64(1), "a"}, c.After)
		tx, err = src.Read(ctx)
		require.NoError(t, err)
		require.Equal(t, "kept", string(tx.Changes[0].Content))
		var plugin string
		require.NoError(t, pg.Conn(t, "").QueryRow(t.Context(), `SELECT plugin FROM pg_replication_slots WHERE slot_name = 'bridge_made'`).Scan(&plugin))
		require.Equal(t, "wal2json", plugin)
	})
}

func TestByteaOutputMustBeHex(t *testing.T) {
	pg := server(t)
	dsn := pg.DSN("") + "&options=-c%20bytea_output%3Descape"
	err := openErr(t, newSource(t, "esc", map[string]any{"dsn": dsn, "slot": "esc"}))
	requireSetup(t, err, `bytea_output is "escape"`, `ALTER DATABASE "postgres" SET bytea_output = 'hex'`)
}

func TestArgs(t *testing.T) {
	p := &plugin{cfg: pgConfig(nil, nil), numbersAsText: true}
	args := strings.Join(p.Args(), ", ")
	for _, want := range []string{`"format-version" '2'`, `"include-xids" '1'`, `"include-lsn" '1'`, `"include-type-oids" '1'`,
		`"include-not-null" '1'`, `"include-typmod" '1'`, `"include-pk" '1'`, `"actions" 'insert,update,delete,truncate'`, `"numeric-data-types-as-string" '1'`} {
		require.Contains(t, args, want)
	}
	require.NotContains(t, args, "add-tables")
	require.NotContains(t, args, "add-msg-prefixes")

	p = &plugin{cfg: pgConfig([]string{"public.orders", "Sales.Line$Items"}, []string{"app", "it's"})}
	args = strings.Join(p.Args(), ", ")
	require.NotContains(t, args, "numeric-data-types-as-string")
	require.Contains(t, args, `"add-tables" 'public.orders,Sales.Line$Items'`)
	require.Contains(t, args, `"add-msg-prefixes" 'app,it''s'`)

	// wal2json's escapes, for names the config cannot hold today.
	require.Equal(t, `my\ schema.a\,b\*,x.y\.z\'q\\`, AddTables([]string{"my schema.a,b*", `x.y.z'q\`}))
	for _, p := range [][]string{{"*"}, {"a b"}, {"a,b"}, {`a\b`}, nil} {
		_, ok := msgPrefixes(p)
		require.False(t, ok, "%q", p)
	}
}

// TestDocExample decodes the YAML example of doc.go.
func TestDocExample(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(f.Doc.Text(), "\n") {
		if strings.HasPrefix(l, "\t") {
			lines = append(lines, strings.TrimPrefix(l, "\t"))
		}
	}
	var doc struct {
		Sources map[string]struct {
			Type   string         `yaml:"type"`
			Config map[string]any `yaml:"config"`
		} `yaml:"sources"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &doc), strings.Join(lines, "\n"))
	shop := doc.Sources["shop"]
	require.Equal(t, "wal2json", shop.Type)
	src, err := New((&config.Config{}).Decoder("sources.shop.config", shop.Config), sources.Env{Name: "shop"})
	require.NoError(t, err)
	cfg := src.(*Source).cfg
	require.Equal(t, "bridge_shop_wal2json", cfg.Slot)
	require.Equal(t, []string{"public.orders", "public.customers"}, cfg.Tables)
	require.Equal(t, 10*time.Second, cfg.StatusInterval)
}

func TestConfigErrorsNameTheirPath(t *testing.T) {
	_, err := New((&config.Config{}).Decoder("sources.shop.config", map[string]any{"tabels": []any{"x"}}), sources.Env{Name: "shop"})
	require.ErrorContains(t, err, "sources.shop.config.tabels")
	require.ErrorContains(t, err, "sources.shop.config.dsn: must be set")
}

func pgConfig(tables, prefixes []string) pgrepl.Config {
	c := pgrepl.DefaultConfig("t")
	c.Tables, c.MessagePrefixes = tables, prefixes
	return c
}
