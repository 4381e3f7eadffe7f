package e2e_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"
	"go.yaml.in/yaml/v3"
)

// TestLargeTransactionStreams streams one transaction far larger than 1000
// changes (published while it arrives, before its commit) through pgoutput
// and wal2json in a bridge process that is killed with SIGKILL halfway:
// every row arrives once, in order, through both, under the identity
// start of commit record + 1; only the last message carries the
// transaction's size, which shows the others were published before the
// commit arrived. TEST_LONG=1 makes it 1 million rows. The time from
// COMMIT to the first message stored and the bridge's peak RSS are logged.
func TestLargeTransactionStreams(t *testing.T) {
	defer parallel(t)()
	rows := 30000
	if os.Getenv("TEST_LONG") != "" {
		rows = 1000000
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE big (id bigserial PRIMARY KEY, n int, pad text)`)
	cfg := e.parityConfig("large") // sources pg (pgoutput) and wj (wal2json)
	raw, err := os.ReadFile(cfg)
	require.NoError(t, err)
	var y map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &y))
	for _, src := range y["sources"].(map[string]any) {
		c := src.(map[string]any)["config"].(map[string]any)
		c["spill_changes"] = 1000
		if os.Getenv("TEST_NO_SPILL") != "" { // for comparing memory in the note
			c["spill_changes"], c["spill_bytes"] = 100000000, int64(100000000000)
		}
	}
	out, err := yaml.Marshal(y)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg, out, 0o644))

	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_large_pg")
	waitSlotActive(t, e, "slot_large_wj")
	e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO big (n, pad) SELECT i, repeat(md5(i::text), 6) FROM generate_series(1, %d) i`, rows))
	committed := time.Now()
	e.waitStored("CDC_large_pg", 1, 5*time.Minute)
	t.Logf("first message of the %d-row transaction stored %s after COMMIT returned", rows, time.Since(committed).Round(time.Millisecond))

	e.waitStored("CDC_large_pg", rows/3, 5*time.Minute)
	p.kill9(t)
	p = startProc(t, bin, cfg)
	var pg []msg
	for _, src := range []string{"pg", "wj"} {
		e.waitStored("CDC_large_"+src, rows, 10*time.Minute)
		ms := e.rawMessages("CDC_large_" + src)
		require.Len(t, ms, rows)
		var jp fastjson.Parser
		checkOrdered(t, ms)
		for i, m := range ms {
			wantSize := ""
			if i == rows-1 {
				wantSize = strconv.Itoa(rows)
			}
			require.Equal(t, wantSize, m.Header.Get("Bridge-Tx-Size"), "%s message %d", src, i)
			require.Equal(t, uint64(1), uint64(m.Pos.LSN)%2, "identity: start of the commit record + 1")
			require.Equal(t, ms[0].Pos.LSN, m.Pos.LSN)
			require.Equal(t, uint32(i), m.Pos.Seq)
			v, err := jp.ParseBytes(m.Raw)
			require.NoError(t, err, "%s message %d: %s", src, i, m.Raw)
			require.Equal(t, strconv.Itoa(i+1), jsonText(v, "after", "n"), "%s message %d", src, i)
		}
		if src == "pg" {
			pg = ms
		} else {
			require.Equal(t, pg[0].Pos, ms[0].Pos, "both sources give the same positions")
			require.Equal(t, pg[rows-1].Pos, ms[rows-1].Pos)
		}
	}
	peak := peakRSS(t, p.cmd.Process.Pid)
	p.term(t)
	t.Logf("one transaction of %d rows through pgoutput and wal2json: bridge peak RSS after the restart %d MiB", rows, peak>>20)
}

// peakRSS returns the process's peak resident set size in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			kb, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
