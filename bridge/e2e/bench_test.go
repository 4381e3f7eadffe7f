package e2e_test

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// BenchmarkBacklog measures changes/s into JetStream from a backlog waiting
// in the slot: 100k single-row transactions, and one 100k-row transaction.
// Each iteration is a whole run on a fresh Postgres and NATS; run it with
//
//	go test -run '^$' -bench Backlog -benchtime 1x ./bridge/
//
// BENCH_ROWS changes the size. cpu-µs/change is this process's CPU time per
// change: the bridge and the in-process nats-server together (Postgres runs
// apart). A CPU profile of the same run:
//
//	go test -run '^$' -bench Backlog -benchtime 1x -cpuprofile cpu.out ./bridge/
//	go run ./bench/cmd/profstages -changes 100000 cpu.out
//
// scripts/bench.sh measures the bridge binary against a nats-server process
// and Postgres' and JetStream's own limits (docs/performance.md).
func BenchmarkBacklog(b *testing.B) {
	rows := envInt("BENCH_ROWS", 100000)
	for _, tc := range []struct {
		name string
		load string
	}{
		{"single-row-txns", fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP INSERT INTO bench (n, pad) VALUES (i, repeat('x', 200)); COMMIT; END LOOP; END $$`, rows)},
		{"one-big-txn", fmt.Sprintf(`INSERT INTO bench (n, pad) SELECT i, repeat('x', 200) FROM generate_series(1, %d) i`, rows)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				e := newEnv(b)
				name := fmt.Sprintf("bench%d", i)
				cfg := e.config(name, "")
				e.pg.ExecT(b, `CREATE TABLE bench (id bigserial PRIMARY KEY, n int, pad text)`,
					fmt.Sprintf(`CREATE PUBLICATION pub_%s FOR ALL TABLES`, name),
					fmt.Sprintf(`SELECT pg_create_logical_replication_slot('slot_%s', 'pgoutput')`, name))
				start := time.Now()
				e.pg.ExecT(b, tc.load)
				b.Logf("loaded %d rows in %s", rows, time.Since(start))
				b.StartTimer()
				start = time.Now()
				cpu0 := processCPU()
				r := e.start(cfg)
				e.waitStored("CDC_"+name, rows, 10*time.Minute)
				el := time.Since(start)
				cpu := processCPU() - cpu0
				b.StopTimer()
				r.stop(e.t)
				// Counts are verified: every change stored once, in order.
				ms := e.messages("CDC_" + name)
				if len(ms) != rows {
					b.Fatalf("stream holds %d messages, want %d", len(ms), rows)
				}
				checkOrdered(b, ms)
				b.ReportMetric(float64(rows)/el.Seconds(), "changes/s")
				b.ReportMetric(float64(cpu.Microseconds())/float64(rows), "cpu-µs/change")
				b.Logf("%s: %d changes in %s = %.0f changes/s", tc.name, rows, el, float64(rows)/el.Seconds())
			}
		})
	}
}

var getenv = os.Getenv

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func envInt(name string, def int) int {
	var v int
	if _, err := fmt.Sscan(getenv(name), &v); err == nil && v > 0 {
		return v
	}
	return def
}
