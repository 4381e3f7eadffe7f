package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/wasmtest"
)

// wasmConfig writes e's bridge.yaml for source "app" with routes (YAML,
// indented as list items under routes:) instead of the default route.
func wasmConfig(t *testing.T, e *env, name, routes string) string {
	cfg := e.config(name, "")
	y, err := os.ReadFile(cfg)
	require.NoError(t, err)
	i := strings.Index(string(y), "routes:\n")
	require.Positive(t, i)
	require.NoError(t, os.WriteFile(cfg, append(y[:i:i], "routes:\n"+routes...), 0o644))
	return cfg
}

// TestWASMKillMidStream publishes orders through the AssemblyScript filter
// example (paid orders, as rows without the email column) and the Go
// transform example (the rest as events; drafts dropped) while the bridge
// is killed with SIGKILL and restarted, with a 1 s duplicate window, and
// finds every paid and shipped order exactly once, shaped, and no draft.
func TestWASMKillMidStream(t *testing.T) {
	defer parallelLong(t)()
	bin := bridgeBinary(t)
	asf, gt := wasmtest.ASFilter(t), wasmtest.GoTransform(t)
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, total numeric(12,2) NOT NULL, email text)`)
	cfg := wasmConfig(t, e, "wasm", fmt.Sprintf(`  - sinks: [js]
    match: { tables: [public.orders] }
    columns: [{ exclude: [email] }]
    subject: "cdc.wasm.paid.{{.Key.id}}"
    wasm_filter: { module: %s, sha256: "%s" }
  - sinks: [js]
    match: { tables: [public.orders], ops: [insert] }
    columns: [{ exclude: [email] }]
    subject: "cdc.wasm.events.{{.Out.event}}.{{.Key.id}}"
    wasm_transform: { module: %s, sha256: "%s" }
`, asf, wasmtest.SHA256(t, asf), gt, wasmtest.SHA256(t, gt)))

	p := startProc(t, bin, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last bridge's output:\n%s", p.out)
		}
	})
	waitSlotActive(t, e, "slot_wasm")

	statuses := []string{"paid", "shipped", "draft"}
	const orders = 2400
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, e.pg.DSN(""))
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			for id := 1; id <= orders; id += 3 { // three orders a transaction
				b := &pgx.Batch{}
				b.Queue(`BEGIN`)
				for k := id; k < id+3; k++ {
					b.Queue(`INSERT INTO orders VALUES ($1, $2, $3, $4)`, k, statuses[k%3], fmt.Sprintf("%d.25", k), fmt.Sprintf("u%d@example.com", k))
				}
				b.Queue(`COMMIT`)
				if err := conn.SendBatch(ctx, b).Close(); err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
			}
			return nil
		}()
	}()
	want := orders * 2 / 3 // paid and shipped
	// Each run publishes something before it is killed (mid-stream, not
	// while it starts), until the stream is complete.
	kills := 0
	var held uint64
	var atKills []uint64 // what the stream held at each kill
	lastStart := time.Now()
	for writing := true; writing || kills < 3; {
		if held < uint64(want) {
			e.waitStored("CDC_wasm", int(held)+1, time.Minute)
		}
		time.Sleep(time.Duration(rand.N(500)) * time.Millisecond)
		p.kill9(t)
		held = e.storedCount("CDC_wasm")
		atKills = append(atKills, held)
		kills++
		lastStart = time.Now()
		p = startProc(t, bin, cfg)
		select {
		case err := <-done:
			require.NoError(t, err)
			writing = false
		default:
		}
	}
	t.Logf("killed the bridge %d times while %d orders were committed; the stream held %v messages at the kills", kills, orders, atKills)
	ms := e.waitCount("CDC_wasm", want, time.Minute)
	seen := map[string]int{}
	for _, m := range ms {
		seen[m.Subject]++
		require.NotContains(t, string(m.Raw), "@example.com", "the email column never leaves: %s", m.Subject)
	}
	for id := 1; id <= orders; id++ {
		switch statuses[id%3] {
		case "paid":
			subj := fmt.Sprintf("cdc.wasm.paid.%d", id)
			require.Equal(t, 1, seen[subj], subj)
		case "shipped":
			subj := fmt.Sprintf("cdc.wasm.events.order_insert.%d", id)
			require.Equal(t, 1, seen[subj], subj)
		}
	}
	require.Len(t, ms, want, "no draft, nothing twice")
	for _, m := range ms {
		if strings.HasPrefix(m.Subject, "cdc.wasm.events.") {
			id := m.Body["order_id"].(float64)
			require.Equal(t, map[string]any{"event": "order.insert", "order_id": id, "status": "shipped", "total_cents": id*100 + 25}, m.Body)
		} else {
			require.Equal(t, "paid", m.Body["after"].(map[string]any)["status"])
		}
	}
	checkOrdered(t, ms)
	// The last bridge may still be starting when everything was already
	// stored (SIGTERM before its signal handler is set kills it outright):
	// wait until it streams, from a walsender that started after it.
	conn := e.pg.Conn(t, "")
	require.Eventually(t, func() bool {
		var n int
		_ = conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = 'slot_wasm' AND a.backend_start > $1`, lastStart).Scan(&n)
		return n == 1
	}, time.Minute, 50*time.Millisecond, "the last bridge never streamed")
	p.term(t)
}

