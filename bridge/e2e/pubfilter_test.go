package e2e_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSnapshotFollowsPublicationFilters: a publication with a column list
// and a row filter (PostgreSQL 15+) narrows what the stream carries, and
// a snapshot reads the same: only the listed columns (the secret one
// never reaches the stream, read or streamed) and only the rows the
// filter passes, in chunks smaller than the table so the filter meets the
// key's paging. A snapshot's where on a column outside the list is
// refused, naming the publication.
func TestSnapshotFollowsPublicationFilters(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE acct (id int PRIMARY KEY, name text, secret text, active bool NOT NULL)`,
		`INSERT INTO acct SELECT g, 'n' || g, 'SECRET-' || g, g % 2 = 0 FROM generate_series(1, 20) g`,
		`CREATE PUBLICATION pub_pubf FOR TABLE acct (id, name, active) WHERE (active)`)
	cfg := e.snapConfig("pubf", "initial", 3)
	r := e.start(cfg)
	waitReady(t, r)
	e.waitSnapshotDone("pubf", time.Minute, nil)
	e.pg.ExecT(t, `INSERT INTO acct VALUES (21, 'n21', 'SECRET-21', true), (22, 'n22', 'SECRET-22', false)`)
	ms := e.waitCount("CDC_pubf", 11, time.Minute)

	reads := map[int64]int{}
	var inserts []int64
	for _, m := range ms {
		require.NotContains(t, string(m.Raw), "SECRET", "a column outside the publication's list reached the stream")
		after := m.Body["after"].(map[string]any)
		require.Equal(t, []string{"active", "id", "name"}, slices.Sorted(maps.Keys(after)), "%s: the published columns", m.Raw)
		require.Equal(t, true, after["active"], "%s: a row the publication's filter leaves out", m.Raw)
		switch m.Body["op"] {
		case "read":
			reads[num(after["id"])]++
		case "insert":
			inserts = append(inserts, num(after["id"]))
		default:
			t.Fatalf("unexpected change %s", m.Raw)
		}
	}
	want := map[int64]int{}
	for id := int64(2); id <= 20; id += 2 {
		want[id] = 1
	}
	require.Equal(t, want, reads, "the snapshot reads the rows the filter passes, each once")
	require.Equal(t, []int64{21}, inserts)

	// The list narrowed while the bridge runs: the next snapshot reads
	// the new list, not what the last one learnt.
	e.pg.ExecT(t, `BEGIN; ALTER PUBLICATION pub_pubf DROP TABLE acct; ALTER PUBLICATION pub_pubf ADD TABLE acct (id, active) WHERE (active); COMMIT;`)
	code, out, errs := execCLI(t, "snapshot", "-c", cfg, "--tables", "acct", "--progress", "none", "--timeout", "1m")
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errs)
	ms = e.waitCount("CDC_pubf", 11+11, time.Minute)
	for _, m := range ms[11:] {
		require.Equal(t, "read", m.Body["op"], "%s", m.Raw)
		after := m.Body["after"].(map[string]any)
		require.Equal(t, []string{"active", "id"}, slices.Sorted(maps.Keys(after)), "%s: the columns of the list as it is now", m.Raw)
	}

	code, out, errs = execCLI(t, "snapshot", "-c", cfg, "--tables", "acct", "--where", "secret = 'x'", "--progress", "none", "--timeout", "1m")
	require.Equal(t, 1, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, errs, `names column "secret" of table public.acct, which is not in the column list of publication "pub_pubf"`)
	require.Contains(t, errs, "use one of its published columns: id, active")
	require.False(t, strings.Contains(out, "requested"), "nothing queued: %s", out)

	// A column list without the key (allowed when only inserts are
	// published): the snapshot cannot page by the key, and says so.
	e.pg.ExecT(t, `CREATE TABLE nokey (id int PRIMARY KEY, v text)`, `ALTER PUBLICATION pub_pubf ADD TABLE nokey (v)`)
	code, out, errs = execCLI(t, "snapshot", "-c", cfg, "--tables", "nokey", "--where", "v = 'x'", "--progress", "none", "--timeout", "1m")
	require.Equal(t, 1, code, "stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, errs, `key column "id" of public.nokey is not in the column list of publication "pub_pubf"`)
	fix := `BEGIN; ALTER PUBLICATION "pub_pubf" DROP TABLE "public"."nokey"; ALTER PUBLICATION "pub_pubf" ADD TABLE "public"."nokey" ("v", "id"); COMMIT;`
	require.Contains(t, errs, fix)
	e.pg.ExecT(t, fix) // as printed: then the snapshot is accepted
	code, out, errs = execCLI(t, "snapshot", "-c", cfg, "--tables", "nokey", "--where", "v = 'x'", "--progress", "none", "--timeout", "1m")
	require.Equal(t, 0, code, "after the fix: stdout: %s\nstderr: %s", out, errs)
	require.Contains(t, out, "complete")
	r.stop(t)
}
