package pgoutput_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/sources"
)

// TestSnapshotTablesDottedNames: a snapshot reads only tables of the
// publication, matched as (schema, table): with "a.b".c published, a
// request for a.b.c names a."b.c" (the schema ends at the first dot),
// which is not published and is refused, not read with the published
// table's filters left off. Without names, the publication's tables are
// taken as they are, dots and all.
func TestSnapshotTablesDottedNames(t *testing.T) {
	pg := pgtest.StartT(t, pgtest.Options{})
	pg.ExecT(t, `CREATE SCHEMA "a.b"`, `CREATE TABLE "a.b".c (id int PRIMARY KEY)`,
		`CREATE SCHEMA a`, `CREATE TABLE a."b.c" (id int PRIMARY KEY, secret text)`,
		`CREATE PUBLICATION dotted FOR TABLE "a.b".c`)
	src := newSource(t, "x", map[string]any{"dsn": pg.DSN(""), "slot": "dotted", "publication": "dotted", "create_publication": false})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, src.Open(ctx, 0))
	snap := src.(sources.Snapshotter)

	_, err := snap.SnapshotTables(ctx, []string{"a.b.c"})
	requireSetup(t, err, `table a.b.c is not in publication "dotted"`, `ALTER PUBLICATION "dotted" ADD TABLE "a"."b.c";`)

	got, err := snap.SnapshotTables(ctx, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "a.b", got[0].Schema)
	require.Equal(t, "c", got[0].Table)
}
