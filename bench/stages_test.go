package bench_test

// Stage benchmarks: the bridge's hot path one stage at a time, each with the
// CPU time of this process per change (getrusage), so the stages add up to
// what the whole bridge spends per change (cmd/benchrun).
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/                    # all stages
//	go test -run '^$' -bench Route -benchtime 200000x -cpuprofile cpu.out ./bench/
//
// Source reads a backlog of BENCH_ROWS single-row transactions through the
// pgoutput source (replication protocol receive, pgoutput parse, pgtypes
// decode, transaction buffer); Postgres' own work happens in the walsender,
// another process. Route runs the router (subject template, native JSON).
// Publish writes routed changes in batches of 1000 through the
// nats_jetstream sink to a nats-server process (BENCH_NATS_SERVER or
// nats-server on PATH; else an in-process server, whose CPU then counts);
// BENCH_FAST=1 BENCH_ATOMIC=0 publishes fast-ingest batches (fast_batch).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bridgecdc/bridge/bench"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	_ "github.com/bridgecdc/bridge/plugins"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func report(b *testing.B, n int, wall, cpu time.Duration) {
	b.ReportMetric(float64(n)/wall.Seconds(), "changes/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/change")
}

func BenchmarkSource(b *testing.B) {
	rows := envInt("BENCH_ROWS", 100000)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// Not b.TempDir: its parent is private, and the postgres OS user
		// must traverse the path when the benchmark runs as root.
		dir, err := os.MkdirTemp("", "bench-source-")
		if err != nil {
			b.Fatal(err)
		}
		_ = os.Chmod(dir, 0o755)
		b.Cleanup(func() { os.RemoveAll(dir) })
		ctx := context.Background()
		pg, err := bench.StartPG(ctx, dir, 16)
		if err != nil {
			b.Fatal(err)
		}
		if err := pg.CreateSlot(ctx, "stage", "pgoutput"); err != nil {
			b.Fatal(err)
		}
		if _, err := pg.LoadSingle(ctx, rows); err != nil {
			b.Fatal(err)
		}
		p, err := sources.Default.Lookup("pgoutput")
		if err != nil {
			b.Fatal(err)
		}
		src, err := p.New((*config.Config)(nil).Decoder("sources.app.config", map[string]any{
			"dsn": pg.Server.DSN(""), "slot": "stage", "create_slot": false,
			"publication": bench.Publication, "create_publication": false,
		}), sources.Env{Name: "app"})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start, cpu0 := time.Now(), selfCPU()
		if err := src.Open(ctx, 0); err != nil {
			b.Fatal(err)
		}
		got := 0
		for got < rows {
			t, err := src.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			got += len(t.Changes)
			if t.Rest != nil {
				buf := make([]cdc.Change, 1000)
				for {
					n, err := t.Rest.Next(buf)
					got += n
					if err != nil {
						break
					}
				}
				t.Rest.Close()
			}
		}
		wall, cpu := time.Since(start), selfCPU()-cpu0
		b.StopTimer()
		_ = src.Close(ctx)
		pg.Close()
		report(b, rows, wall, cpu)
	}
}

// benchChange is a change as the pgoutput source makes it from a row of the
// benchmark's table (id bigserial, n int, pad text).
func benchChange(i int) cdc.Change {
	rel := &cdc.Relation{ID: 16384, Schema: "public", Table: "bench", ReplicaIdentity: 'd', Columns: []cdc.Column{
		{Name: "id", Type: "int8", OID: 20, Key: true}, {Name: "n", Type: "int4", OID: 23}, {Name: "pad", Type: "text", OID: 25}}}
	return cdc.Change{Producer: "bench.app.akvj4q85", Source: "app", Database: "postgres",
		CommitLSN: cdc.LSN(0x1507B88 + i*200), LSN: cdc.LSN(0x1507B00 + i*200), Seq: 0, TxSize: 1, Xid: uint32(726 + i),
		CommitTime: time.Date(2026, 12, 2, 18, 25, 14, 973224000, time.UTC), Schema: "public", Table: "bench", Op: cdc.OpInsert, Rel: rel,
		After: []any{int64(i + 1), int64(i), strings.Repeat("x", 16)}}
}

func newRouter(b *testing.B) *route.Router {
	r, err := route.New(&config.Config{Unrouted: "drop", Routes: []config.Route{
		{Sinks: []string{"js"}, Subject: "bench.{{.Schema}}.{{.Table}}"},
	}}, map[string]int{"js": 0}, "")
	if err != nil {
		b.Fatal(err)
	}
	return r
}

func BenchmarkRoute(b *testing.B) {
	routeChanges(b, newRouter(b), benchChange)
}

