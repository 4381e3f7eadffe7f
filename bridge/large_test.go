package bridge_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLargeTransactionSpills streams one transaction far larger than the
// in-memory limit (spill_changes: 1000) through a bridge process that is
// killed with SIGKILL halfway: every row arrives once, in order, with the
// transaction's size. TEST_LONG=1 makes it 1 million rows. The bridge's
// peak RSS is logged.
func TestLargeTransactionSpills(t *testing.T) {
	rows := 30000
	if os.Getenv("TEST_LONG") != "" {
		rows = 1000000
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE big (id bigserial PRIMARY KEY, n int, pad text)`)
	cfg := e.config("large", "      spill_changes: 1000")
	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_large")
	e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO big (n, pad) SELECT i, repeat(md5(i::text), 6) FROM generate_series(1, %d) i`, rows))

	e.waitStored("CDC_large", rows/3, 5*time.Minute)
	p.kill9(t)
	p = startProc(t, bin, cfg)
	ms := e.waitCount("CDC_large", rows, 10*time.Minute)
	peak := peakRSS(t, p.cmd.Process.Pid)
	p.term(t)
	require.Len(t, ms, rows)
	checkOrdered(t, ms)
	for i, m := range ms {
		require.Equal(t, strconv.Itoa(rows), m.Header.Get("Bridge-Tx-Size"))
		require.Equal(t, uint32(i), m.Pos.Seq)
		require.Equal(t, float64(i+1), m.Body["after"].(map[string]any)["n"])
	}
	t.Logf("one transaction of %d rows: bridge peak RSS after the restart %d MiB", rows, peak>>20)
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