// TestWASMTrapStopsAtTheChange: a module that traps on a change stops the
// bridge with one error naming the route, the module, the table and the
// LSN; the change is not acknowledged to Postgres, so the bridge started
// with the module fixed publishes it.
func TestWASMTrapStopsAtTheChange(t *testing.T) {
	defer parallel(t)()
	bin := bridgeBinary(t)
	guest := wasmtest.GoModule(t, filepath.Join(wasmtest.Root(t), "bridge", "wasm", "testdata", "guest"))
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)`)
	route := func(key, fn string) string {
		return fmt.Sprintf(`  - sinks: [js]
    subject: "cdc.trap.{{.Table}}"
    %s: { module: %s, sha256: "%s", function: %s }
`, key, guest, wasmtest.SHA256(t, guest), fn)
	}
	cfg := wasmConfig(t, e, "trap", route("wasm_filter", "boom"))
	p := startProc(t, bin, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the bridge's output:\n%s", p.out)
		}
	})
	waitSlotActive(t, e, "slot_trap")
	var lsn string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(),
		`WITH i AS (INSERT INTO orders VALUES (1, 'paid') RETURNING 1) SELECT pg_current_wal_insert_lsn()::text FROM i`).Scan(&lsn))

	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case err := <-exited:
		require.Error(t, err, "the bridge exits with an error")
	case <-time.After(2 * time.Minute):
		t.Fatalf("the bridge did not stop on the trap:\n%s", p.out)
	}
	out := p.out.String()
	require.Regexp(t, `routes\[0\]\.wasm_filter on public\.orders \(insert at commit LSN [0-9A-F]+/[0-9A-F]+, change 1 of the transaction\): wasm module `+
		regexp.QuoteMeta(guest)+`: boom (trapped|exited)[^\n]*panic: boom`, out)

	var confirmed string
	require.NoError(t, e.pg.Conn(t, "").QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'slot_trap'`).Scan(&confirmed))
	c, err := cdc.ParseLSN(confirmed)
	require.NoError(t, err)
	l, err := cdc.ParseLSN(lsn)
	require.NoError(t, err)
	require.Less(t, uint64(c), uint64(l), "the change that failed is not acknowledged")

	require.NoError(t, os.WriteFile(cfg, nil, 0o644))
	cfg = wasmConfig(t, e, "trap", route("wasm_transform", "echo")) // returns the change it is given
	p = startProc(t, bin, cfg)
	ms := e.waitCount("CDC_trap", 1, time.Minute)
	require.Equal(t, "cdc.trap.orders", ms[0].Subject)
	require.Equal(t, "paid", ms[0].Body["after"].(map[string]any)["status"])
	p.term(t)
}

// TestPluginsListsWASM: `bridge plugins` lists the routes' WebAssembly
// modules as a run loads them: a module that loads with its function and
// limits, one whose sum is not the pinned one with the error and the fix,
// one whose file is missing with its path; none when no route has one.
func TestPluginsListsWASM(t *testing.T) {
	defer parallel(t)()
	asf, gt := wasmtest.ASFilter(t), wasmtest.GoTransform(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bridge.yaml")
	bad := strings.Repeat("0", 64)
	missing := filepath.Join(dir, "nosuch.wasm")
	const head = `name: p
sources:
  app: { type: pgoutput, config: { dsn: "postgres://localhost/x", slot: s, publication: p } }
sinks:
  js: { type: nats_jetstream, config: { stream: S, subjects: ["s.>"] } }
routes:
  - sinks: [js]
`
	require.NoError(t, os.WriteFile(cfg, []byte(head+fmt.Sprintf(`    wasm_filter: { module: %s, sha256: "%s", timeout: 250ms, max_memory_mib: 32 }
  - sinks: [js]
    wasm_transform: { module: %s, sha256: "%s" }
  - sinks: [js]
    wasm_filter: { module: %s, sha256: "%s" }
`, asf, wasmtest.SHA256(t, asf), gt, bad, missing, bad)), 0o644))
	code, out, errs := execCLI(t, "plugins", "-c", cfg)
	require.Equal(t, 0, code, "%s\n%s", out, errs)
	_, list, ok := strings.Cut(out, "configured WebAssembly modules ("+cfg+"):\n")
	require.True(t, ok, out)
	lines := strings.Split(strings.TrimRight(list, "\n"), "\n")
	require.Len(t, lines, 3, list)
	require.Equal(t, fmt.Sprintf("  routes[0].wasm_filter: %q: filter, contract v1, sha256 matches, timeout 250ms per call, at most 32 MiB per instance", asf), lines[0])
	require.Contains(t, lines[1], fmt.Sprintf("  routes[1].wasm_transform: %q: error: routes[1].wasm_transform.sha256: ", gt))
	require.Contains(t, lines[1], wasmtest.SHA256(t, gt), "the fix names the module's sum")
	require.Contains(t, lines[2], fmt.Sprintf("  routes[2].wasm_filter: %q: error: routes[2].wasm_filter.module: ", missing))

	// No module: none.
	require.NoError(t, os.WriteFile(cfg, []byte(head), 0o644))
	code, out, _ = execCLI(t, "plugins", "-c", cfg)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "configured WebAssembly modules ("+cfg+"):\n  none\n")
}
