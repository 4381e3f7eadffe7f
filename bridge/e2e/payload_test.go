package e2e_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks/natsjs"
)

// sweepSink is one sink configuration of TestPayloadBoundarySweep.
type sweepSink struct {
	name          string // source, sink and stream suffix
	fenced        bool   // expect_last_sequence
	atomic        bool   // atomic_transactions
	bucket, dlq   bool   // large_payload_bucket, dead_letter_subject
	stream, dlSub string
}

// TestPayloadBoundarySweep writes rows through a real bridge whose NATS
// server has a small max_payload, their messages (headers and payload)
// sized from the limit − 2,000 bytes to just past it in 40-byte steps, and
// in 4-byte steps around the limit, in transactions of three. One bridge
// runs twelve sources over the same table, one per sink configuration: the
// fence on and off, atomic transactions on and off, and a large-payload
// bucket, a dead-letter subject or both. The bridge is killed with SIGKILL
// twice while it publishes. Every row must arrive in every stream exactly
// once and in order: inline exactly when its whole message fits, else in
// the object store (bucket, or both) or as a dead letter (dead-letter
// subject only), and the bridge must still run at the end. A size check
// that leaves out a header the publish adds stops the bridge at the first
// such row, and again after every restart. 32 KiB by default; 1 MiB (the
// nats-server default) with TEST_LONG=1.
func TestPayloadBoundarySweep(t *testing.T) {
	defer parallelLong(t)()
	limit := 32 << 10
	if long() {
		limit = 1 << 20
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	e.stopNATS()
	e.nsOpts.MaxPayload = int32(limit)
	e.startNATS()
	e.pg.ExecT(t, `CREATE TABLE sweep (id int PRIMARY KEY, body text)`)

	var sks []*sweepSink
	for _, fenced := range []bool{true, false} {
		for _, atomic := range []bool{false, true} {
			for _, d := range []struct {
				name        string
				bucket, dlq bool
			}{{"bucket", true, false}, {"dlq", false, true}, {"both", true, true}} {
				name := fmt.Sprintf("f%d_a%d_%s", b2i(fenced), b2i(atomic), d.name)
				sks = append(sks, &sweepSink{name: name, fenced: fenced, atomic: atomic, bucket: d.bucket, dlq: d.dlq,
					stream: "SWEEP_" + name, dlSub: "sweep." + name + ".dead"})
			}
		}
	}
	cfg := sweepConfig(t, e, sks)
	p := startZProc(t, bin, cfg)
	for _, sk := range sks {
		waitSlotActive(t, e, "slot_"+sk.name)
	}

	// Calibration: the message of a row with an empty body, in a sink that
	// adds no header of its own (unfenced, message by message), gives the
	// size of everything but the body.
	e.pg.ExecT(t, `INSERT INTO sweep VALUES (0, '')`)
	var plain *sweepSink
	for _, sk := range sks {
		if !sk.fenced && !sk.atomic {
			plain = sk
		}
	}
	cal := e.waitCount(plain.stream, 1, time.Minute)[0]
	overhead := natsconn.HeaderSize(cal.Header) + len(cal.Raw)
	t.Logf("max_payload %d; a row's message without its body: %d bytes", limit, overhead)

	// Message sizes: limit-2000 .. limit+200 every 40 bytes, and every 4
	// bytes from limit-160 to limit+40; body = size - overhead (ids and
	// headers vary by a few bytes).
	sizes := map[int]bool{}
	for s := limit - 2000; s <= limit+200; s += 40 {
		sizes[s] = true
	}
	for s := limit - 160; s <= limit+40; s += 4 {
		sizes[s] = true
	}
	var bodies []int
	for s := range sizes {
		bodies = append(bodies, s-overhead)
	}
	slices.Sort(bodies)
	// Transactions of three rows (atomic batches where asked), committed in
	// three parts with a SIGKILL of the bridge while it publishes each of
	// the first two.
	want := []int{0}
	conn := e.pg.Conn(t, "")
	insert := func(from, to int) {
		for i := from; i < to; i += 3 {
			tx, err := conn.Begin(t.Context())
			require.NoError(t, err)
			for k := i; k < min(i+3, to); k++ {
				_, err := tx.Exec(t.Context(), `INSERT INTO sweep VALUES ($1, repeat('x', $2))`, k+1, bodies[k])
				require.NoError(t, err)
				want = append(want, k+1)
			}
			require.NoError(t, tx.Commit(t.Context()))
		}
	}
	third := len(bodies) / 3 / 3 * 3
	for part, end := range []int{third, 2 * third, len(bodies)} {
		insert(part*third, end)
		if part == 2 {
			break
		}
		time.Sleep(time.Duration(100+rand.N(400)) * time.Millisecond)
		p.signal(t, syscall.SIGKILL)
		<-p.done
		t.Logf("killed the bridge after committing %d rows", end+1)
		p = startZProc(t, bin, cfg)
	}

	// Every stream holds every row once, in order, each as its config says.
	pos := map[cdc.Pos]int{} // position → row id, the same in every stream
	held := map[string][]cdc.Pos{}
	for _, sk := range sks {
		// Fail at once when the bridge stops (a refused change stops it).
		deadline := time.Now().Add(3 * time.Minute)
		for storedCount(t, e, sk.stream) < uint64(len(want)) {
			select {
			case <-p.done:
				t.Fatalf("the bridge stopped before %s held every row:\n%s", sk.stream, lastLines(p.out.String(), 5))
			case <-time.After(50 * time.Millisecond):
			}
			require.True(t, time.Now().Before(deadline), "%s holds %d rows after 3 minutes, want %d", sk.stream, storedCount(t, e, sk.stream), len(want))
		}
		ms := e.messages(sk.stream)
		require.Len(t, ms, len(want), "stream %s", sk.stream)
		checkOrdered(t, ms)
		for _, m := range ms {
			held[sk.name] = append(held[sk.name], m.Pos)
		}
		// The fence is on or off as configured: every publish (the first
		// message of an atomic batch) expects the sequence before it.
		for i, m := range ms {
			switch {
			case !sk.fenced:
				require.Empty(t, m.Header.Get("Nats-Expected-Last-Sequence"), "%s seq %d", sk.stream, m.Seq)
				require.Empty(t, m.Header.Get("Nats-Expected-Last-Msg-Id"), "%s seq %d", sk.stream, m.Seq)
			case i == 0:
				require.Equal(t, "0", m.Header.Get("Nats-Expected-Last-Sequence"), "%s seq %d", sk.stream, m.Seq)
			case m.Header.Get("Nats-Batch-Sequence") == "" || m.Header.Get("Nats-Batch-Sequence") == "1":
				require.True(t, fencedAfter(m, ms[i-1]), "%s seq %d: %v", sk.stream, m.Seq, m.Header)
			}
		}
		inline, offloaded, dead := checkSweep(t, e, sk, ms, limit, pos)
		t.Logf("%s: %d rows inline, %d offloaded, %d dead-lettered", sk.name, inline, offloaded, dead)
		require.NotZero(t, inline, sk.name)
		switch {
		case sk.bucket: // the bucket takes what does not fit, with or without a dead-letter subject
			require.NotZero(t, offloaded, sk.name)
			require.Zero(t, dead, sk.name)
		default:
			require.NotZero(t, dead, sk.name)
			require.Zero(t, offloaded, sk.name)
		}
	}
	var got []int
	for _, id := range pos {
		got = append(got, id)
	}
	slices.Sort(got)
	require.Equal(t, want, got, "every row, each at one position")
	for name, ps := range held {
		for _, ps2 := range ps {
			_, ok := pos[ps2]
			require.True(t, ok, name)
		}
		require.Len(t, ps, len(pos), "%s holds every position once", name)
	}
	select {
	case <-p.done:
		t.Fatalf("the bridge stopped:\n%s", lastLines(p.out.String(), 30))
	default:
	}
	require.NotContains(t, p.out.String(), "pipeline stopped")
	require.NotContains(t, p.out.String(), "maximum payload exceeded")
	p.signal(t, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the bridge did not stop within 30 s of SIGTERM")
	}
	require.Zero(t, p.cmd.ProcessState.ExitCode(), "exit status after SIGTERM")
}

// sweepConfig writes the bridge.yaml of TestPayloadBoundarySweep: a source,
// a sink and a route per sweepSink, all on table sweep.
func sweepConfig(t *testing.T, e *env, sks []*sweepSink) string {
	t.Helper()
	srcs, snks := map[string]any{}, map[string]any{}
	var routes []any
	for _, sk := range sks {
		srcs[sk.name] = map[string]any{"type": "pgoutput", "config": map[string]any{
			"dsn": e.pg.DSN(""), "slot": "slot_" + sk.name, "publication": "pub_" + sk.name, "tables": []any{"public.sweep"}}}
		c := map[string]any{"stream": sk.stream, "subjects": []any{"sweep." + sk.name + ".>"}, "duplicate_window": "1s",
			"expect_last_sequence": sk.fenced, "atomic_transactions": sk.atomic}
		if sk.bucket {
			c["large_payload_bucket"] = "big_" + sk.name
		}
		if sk.dlq {
			c["dead_letter_subject"] = sk.dlSub
		}
		snks[sk.name] = map[string]any{"type": "nats_jetstream", "config": c}
		routes = append(routes, map[string]any{"match": map[string]any{"sources": []any{sk.name}}, "sinks": []any{sk.name},
			"subject": "sweep." + sk.name + ".{{.Schema}}.{{.Table}}"})
	}
	y := map[string]any{
		"name":       "sweep",
		"data_dir":   filepath.Join(e.dir, "data"),
		"nats":       map[string]any{"url": e.natsURL()},
		"checkpoint": map[string]any{"interval": "200ms"},
		"http":       map[string]any{"listen": "127.0.0.1:0"},
		"sources":    srcs,
		"sinks":      snks,
		"routes":     routes,
	}
	out, err := yaml.Marshal(y)
	require.NoError(t, err)
	p := filepath.Join(e.dir, "sweep.yaml")
	require.NoError(t, os.WriteFile(p, out, 0o644))
	return p
}

// checkSweep checks each message of sk's stream: inline exactly when the
// whole message fits limit, else offloaded or dead-lettered, carrying (or
// pointing to) the row's payload. It records each message's row id under
// its position in pos (which must agree across streams) and returns how
// many went each way.
func checkSweep(t *testing.T, e *env, sk *sweepSink, ms []msg, limit int, pos map[cdc.Pos]int) (inline, offloaded, dead int) {
	t.Helper()
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	rowID := func(payload []byte) int {
		var body map[string]any
		require.NoError(t, json.Unmarshal(payload, &body))
		return int(body["after"].(map[string]any)["id"].(float64))
	}
	for _, m := range ms {
		where := fmt.Sprintf("%s seq %d (%s)", sk.stream, m.Seq, m.ID)
		id := -1
		var inl int // the message's size had it been sent inline
		switch {
		case m.Header.Get(natsjs.HeaderPayloadObject) != "":
			offloaded++
			require.True(t, sk.bucket, where)
			ref := m.Header.Get(natsjs.HeaderPayloadObject)
			bucket, name, _ := strings.Cut(ref, "/")
			require.Equal(t, m.ID, name, where)
			obs, err := js.ObjectStore(t.Context(), bucket)
			require.NoError(t, err, where)
			payload, err := obs.GetBytes(t.Context(), name)
			require.NoError(t, err, where)
			require.Equal(t, strconv.Itoa(len(payload)), m.Header.Get(natsjs.HeaderPayloadBytes), where)
			id = rowID(payload)
			inl = natsconn.HeaderSize(without(m.Header, natsjs.HeaderPayloadObject, natsjs.HeaderPayloadBytes)) + len(payload)
		case m.Header.Get(natsjs.HeaderDeadLetterReason) != "":
			dead++
			require.True(t, sk.dlq && !sk.bucket, where)
			require.Equal(t, sk.dlSub, m.Subject, where)
			require.Contains(t, m.Header.Get(natsjs.HeaderDeadLetterReason), "max_payload", where)
			require.Equal(t, "sweep."+sk.name+".public.sweep", m.Header.Get(natsjs.HeaderOriginalSubject), where)
			n := len(m.Raw)
			if n == 0 {
				n, err = strconv.Atoi(m.Header.Get(natsjs.HeaderPayloadBytes))
				require.NoError(t, err, where)
			} else {
				id = rowID(m.Raw)
			}
			inl = natsconn.HeaderSize(without(m.Header, natsjs.HeaderDeadLetterReason, natsjs.HeaderOriginalSubject, natsjs.HeaderPayloadBytes)) + n
		default:
			inline++
			require.Equal(t, "sweep."+sk.name+".public.sweep", m.Subject, where)
			id = rowID(m.Raw)
			require.LessOrEqual(t, natsconn.HeaderSize(m.Header)+len(m.Raw), limit, where)
		}
		if inl > 0 {
			require.Greater(t, inl, limit, "%s: diverted though its message, %d bytes, fits", where, inl)
		}
		if id >= 0 {
			if prev, ok := pos[m.Pos]; ok {
				require.Equal(t, prev, id, "%s: another row at this position in another stream", where)
			}
			pos[m.Pos] = id
		} else {
			_, ok := pos[m.Pos]
			require.True(t, ok, "%s: a dead letter without payload whose row no other stream names", where)
		}
	}
	return inline, offloaded, dead
}

// without returns a copy of h without keys.
func without(h nats.Header, keys ...string) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		out[k] = v
	}
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
