package e2e_test

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
)

// TestSnapshotLogsNoKeys: a snapshot's keys are the table's data (here the
// hashes of tokens), so even at debug level its log names each chunk by
// its id, never by the keys it starts after or ends at.
func TestSnapshotLogsNoKeys(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE tokens (token_hash text PRIMARY KEY, owner text)`,
		`INSERT INTO tokens SELECT 'h' || md5('token-' || g), 'o' || g FROM generate_series(1, 40) g`)
	var logs syncBuffer
	debug := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.startWith(e.snapConfig("slogkeys", "initial", 7), app.WithLogger(debug))
	st := e.waitSnapshotDone("slogkeys", 2*time.Minute, nil)
	require.Equal(t, int64(40), st.Last.Tables[0].Rows)

	out := logs.String()
	conn := e.pg.Conn(t, "")
	rows, err := conn.Query(context.Background(), `SELECT token_hash FROM tokens`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, keys, 40)
	for _, k := range keys {
		if i := strings.Index(out, k); i >= 0 {
			t.Errorf("key %s is in the log: ...%s...", k, out[max(0, i-200):min(len(out), i+100)])
		}
	}

	// Each read is still there, named by the chunk id "snapshot chunk sent" uses.
	reads := regexp.MustCompile(`msg="snapshot chunk read" .*table=public\.tokens chunk=\S+ from_start=(true|false) reads=\d+`).FindAllStringSubmatch(out, -1)
	require.GreaterOrEqual(t, len(reads), 6, "40 rows in chunks of 7, each read logged:\n%s", out)
	require.Equal(t, "true", reads[0][1], "the first chunk starts at the table's first row")
	require.Equal(t, "false", reads[1][1])
}
