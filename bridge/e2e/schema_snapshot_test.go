package e2e_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/schema"
)

// TestSchemaSnapshotKill9: an initial snapshot of a table the registry
// does not know registers its version before its first read, and its
// reads name it in Bridge-Schema-Version; the bridge is killed with
// SIGKILL three times during the snapshot, and a column is added while it
// is down: the reads after the restart have a new shape, which the
// snapshot registers as the next version. Every row is read once, every
// event is stored once (a chunk read again announces again, with the
// snapshot's id, which the sinks drop), each before the first message
// under its version, and every read validates against its version (NOT
// NULL and varchar(12) included: a snapshot reads them from the catalog
// with the rows). The first change after the snapshot names the latest
// version and announces nothing.
func TestSchemaSnapshotKill9(t *testing.T) {
	defer parallelLong(t)()
	bin := bridgeBinary(t)
	e := newEnv(t)
	n := 20000
	e.pg.ExecT(t, `CREATE TABLE sn (id bigint PRIMARY KEY, code varchar(12) NOT NULL, v int)`,
		fmt.Sprintf(`INSERT INTO sn SELECT g, 'c' || g, g FROM generate_series(1, %d) g`, n), `ANALYZE sn`)
	cfg := e.snapConfig("ssn", "initial", 100)
	enableSchemas(t, cfg)
	p := startProc(t, bin, cfg)
	for kills := 0; kills < 3; kills++ {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			st, ok := e.snapState("ssn")
			if ok && st.Current != nil && len(st.Current.Tables) > 0 && st.Current.Tables[0].Chunks > int64(kills*30+5) {
				break
			}
			if ok && st.Current == nil && st.Last != nil {
				break // done before this kill
			}
			require.False(t, time.Now().After(deadline), "no snapshot progress:\n%s", p.out.String())
			time.Sleep(20 * time.Millisecond)
		}
		p.kill9(t)
		if kills == 1 {
			e.pg.ExecT(t, `ALTER TABLE sn ADD COLUMN extra text DEFAULT 'x'`)
		}
		p = startProc(t, bin, cfg)
	}
	e.waitSnapshotDone("ssn", 3*time.Minute, nil)
	e.pg.ExecT(t, `INSERT INTO sn (id, code, v) VALUES (100000, 'after', 1)`)

	var ms []msg
	require.Eventually(t, func() bool {
		ms = e.messages("CDC_ssn")
		last := ms[len(ms)-1]
		return last.Header.Get("Bridge-Op") == "insert"
	}, time.Minute, 100*time.Millisecond)
	reg := e.registry(t)
	events, rows := checkSchemaStream(t, reg, "app", ms)
	seen := map[string]int{}
	for _, m := range rows {
		if m.Header.Get("Bridge-Op") != "read" {
			continue
		}
		id := strconv.FormatFloat(m.Body["after"].(map[string]any)["id"].(float64), 'f', 0, 64)
		seen[id]++
		require.Equal(t, 1, seen[id], "row %s read twice", id)
	}
	require.Len(t, seen, n, "every row read once")
	last := rows[len(rows)-1]
	require.Equal(t, "insert", last.Header.Get("Bridge-Op"))
	latest := reg.latest("app", "public", "sn")
	require.Equal(t, strconv.Itoa(latest), last.Header.Get(schema.HeaderVersion), "the change after the snapshot names the latest version")
	require.NotEqual(t, "schema", ms[len(ms)-2].Header.Get("Bridge-Op"), "and announces nothing")
	ids := map[string]bool{}
	for _, m := range events {
		require.False(t, ids[m.ID], "event %s stored twice", m.ID)
		ids[m.ID] = true
	}
	require.Len(t, events, 2, "version 1, and the version with the added column")
	v1, v2 := reg.version("app", "public", "sn", 1), reg.version("app", "public", "sn", 2)
	require.NotEmpty(t, v1.Since.Snapshot, "first seen by the snapshot")
	require.NotEmpty(t, v2.Since.Snapshot, "the added column, first seen by the snapshot too")
	require.Equal(t, []schema.Column{{Name: "id", Type: "int8", OID: 20, NotNull: true, Key: true},
		{Name: "code", Type: "varchar", OID: 1043, Declared: "character varying(12)", NotNull: true}, {Name: "v", Type: "int4", OID: 23}}, v1.Columns)
	require.Empty(t, v1.Inferred)
	var ev schema.Event
	require.NoError(t, json.Unmarshal(events[1].Raw, &ev))
	require.Equal(t, []schema.Column{{Name: "extra", Type: "text", OID: 25}}, ev.Diff.Added)
	p.term(t)
}
