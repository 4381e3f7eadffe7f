package e2e_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestLargeTransactionSpills streams one transaction far larger than the
// in-memory limit (spill_changes: 1000) through pgoutput and wal2json in a
// bridge process that is killed with SIGKILL halfway: every row arrives
// once, in order, with the transaction's size, through both. TEST_LONG=1 makes it 1 million rows. The bridge's
// peak RSS is logged.
func TestLargeTransactionSpills(t *testing.T) {
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

	e.waitStored("CDC_large_pg", rows/3, 5*time.Minute)
	p.kill9(t)
	p = startProc(t, bin, cfg)
	var pg []msg
	for _, src := range []string{"pg", "wj"} {
		ms := e.waitCount("CDC_large_"+src, rows, 10*time.Minute)
		require.Len(t, ms, rows)
		checkOrdered(t, ms)
		for i, m := range ms {
			require.Equal(t, strconv.Itoa(rows), m.Header.Get("Bridge-Tx-Size"))
			require.Equal(t, uint32(i), m.Pos.Seq)
			require.Equal(t, float64(i+1), m.Body["after"].(map[string]any)["n"])
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
