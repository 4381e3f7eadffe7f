package e2e_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// partitionDDL makes a table partitioned by range with two partitions.
var partitionDDL = []string{
	`CREATE TABLE m (id int, at date, v text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`,
	`CREATE TABLE m_2024 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')`,
	`CREATE TABLE m_2025 PARTITION OF m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
}

// partitionWorkload writes into both partitions, attaches a third one and
// writes into it, detaches the first one and writes into it (no longer part
// of the table, so not streamed), then writes through the table again.
var partitionWorkload = []string{
	`INSERT INTO m VALUES (1, '2024-06-01', 'a'), (2, '2025-06-01', 'b')`,
	`CREATE TABLE m_2026 (LIKE m INCLUDING ALL)`,
	`ALTER TABLE m ATTACH PARTITION m_2026 FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
	`INSERT INTO m VALUES (3, '2026-06-01', 'c')`,
	`UPDATE m SET v = 'b2' WHERE id = 2`,
	`ALTER TABLE m DETACH PARTITION m_2024`,
	`INSERT INTO m_2024 VALUES (4, '2024-07-01', 'detached')`,
	`DELETE FROM m WHERE id = 1`, // m_2024 is detached: nothing to delete in m
	`INSERT INTO m VALUES (5, '2025-07-01', 'e')`,
}

// TestPartitionedTableNames streams a partitioned table while a partition
// is attached and another detached, and checks the names changes carry:
// the partitioned table's with publish_via_partition_root (how the bridge
// creates its publication when a table is partitioned), each partition's
// without it (a publication the user made with Postgres' default), and each
// partition's with wal2json, which never reports the partitioned table.
// The initial snapshot reads the rows under the names the stream uses.
func TestPartitionedTableNames(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name, plugin string
		setup        []string // as postgres, before the bridge starts
		tables       string
		snapshot     bool // row 0, written before the start, read by the initial snapshot
		want         []string
	}{
		{name: "via root", plugin: "pgoutput", tables: "[public.m]", snapshot: true,
			want: []string{"read m 0", "insert m 1", "insert m 2", "insert m 3", "update m 2", "insert m 5"}},
		{name: "via partitions", plugin: "pgoutput", tables: "[public.m]", setup: []string{`CREATE PUBLICATION pub_PN FOR TABLE m`}, snapshot: true,
			want: []string{"read m_2025 0", "insert m_2024 1", "insert m_2025 2", "insert m_2026 3", "update m_2025 2", "insert m_2025 5"}},
		// The partitions of public.m when the source started: m_2026,
		// attached later, is not among them until the source restarts,
		// and m_2024 is until then, detached or not.
		{name: "wal2json", plugin: "wal2json", tables: "[public.m]",
			want: []string{"insert m_2024 1", "insert m_2025 2", "update m_2025 2", "insert m_2024 4", "insert m_2025 5"}},
		{name: "wal2json, partitions listed", plugin: "wal2json", tables: "[public.m_2024, public.m_2025, public.m_2026]",
			want: []string{"insert m_2024 1", "insert m_2025 2", "insert m_2026 3", "update m_2025 2", "insert m_2024 4", "insert m_2025 5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallel(t)()
			e := newEnv(t)
			name := "pt" + strings.NewReplacer(" ", "", ",", "").Replace(tc.name)
			e.pg.ExecT(t, partitionDDL...)
			for _, s := range tc.setup {
				e.pg.ExecT(t, strings.ReplaceAll(s, "PN", name))
			}
			extra := "      tables: " + tc.tables
			if tc.snapshot {
				e.pg.ExecT(t, `INSERT INTO m VALUES (0, '2025-01-01', 'before')`)
				extra += "\n      snapshot: {mode: initial, request_poll: 200ms}"
			}
			cfg := e.configPlugin(tc.plugin, name, extra)
			code, out, errs := execCLI(t, "validate", "--connect", "-c", cfg)
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
			r := e.start(cfg)
			waitReady(t, r)
			if tc.snapshot {
				e.waitSnapshotDone(name, time.Minute, nil)
			}
			e.pg.ExecT(t, partitionWorkload...)
			e.pg.ExecT(t, `INSERT INTO m VALUES (99, '2025-12-31', 'last')`)
			ms := e.waitCount("CDC_"+name, len(tc.want)+1, time.Minute)
			var got []string
			for _, m := range ms {
				row, _ := m.Body["after"].(map[string]any)
				if row == nil {
					row, _ = m.Body["before"].(map[string]any)
				}
				got = append(got, fmt.Sprintf("%s %s %v", m.Body["op"], m.Body["table"], row["id"]))
				require.Equal(t, fmt.Sprintf("cdc.%s.public.%s", name, m.Body["table"]), m.Subject)
				require.Equal(t, "public."+m.Body["table"].(string), m.Header.Get("Bridge-Table"))
			}
			require.Equal(t, tc.want, slices.DeleteFunc(got, func(s string) bool { return strings.HasSuffix(s, " 99") }), "changes and the names they carry")
		})
	}
}
