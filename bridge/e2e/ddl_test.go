package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/pgtest"
)

// TestDDLMidStream changes a published table's columns between its
// changes while the bridge streams (a column added with a default, one
// dropped, one renamed, one retyped) and checks that each change carries
// the columns and values of the table as it was when the change was
// written. It runs on every major of the version matrix, with pgoutput,
// and with wal2json too where the plugin exists: only Debian's
// PostgreSQL 15 has it (postgresql-15-wal2json; the npm builds of 16 to
// 18 have none), so the wal2json half runs on 15 only.
func TestDDLMidStream(t *testing.T) {
	defer parallel(t)()
	eachMajor(t, func(t *testing.T, major int) {
		e := newEnvMajor(t, major)
		e.pg.ExecT(t, `CREATE TABLE d (id int PRIMARY KEY, a text, n int)`)
		streams := []string{"CDC_ddl"}
		cfg := e.config("ddl", "")
		if pgtest.HasWal2json(major) {
			cfg, streams = e.parityConfig("ddl"), []string{"CDC_ddl_pg", "CDC_ddl_wj"}
		}
		r := e.start(cfg)
		waitReady(t, r)
		e.pg.ExecT(t,
			`INSERT INTO d VALUES (1, 'one', 1)`,
			`ALTER TABLE d ADD COLUMN b int DEFAULT 7`,
			`INSERT INTO d (id, a, n) VALUES (2, 'two', 2)`,
			`UPDATE d SET a = 'uno' WHERE id = 1`,
			`ALTER TABLE d DROP COLUMN n`,
			`INSERT INTO d VALUES (3, 'three', 3)`,
			`ALTER TABLE d RENAME COLUMN a TO name`,
			`ALTER TABLE d ALTER COLUMN b TYPE bigint`,
			`INSERT INTO d VALUES (4, 'four', 9007199254740993)`,
			// DDL and DML in one transaction.
			`BEGIN; INSERT INTO d VALUES (5, 'five', 5); ALTER TABLE d ADD COLUMN c text; INSERT INTO d VALUES (6, 'six', 6, 'c'); COMMIT`,
		)
		want := []map[string]any{
			{"id": 1.0, "a": "one", "n": 1.0},
			{"id": 2.0, "a": "two", "n": 2.0, "b": 7.0},
			{"id": 1.0, "a": "uno", "n": 1.0, "b": 7.0},
			{"id": 3.0, "a": "three", "b": 3.0},
			{"id": 4.0, "name": "four", "b": 9007199254740993.0},
			{"id": 5.0, "name": "five", "b": 5.0},
			{"id": 6.0, "name": "six", "b": 6.0, "c": "c"},
		}
		for _, stream := range streams {
			ms := e.waitCount(stream, len(want), 30*time.Second)
			require.Len(t, ms, len(want), stream)
			checkOrdered(t, ms)
			for i, w := range want {
				require.Equal(t, w, ms[i].Body["after"], "%s: change %d", stream, i)
			}
		}
	})
}