// routeChanges routes b.N changes made by change, 1024 of them in turn, and
// reports the rate and the CPU time per change.
func routeChanges(b *testing.B, r *route.Router, change func(int) cdc.Change) {
	cs := make([]cdc.Change, 1024)
	for i := range cs {
		cs[i] = change(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), selfCPU()
	for i := 0; i < b.N; i++ {
		c := cs[i%len(cs)]
		if _, _, err := r.Route(&c); err != nil {
			b.Fatal(err)
		}
	}
	report(b, b.N, time.Since(start), selfCPU()-cpu0)
}

// wideRel is a ten-column orders table; the changes of one table share
// their relation, as a source's do.
var wideRel = &cdc.Relation{ID: 16390, Schema: "public", Table: "orders", ReplicaIdentity: 'd', Columns: []cdc.Column{
	{Name: "id", Type: "int8", OID: 20, Key: true}, {Name: "status", Type: "text", OID: 25},
	{Name: "total", Type: "numeric", OID: 1700}, {Name: "email", Type: "varchar", OID: 1043},
	{Name: "password_hash", Type: "text", OID: 25}, {Name: "tenant_id", Type: "int4", OID: 23},
	{Name: "note", Type: "text", OID: 25}, {Name: "created_at", Type: "timestamptz", OID: 1184},
	{Name: "qty", Type: "int4", OID: 23}, {Name: "ship_to", Type: "text", OID: 25}}}

// wideChange is an update of a row of wideRel; the filter of
// BenchmarkRouteShaping takes every one, so each is encoded.
func wideChange(i int) cdc.Change {
	status := [...]string{"paid", "shipped"}[i%2]
	return cdc.Change{Producer: "bench.app.akvj4q85", Source: "app", Database: "postgres",
		CommitLSN: cdc.LSN(0x1507B88 + i*200), LSN: cdc.LSN(0x1507B00 + i*200), TxSize: 1, Xid: uint32(726 + i),
		CommitTime: time.Date(2026, 12, 2, 18, 25, 14, 973224000, time.UTC), Schema: "public", Table: "orders", Op: cdc.OpUpdate, Rel: wideRel,
		After: []any{int64(i + 1), status, cdc.Numeric(strconv.Itoa(150+i%200) + ".25"), "user" + strconv.Itoa(i) + "@example.com",
			"$2b$12$abcdefghijklmnopqrstuv", int64(i % 17), "leave at the door", time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC),
			int64(1 + i%5), "1 Main Street, Springfield"}}
}

// BenchmarkRouteShaping routes updates of a ten-column row: shape=plain
// with no shaping, filter with a three-clause filter, filter+mask with
// that filter, an excluded column, a hashed and a redacted one. Compare
// the per-change cost with benchstat -col /shape.
func BenchmarkRouteShaping(b *testing.B) {
	filter := `op != "delete" && after.status in ["paid", "shipped"] && after.total > 100.0`
	for _, c := range []struct {
		name  string
		route config.Route
	}{
		{"plain", config.Route{}},
		{"filter", config.Route{Filter: filter}},
		{"filter+mask", config.Route{Filter: filter,
			Columns: []config.Columns{{Exclude: []string{"password_hash"}}},
			Mask:    []config.Mask{{Hash: []string{"email"}, HashKey: "0123456789abcdef0123456789abcdef", Redact: []string{"ship_to"}}}}},
	} {
		b.Run("shape="+c.name, func(b *testing.B) {
			rc := c.route
			rc.Sinks, rc.Subject = []string{"js"}, "bench.{{.Schema}}.{{.Table}}"
			r, err := route.New(&config.Config{Unrouted: "drop", Routes: []config.Route{rc}}, map[string]int{"js": 0}, "")
			if err != nil {
				b.Fatal(err)
			}
			routeChanges(b, r, wideChange)
		})
	}
}

func natsServer(b *testing.B) (url string, pid int) {
	bin := os.Getenv("BENCH_NATS_SERVER")
	if bin == "" {
		bin, _ = exec.LookPath("nats-server")
	}
	dir := b.TempDir()
	if bin != "" {
		ns, err := bench.StartNATSServer(context.Background(), bin, dir)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(ns.Stop)
		return ns.URL(), ns.PID()
	}
	port, _ := bench.FreePort()
	s, err := natsembed.Start(natsembed.Options{Port: port, StoreDir: filepath.Join(dir, "nats")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return fmt.Sprintf("nats://127.0.0.1:%d", port), 0
}

func BenchmarkPublish(b *testing.B) {
	url, pid := natsServer(b)
	if pid == 0 {
		b.Log("no nats-server binary (BENCH_NATS_SERVER): the in-process server's CPU counts as the sink's")
	}
	n := envInt("BENCH_ROWS", 100000)
	batch := envInt("BENCH_BATCH", 1000)
	r := newRouter(b)
	cs := make([]cdc.Change, n)
	for i := range cs {
		cs[i] = benchChange(i)
		if _, _, err := r.Route(&cs[i]); err != nil {
			b.Fatal(err)
		}
	}
	p, err := sinks.Default.Lookup("nats_jetstream")
	if err != nil {
		b.Fatal(err)
	}
	sk, err := p.New((*config.Config)(nil).Decoder("sinks.js.config", map[string]any{
		"url": url, "stream": "STAGE", "subjects": []any{"bench.>"}, "atomic_transactions": os.Getenv("BENCH_ATOMIC") != "0",
		"fast_batch": os.Getenv("BENCH_FAST") == "1", "expect_last_sequence": os.Getenv("BENCH_FAST") != "1",
	}), sinks.Env{Name: "js"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := sk.Connect(ctx); err != nil {
		b.Fatal(err)
	}
	defer sk.Close(ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// Each round is a new producer position range: no duplicates.
		for j := range cs {
			cs[j].Producer = fmt.Sprintf("bench.app.round%d", i)
		}
		b.StartTimer()
		var ns0 bench.CPU
		if pid != 0 {
			ns0, _ = bench.ReadCPU(pid)
		}
		start, cpu0 := time.Now(), selfCPU()
		for lo := 0; lo < len(cs); lo += batch {
			if err := sk.Write(ctx, cs[lo:min(lo+batch, len(cs))]); err != nil {
				b.Fatal(err)
			}
		}
		wall, cpu := time.Since(start), selfCPU()-cpu0
		b.StopTimer()
		if pid != 0 {
			ns1, _ := bench.ReadCPU(pid)
			b.ReportMetric(float64((ns1.Self-ns0.Self).Microseconds())/float64(n), "server-cpu-µs/change")
		}
		report(b, n, wall, cpu)
	}
}
