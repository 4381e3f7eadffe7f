package wal2json

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/sources"
)

// TestSnapshotOnlyStreamedTables: wal2json has no publication, so what its
// stream carries is the tables filter (add-tables): exactly those names,
// or every logged table when it is empty. A snapshot of any other table
// (which `bridge snapshot`, the control endpoint and the initial snapshot
// all resolve through SnapshotTables) is refused in one line with the
// reason and the fix, as pgoutput refuses a table outside its publication:
// its rows would reach the stream while its changes never do.
func TestSnapshotOnlyStreamedTables(t *testing.T) {
	pg := server(t)
	pg.ExecT(t, `CREATE SCHEMA snapf`,
		`CREATE TABLE snapf.allowed (id int PRIMARY KEY)`,
		`CREATE TABLE snapf.secrets (id int PRIMARY KEY, token text)`,
		`CREATE UNLOGGED TABLE snapf.scratch (id int PRIMARY KEY)`,
		`CREATE TABLE snapf.parts (id int PRIMARY KEY) PARTITION BY RANGE (id)`,
		`CREATE TABLE snapf.parts_1 PARTITION OF snapf.parts FOR VALUES FROM (0) TO (100)`,
		`CREATE TABLE snapf.parts_2 PARTITION OF snapf.parts FOR VALUES FROM (100) TO (200)`)
	resolve := func(t *testing.T, tables []string, names ...string) ([]sources.SnapshotTable, error) {
		t.Helper()
		block := map[string]any{"dsn": pg.DSN(""), "slot": "snapf"}
		if tables != nil {
			block["tables"] = tables
		}
		src := newSource(t, "shop", block)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return src.(sources.Snapshotter).SnapshotTables(ctx, names)
	}
	refused := func(t *testing.T, err error, want string) {
		t.Helper()
		var se *sources.SetupError
		require.True(t, errors.As(err, &se), "want a SetupError, got %T: %v", err, err)
		require.Equal(t, want, err.Error())
	}

	t.Run("a table outside tables", func(t *testing.T) {
		_, err := resolve(t, []string{"snapf.allowed"}, "snapf.secrets")
		refused(t, err, "table snapf.secrets is not in sources.shop.config.tables (wal2json's add-tables filter), so its changes are not streamed and a snapshot of it could not be kept consistent; "+
			"fix: add snapf.secrets to sources.shop.config.tables (a reload applies it), or leave it out of the snapshot")
		_, err = resolve(t, []string{"snapf.allowed"}, "snapf.allowed", "snapf.secrets")
		require.ErrorContains(t, err, "table snapf.secrets is not in sources.shop.config.tables", "one table outside refuses the request")
		_, err = resolve(t, []string{"snapf.allowed"}, "public.allowed")
		require.ErrorContains(t, err, "table public.allowed is not in sources.shop.config.tables", "names match exactly, as add-tables does")

		got, err := resolve(t, []string{"snapf.allowed"}, "snapf.allowed")
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, "snapf.allowed", got[0].Name())
		got, err = resolve(t, []string{"snapf.allowed"})
		require.NoError(t, err)
		require.Len(t, got, 1, "no names: the tables streamed")
	})

	t.Run("tables the stream never carries", func(t *testing.T) {
		_, err := resolve(t, nil, "snapf.scratch")
		refused(t, err, `table snapf.scratch is unlogged: its changes are not written to the WAL, so they are never streamed and a snapshot of it could not be kept consistent; `+
			`fix: ALTER TABLE "snapf"."scratch" SET LOGGED; or leave it out of the snapshot`)
		_, err = resolve(t, nil, "snapf.parts")
		refused(t, err, "table snapf.parts is partitioned: wal2json streams its rows' changes under the names of its partitions, so a snapshot of it under its own name could not be kept consistent; "+
			"fix: snapshot its partitions instead (--tables snapf.parts_1,snapf.parts_2)")
		_, err = resolve(t, []string{"snapf.parts"})
		require.ErrorContains(t, err, "table snapf.parts is partitioned", "in tables too: add-tables matches the partitions' names")

		got, err := resolve(t, nil, "snapf.secrets", "snapf.parts_1")
		require.NoError(t, err, "without tables every logged table streams")
		require.Len(t, got, 2)
		all, err := resolve(t, nil)
		require.NoError(t, err)
		var names []string
		for _, st := range all {
			names = append(names, st.Name())
		}
		require.Contains(t, names, "snapf.secrets")
		require.Contains(t, names, "snapf.parts_1")
		require.NotContains(t, names, "snapf.scratch", "every table: the streamed ones")
		require.NotContains(t, names, "snapf.parts")
	})
}
