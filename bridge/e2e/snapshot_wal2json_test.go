package e2e_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/snapshot"
)

// TestSnapshotWal2JSONOutsideTables: a wal2json source streams only its
// tables (add-tables), so a snapshot of another table, which would put
// rows the stream never updates into it (any table the role can read), is
// refused on every path, with the reason and the fix: `bridge snapshot
// --tables`, the control endpoint, and a request written straight into the
// checkpoint bucket, which the bridge refuses when it takes it. The
// initial snapshot reads the tables only.
func TestSnapshotWal2JSONOutsideTables(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE wa (id int PRIMARY KEY)`, `CREATE TABLE wsecret (id int PRIMARY KEY, token text)`,
		`INSERT INTO wa SELECT g FROM generate_series(1, 10) g`, `INSERT INTO wsecret VALUES (1, 'hunter2')`)
	cfg := e.config("swjt", "      tables: [public.wa]\n      snapshot:\n        mode: initial\n        chunk_size: 4\n        request_poll: 200ms")
	usePlugin(t, cfg, "wal2json")
	e.start(cfg)
	waitSlotActive(t, e, "slot_swjt")
	st := e.waitSnapshotDone("swjt", 2*time.Minute, nil)
	require.Len(t, st.Last.Tables, 1)
	require.Equal(t, "public.wa", st.Last.Tables[0].Table, "the initial snapshot reads the tables streamed")

	const why = "table public.wsecret is not in sources.app.config.tables (wal2json's add-tables filter), so its changes are not streamed and a snapshot of it could not be kept consistent; " +
		"fix: add public.wsecret to sources.app.config.tables (a reload applies it), or leave it out of the snapshot"

	code, out, errOut := execCLI(t, "snapshot", "-c", cfg, "--tables", "public.wsecret", "--wait=false")
	require.Equal(t, 1, code, "stdout: %s\nstderr: %s", out, errOut)
	require.Contains(t, errOut, why)

	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	m, err := nc.Request("bridge.swjt.snapshot.app", []byte(`{"tables": ["public.wsecret"]}`), 35*time.Second)
	require.NoError(t, err)
	require.Equal(t, "400", m.Header.Get("Nats-Service-Error-Code"))
	require.Contains(t, m.Header.Get("Nats-Service-Error"), why)

	// Past the checks: written into the bucket directly.
	js := natsJS(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "bridge_checkpoints")
	require.NoError(t, err)
	req, err := json.Marshal(snapshot.Request{ID: "rdirect", Tables: []string{"public.wsecret"}, Reason: "request", At: time.Now().UTC()})
	require.NoError(t, err)
	_, err = kv.Create(ctx, snapshot.RequestKey("swjt", "app", "rdirect"), req)
	require.NoError(t, err)
	st = e.waitSnapshotDone("swjt", time.Minute, func(st snapshot.State) bool { return st.Last != nil && st.Last.ID == "rdirect" })
	require.Equal(t, "refused", st.Last.Outcome())
	require.Equal(t, why, st.Last.Error)

	e.pg.ExecT(t, `INSERT INTO wa VALUES (11)`)
	ms := e.waitCount("CDC_swjt", 11, 30*time.Second)
	require.Len(t, ms, 11, "10 reads of wa and the insert")
	for _, m := range ms {
		require.Equal(t, "wa", m.Body["table"], "nothing of public.wsecret reached the stream")
		require.NotContains(t, strings.ToLower(string(m.Raw)), "hunter2")
	}
}
