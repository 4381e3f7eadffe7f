package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/otlptest"
)

// appendYAML adds top-level sections to the config file at p.
func appendYAML(t testing.TB, p, y string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("\n" + y)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// appTracer is an application's tracer exporting to the receiver.
func appTracer(t *testing.T, recv *otlptest.Receiver, service string) (trace.Tracer, func()) {
	t.Helper()
	exp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(recv.HTTPURL+"/v1/traces"))
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	return tp.Tracer(service), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, tp.Shutdown(ctx))
	}
}

// TestTraceContinuityEndToEnd: an application span → its traceparent in a
// logical message of the same transaction as an INSERT → the bridge's
// transaction and change spans → the NATS message's traceparent header → a
// consumer's span; one trace, with the right parents, as an OTLP receiver
// got it.
func TestTraceContinuityEndToEnd(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	recv := otlptest.NewReceiver(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, item text)`)
	p := e.config("trace", "")
	appendYAML(t, p, fmt.Sprintf("telemetry:\n  tracing:\n    endpoint: %s\n", recv.HTTPURL))
	r := e.start(p)
	waitReady(t, r)

	app, flushApp := appTracer(t, recv, "shop-app")
	prop := propagation.TraceContext{}
	ctx, order := app.Start(context.Background(), "place order")
	carrier := propagation.MapCarrier{}
	prop.Inject(ctx, carrier)
	e.pg.ExecT(t, fmt.Sprintf(`BEGIN; SELECT pg_logical_emit_message(true, 'traceparent', '%s'); INSERT INTO orders VALUES (1, 'book'); COMMIT`,
		carrier["traceparent"]))
	order.End()

	// The JSON form, with a tracestate, after the row change.
	ctx2, restock := app.Start(context.Background(), "restock")
	restockTP := fmt.Sprintf("00-%s-%s-01", restock.SpanContext().TraceID(), restock.SpanContext().SpanID())
	e.pg.ExecT(t, fmt.Sprintf(`BEGIN; INSERT INTO orders VALUES (2, 'pen'); SELECT pg_logical_emit_message(true, 'traceparent', '{"traceparent": "%s", "tracestate": "shop=1"}'); COMMIT`, restockTP))
	restock.End()
	_ = ctx2
	// No context: a trace of its own.
	e.pg.ExecT(t, `INSERT INTO orders VALUES (3, 'ink')`)

	ms := e.waitCount("CDC_trace", 3, 30*time.Second)
	require.Len(t, ms, 3, "the trace context messages are consumed, not published")
	for _, m := range ms {
		require.Equal(t, "insert", m.Body["op"])
	}
	tp0 := ms[0].Header.Get("traceparent")
	require.Contains(t, tp0, order.SpanContext().TraceID().String())
	require.Contains(t, ms[1].Header.Get("traceparent"), restock.SpanContext().TraceID().String())
	require.Equal(t, "shop=1", ms[1].Header.Get("tracestate"))
	require.NotContains(t, ms[2].Header.Get("traceparent"), order.SpanContext().TraceID().String())

	// A consumer continues the trace from the message's headers.
	consumer, flushConsumer := appTracer(t, recv, "shop-consumer")
	cctx := prop.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp0, "tracestate": ms[0].Header.Get("tracestate")})
	_, process := consumer.Start(cctx, "process order", trace.WithSpanKind(trace.SpanKindConsumer))
	process.End()
	flushApp()
	flushConsumer()
	r.stop(t) // flushes the bridge's spans

	spans := recv.Spans()
	find := func(service, name, traceID string) otlptest.Span {
		t.Helper()
		for _, s := range spans {
			if s.Service == service && s.Name == name && s.TraceID == traceID {
				return s
			}
		}
		t.Fatalf("no %s span %q in trace %s among %+v", service, name, traceID, spans)
		return otlptest.Span{}
	}
	traceID := order.SpanContext().TraceID().String()
	appSpan := find("shop-app", "place order", traceID)
	txnSpan := find("bridge", "cdc app", traceID)
	change := find("bridge", "publish cdc.trace.public.orders", traceID)
	proc := find("shop-consumer", "process order", traceID)
	assert.Empty(t, appSpan.Parent)
	assert.Equal(t, appSpan.SpanID, txnSpan.Parent, "the transaction span continues the writer's span")
	assert.Equal(t, txnSpan.SpanID, change.Parent, "the change span is a child of the transaction span")
	assert.Equal(t, change.SpanID, proc.Parent, "the consumer continues the change span")
	assert.Equal(t, "SPAN_KIND_CONSUMER", txnSpan.Kind)
	assert.Equal(t, "SPAN_KIND_PRODUCER", change.Kind)
	assert.Equal(t, "STATUS_CODE_UNSET", change.StatusCode)
	assert.Equal(t, map[string]string{
		"db.system.name": "postgresql", "db.namespace": "postgres", "db.collection.name": "public.orders",
		"db.operation.name": "INSERT", "bridge.op": "insert", "messaging.system": "nats", "messaging.operation.type": "send",
		"messaging.destination.name": "cdc.trace.public.orders", "messaging.message.id": ms[0].ID,
		"bridge.commit_lsn": ms[0].Pos.LSN.String(), "bridge.seq": "1", "bridge.tx_size": "2",
	}, change.Attrs)
	assert.Equal(t, "2", txnSpan.Attrs["bridge.tx_size"])

	restockTxn := find("bridge", "cdc app", restock.SpanContext().TraceID().String())
	assert.Equal(t, restock.SpanContext().SpanID().String(), restockTxn.Parent)
	// The third transaction starts its own trace.
	own := prop.Extract(context.Background(), propagation.MapCarrier{"traceparent": ms[2].Header.Get("traceparent")})
	ownTxn := find("bridge", "cdc app", trace.SpanContextFromContext(own).TraceID().String())
	assert.Empty(t, ownTxn.Parent)
}

// scrape returns /metrics parsed.
func scrape(t testing.TB, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// metricValue returns the value of the first sample of name whose labels
// include labels, and whether there is one.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func httpStatus(t testing.TB, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsAndHealth scrapes /metrics after some changes and a forced
// reconnect, and checks /livez and /readyz around the start.
func TestMetricsAndHealth(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY, v text)`)
	p := e.config("metrics", "")
	appendYAML(t, p, "telemetry:\n  metrics:\n    slot_poll_interval: 100ms\n")
	cfg, err := config.Load(p)
	require.NoError(t, err)
	a, err := app.New(cfg, app.WithLogger(testLogger(t)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, a.Start(ctx))
	base := "http://" + a.HTTPAddr()
	code, _ := httpStatus(t, base+"/livez")
	require.Equal(t, http.StatusOK, code)
	code, body := httpStatus(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not streaming yet: %s", body)
	require.Contains(t, body, "app: not streaming")

	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Eventually(t, func() bool { c, _ := httpStatus(t, base+"/readyz"); return c == http.StatusOK }, 60*time.Second, 20*time.Millisecond)

	e.pg.ExecT(t,
		`BEGIN; INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c'); COMMIT`,
		`UPDATE items SET v = 'x' WHERE id = 1`,
		`DELETE FROM items WHERE id = 2`,
	)
	e.waitStored("CDC_metrics", 5, 30*time.Second)
	app := map[string]string{"source": "app"}
	var fams map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		fams = scrape(t, base)
		v, _ := metricValue(fams, "bridge_changes_delivered_total", app)
		_, slot := metricValue(fams, "bridge_slot_retained_wal_bytes", app)
		return v == 5 && slot
	}, 30*time.Second, 50*time.Millisecond)
	for _, c := range []struct {
		op   string
		want float64
	}{{"insert", 3}, {"update", 1}, {"delete", 1}} {
		v, ok := metricValue(fams, "bridge_changes_total", map[string]string{"source": "app", "table": "public.items", "op": c.op})
		assert.True(t, ok, c.op)
		assert.Equal(t, c.want, v, c.op)
	}
	v, _ := metricValue(fams, "bridge_transactions_total", app)
	assert.Equal(t, 3.0, v)
	v, _ = metricValue(fams, "bridge_publish_duration_seconds", map[string]string{"source": "app", "sink": "js"})
	assert.GreaterOrEqual(t, v, 1.0)
	v, _ = metricValue(fams, "bridge_pipeline_ready", app)
	assert.Equal(t, 1.0, v)
	v, _ = metricValue(fams, "bridge_slot_wal_status", map[string]string{"source": "app", "slot": "slot_metrics", "wal_status": "reserved"})
	assert.Equal(t, 1.0, v)
	v, _ = metricValue(fams, "bridge_slot_active", app)
	assert.Equal(t, 1.0, v)
	v, ok := metricValue(fams, "bridge_slot_retained_wal_bytes", app)
	assert.True(t, ok)
	assert.Positive(t, v)
	for _, name := range []string{"bridge_lag_bytes", "bridge_lag_seconds", "bridge_checkpoint_age_seconds",
		"bridge_last_delivered_commit_timestamp_seconds", "bridge_checkpoint_lsn", "bridge_build_info", "go_goroutines"} {
		_, ok := metricValue(fams, name, nil)
		assert.True(t, ok, name)
	}
	// The lag in bytes falls to what the checkpoint has not caught up with.
	require.Eventually(t, func() bool {
		v, _ := metricValue(scrape(t, base), "bridge_lag_bytes", app)
		return v < 1<<20
	}, 30*time.Second, 50*time.Millisecond)

	// A lost replication connection restarts the run, counted by cause.
	e.pg.ExecT(t, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'slot_metrics'`)
	require.Eventually(t, func() bool {
		fams := scrape(t, base)
		v, _ := metricValue(fams, "bridge_run_restarts_total", app)
		return v >= 1
	}, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { c, _ := httpStatus(t, base+"/readyz"); return c == http.StatusOK }, 60*time.Second, 20*time.Millisecond)
	fams = scrape(t, base)
	f := fams["bridge_run_restarts_total"]
	require.NotNil(t, f)
	t.Logf("restart causes: %v", f.GetMetric())

	cancel()
	require.NoError(t, <-done)
	code, _ = httpStatus(t, base+"/livez")
	require.Zero(t, code, "the server is shut down with the App")
}

// TestStatusAfterRun runs the bridge briefly, stops it, and checks
// `bridge status -o json` and the text form against the servers.
func TestStatusAfterRun(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY)`)
	p := e.config("status", "")
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO items SELECT generate_series(1, 10)`)
	e.waitStored("CDC_status", 10, 30*time.Second)
	// Wait for the checkpoint, then stop.
	require.Eventually(t, func() bool { return r.app.Pipelines()[0].Checkpointed() > 0 }, 30*time.Second, 20*time.Millisecond)
	r.stop(t)

	code, out, errs := execCLI(t, "status", "-c", p, "-o", "json")
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", errs, out)
	var rep status.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.True(t, rep.OK)
	require.Equal(t, "status", rep.Bridge)
	require.Len(t, rep.Sources, 1)
	s := rep.Sources[0]
	require.Equal(t, "app", s.Name)
	require.Equal(t, "pgoutput", s.Type)
	require.Empty(t, s.Errors)
	require.NotNil(t, s.Slot)
	assert.Equal(t, "slot_status", s.Slot.Name)
	assert.True(t, s.Slot.Exists)
	assert.False(t, s.Slot.Active, "the bridge is down")
	assert.Equal(t, "reserved", s.Slot.WALStatus)
	assert.NotEmpty(t, s.Slot.ConfirmedFlushLSN)
	require.NotNil(t, s.Checkpoint)
	assert.True(t, s.Checkpoint.Exists)
	assert.Equal(t, r.app.Pipelines()[0].Checkpointed().String(), s.Checkpoint.LSN)
	assert.Len(t, s.Checkpoint.Epoch, 8)
	require.NotNil(t, s.Checkpoint.AgeSeconds)
	assert.Less(t, *s.Checkpoint.AgeSeconds, 60.0)
	require.NotNil(t, s.LagBytes)
	require.Len(t, s.Streams, 1)
	assert.Equal(t, status.Stream{Sink: "js", Stream: "CDC_status", Exists: true, Messages: 10, Bytes: s.Streams[0].Bytes,
		FirstSeq: 1, LastSeq: 10, LastTime: s.Streams[0].LastTime}, s.Streams[0])

	// Stable field names for scripts.
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	src := raw["sources"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "type", "slot", "checkpoint", "streams", "lag_bytes", "errors"} {
		assert.Contains(t, src, k)
	}
	for _, k := range []string{"exists", "active", "active_pid", "confirmed_flush_lsn", "retained_wal_bytes", "wal_status"} {
		assert.Contains(t, src["slot"], k)
	}

	code, out, errs = execCLI(t, "status", "-c", p)
	require.Equal(t, 0, code, errs)
	for _, want := range []string{"source app (pgoutput)", "slot_status: inactive", "checkpoint  " + s.Checkpoint.LSN, "CDC_status (sink js): 10 messages"} {
		assert.Contains(t, out, want)
	}

	// Postgres down: the slot cannot be read; exit 1, the rest still shown.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.pg.Stop(ctx, "fast"))
	code, out, _ = execCLI(t, "status", "-c", p, "-o", "json")
	require.Equal(t, 1, code)
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.False(t, rep.OK)
	require.Nil(t, rep.Sources[0].Slot)
	require.NotNil(t, rep.Sources[0].Checkpoint)
	require.NotEmpty(t, rep.Sources[0].Errors)
	require.NoError(t, e.pg.Start(ctx))
}

// TestStatusEmbeddedNATS: with nats.url empty and the bridge down, status
// starts the embedded server on its store to read the checkpoint.
func TestStatusEmbeddedNATS(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY)`)
	port := freePort(t)
	p := e.config("emb", "")
	y, err := os.ReadFile(p)
	require.NoError(t, err)
	y = []byte(strings.Replace(string(y), "  url: "+e.natsURL(), fmt.Sprintf("  embedded: { port: %d }", port), 1))
	require.NoError(t, os.WriteFile(p, y, 0o644))
	r := e.start(p)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO items VALUES (1)`)
	require.Eventually(t, func() bool { return r.app.Pipelines()[0].Checkpointed() > 0 && r.app.Pipelines()[0].Delivered() == 1 },
		30*time.Second, 20*time.Millisecond)

	// While the bridge runs: status connects to its embedded server.
	code, out, errs := execCLI(t, "status", "-c", p, "-o", "json")
	require.Equal(t, 0, code, "%s\n%s", out, errs)
	var rep status.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, fmt.Sprintf("nats://127.0.0.1:%d", port), rep.NATS)
	require.True(t, rep.Sources[0].Slot.Active)
	r.stop(t)

	// Bridge down: status starts no server of its own (a later `bridge
	// run` would find the port taken). It reports the slot, and says that
	// the checkpoint and streams need the running bridge.
	code, out, errs = execCLI(t, "status", "-c", p, "-o", "json")
	require.Equal(t, 1, code, "%s\n%s", out, errs)
	rep = status.Report{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.True(t, rep.Sources[0].Slot.Exists)
	require.False(t, rep.Sources[0].Slot.Active)
	require.Nil(t, rep.Sources[0].Checkpoint)
	require.Contains(t, strings.Join(rep.Sources[0].Errors, "\n"), "start `bridge run` with this config first, or set nats.url")
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err, "status left a server on the embedded port")
	ln.Close()

	// A bridge whose embedded server took any free port (port -1) is found
	// through the address it records in data_dir.
	y = []byte(strings.Replace(string(y), fmt.Sprintf("  embedded: { port: %d }", port), "  embedded: { port: -1 }", 1))
	require.NoError(t, os.WriteFile(p, y, 0o644))
	r = e.start(p)
	waitReady(t, r)
	code, out, errs = execCLI(t, "status", "-c", p, "-o", "json")
	require.Equal(t, 0, code, "%s\n%s", out, errs)
	rep = status.Report{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, r.app.NATSURL(), rep.NATS)
	require.True(t, rep.Sources[0].Checkpoint.Exists)
}
