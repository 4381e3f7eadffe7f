package pgoutput_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/pgoutput"
)

func newSource(t *testing.T, name string, block map[string]any) sources.Source {
	t.Helper()
	src, err := pgoutput.New((&config.Config{}).Decoder("sources."+name+".config", block), sources.Env{Name: name})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close(context.Background()) })
	return src
}

func newSourceErr(name string, block map[string]any) (sources.Source, error) {
	return pgoutput.New((&config.Config{}).Decoder("sources."+name+".config", block), sources.Env{Name: name})
}

func openErr(t *testing.T, src sources.Source, from cdc.LSN) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return src.Open(ctx, from)
}

// requireSetup asserts a SetupError naming the problem and carrying the fix.
func requireSetup(t *testing.T, err error, what, fix string) {
	t.Helper()
	require.Error(t, err)
	var se *sources.SetupError
	require.True(t, errors.As(err, &se), "want a SetupError, got %T: %v", err, err)
	require.Contains(t, err.Error(), what)
	require.Contains(t, se.Fix, fix)
}

func TestSetupChecks(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE TABLE a (id int PRIMARY KEY)`, `CREATE TABLE nokey (v int)`,
		`CREATE ROLE norepl LOGIN`, `SELECT pg_create_logical_replication_slot('other_plugin', 'test_decoding')`)

	t.Run("no replication privilege", func(t *testing.T) {
		dsn := strings.Replace(pg.DSN(""), "postgres@", "norepl@", 1)
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": dsn}), 0)
		requireSetup(t, err, `role "norepl" lacks the REPLICATION privilege`, `ALTER ROLE "norepl" WITH REPLICATION;`)
	})
	t.Run("slot made by another plugin", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "other_plugin"}), 0)
		requireSetup(t, err, `slot "other_plugin" was made by the test_decoding plugin, but this source uses pgoutput`, "pg_drop_replication_slot('other_plugin')")
	})
	t.Run("publication missing and not to be created", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "publication": "nopub", "create_publication": false}), 0)
		requireSetup(t, err, `publication "nopub" does not exist`, `CREATE PUBLICATION "nopub" FOR ALL TABLES;`)
	})
	t.Run("configured table missing from publication", func(t *testing.T) {
		pg.ExecT(t, `CREATE PUBLICATION only_a FOR TABLE a`)
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "publication": "only_a", "tables": []any{"public.a", "public.nokey"}}), 0)
		requireSetup(t, err, `publication "only_a" lacks configured tables public.nokey`, `ALTER PUBLICATION "only_a" ADD TABLE "public"."nokey";`)
	})
	t.Run("slot missing and not to be created", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "noslot", "create_slot": false}), 0)
		requireSetup(t, err, `slot "noslot" does not exist`, `pg_create_logical_replication_slot('noslot', 'pgoutput')`)
	})
	t.Run("slot missing while a checkpoint exists", func(t *testing.T) {
		err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "gone"}), cdc.LSN(0x1000000))
		requireSetup(t, err, `slot "gone" of database "postgres" is missing but the checkpoint is at 0/1000000`, "on_slot_lost: recreate")
	})
	t.Run("creates publication and slot", func(t *testing.T) {
		src := newSource(t, "made", map[string]any{"dsn": pg.DSN(""), "tables": []any{"public.a"}})
		require.NoError(t, openErr(t, src, 0))
		conn := pg.Conn(t, "")
		var plugin string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT plugin FROM pg_replication_slots WHERE slot_name = 'bridge_made'`).Scan(&plugin))
		require.Equal(t, "pgoutput", plugin)
		var tables string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT string_agg(schemaname || '.' || tablename, ',') FROM pg_publication_tables WHERE pubname = 'bridge_made'`).Scan(&tables))
		require.Equal(t, "public.a", tables)
	})
}

func TestWalLevelNotLogical(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{Settings: map[string]string{"wal_level": "replica"}})
	err := openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN("")}), 0)
	requireSetup(t, err, `wal_level is "replica"`, "ALTER SYSTEM SET wal_level = logical")
	// The fix, as printed, works after a restart.
	var se *sources.SetupError
	require.True(t, errors.As(err, &se))
	applyFix(t, pg, se.Fix)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, pg.Restart(ctx, "fast"))
	require.NoError(t, openErr(t, newSource(t, "x", map[string]any{"dsn": pg.DSN("")}), 0))
}

func TestConfigErrorsNameTheirPath(t *testing.T) {
	_, err := pgoutput.New((&config.Config{}).Decoder("sources.shop.config", map[string]any{
		"slot": "Bad-Name", "tabels": []any{"x"}, "status_interval": "soon",
	}), sources.Env{Name: "shop"})
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{"sources.shop.config.tabels", "sources.shop.config.status_interval"} {
		require.Contains(t, msg, want, fmt.Sprintf("error should name %s", want))
	}
	_, err = pgoutput.New((&config.Config{}).Decoder("sources.shop.config", map[string]any{"slot": "Bad-Name"}), sources.Env{Name: "shop"})
	require.ErrorContains(t, err, "sources.shop.config.dsn: must be set")
	require.ErrorContains(t, err, `sources.shop.config.slot: "Bad-Name" is not a valid slot name`)
	_, err = pgoutput.New((&config.Config{}).Decoder("sources.shop.config", map[string]any{"dsn": "postgres://x@y/z?tcp_user_timeout=20s"}), sources.Env{Name: "shop"})
	require.ErrorContains(t, err, `sources.shop.config.dsn: tcp_user_timeout="20s": must be a whole number >= 0 (milliseconds sent data may stay unacknowledged; 0: the system's): libpq's TCP parameter, which the bridge applies to its own sockets`)
}

func TestSnapshotConfig(t *testing.T) {
	_, err := pgoutput.New((&config.Config{}).Decoder("sources.shop.config", map[string]any{
		"dsn": "postgres://x@y/z", "snapshot": map[string]any{"mode": "always", "chunk_size": 0},
	}), sources.Env{Name: "shop"})
	require.ErrorContains(t, err, `sources.shop.config.snapshot.mode: "always" is not a snapshot mode: use initial, never, initial_only or when_needed`)
	require.ErrorContains(t, err, `sources.shop.config.snapshot.chunk_size: must be > 0, got 0`)

	src, err := pgoutput.New((&config.Config{}).Decoder("sources.shop.config", map[string]any{
		"dsn": "postgres://x@y/z", "snapshot": map[string]any{"mode": "initial_only", "chunk_size": 500},
	}), sources.Env{Name: "shop"})
	require.NoError(t, err)
	opts := src.(sources.Snapshotter).SnapshotOptions()
	require.Equal(t, sources.SnapshotInitialOnly, opts.Mode)
	require.Equal(t, 500, opts.ChunkSize)
	require.Equal(t, time.Second, opts.Poll)
}
