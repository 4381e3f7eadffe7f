package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/otlptest"
)

func TestTelemetryPlan(t *testing.T) {
	on, off := true, false
	cases := []struct {
		name     string
		cfg      config.Tracing
		env      map[string]string
		enabled  bool
		protocol string
		endpoint string
		sampler  bool // the ratio sampler from bridge.yaml
		err      string
	}{
		{name: "nothing configured", enabled: false},
		{name: "yaml endpoint", cfg: config.Tracing{Endpoint: "http://c:4318"}, enabled: true, protocol: "http/protobuf", endpoint: "http://c:4318", sampler: true},
		{name: "env endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, enabled: true, protocol: "http/protobuf", sampler: true},
		{name: "env traces endpoint wins over yaml", cfg: config.Tracing{Endpoint: "http://yaml:4318"},
			env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4318"}, enabled: true, protocol: "http/protobuf", sampler: true},
		{name: "exporter none wins", cfg: config.Tracing{Endpoint: "http://c:4318", Enabled: &on}, env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}},
		{name: "sdk disabled", cfg: config.Tracing{Endpoint: "http://c:4318"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"}},
		{name: "enabled false", cfg: config.Tracing{Endpoint: "http://c:4318", Enabled: &off}},
		{name: "enabled true without endpoint", cfg: config.Tracing{Enabled: &on, Protocol: "grpc"}, enabled: true, protocol: "grpc", sampler: true},
		{name: "exporter otlp", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, enabled: true, protocol: "http/protobuf", sampler: true},
		{name: "env protocol wins", cfg: config.Tracing{Endpoint: "http://c:4317", Protocol: "http/protobuf"},
			env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, enabled: true, protocol: "grpc", endpoint: "http://c:4317", sampler: true},
		{name: "env sampler wins", cfg: config.Tracing{Endpoint: "http://c:4318"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off"},
			enabled: true, protocol: "http/protobuf", endpoint: "http://c:4318"},
		{name: "unsupported exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: "zipkin"},
		{name: "unsupported protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, err: "http/json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.cfg.SampleRatio == 0 {
				c.cfg.SampleRatio = 1
			}
			p, err := PlanTracing(c.cfg, func(k string) string { return c.env[k] })
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.enabled, p.Enabled, p.Why)
			if !c.enabled {
				return
			}
			assert.Equal(t, c.protocol, p.Protocol)
			assert.Equal(t, c.endpoint, p.Endpoint)
			assert.Equal(t, c.sampler, p.Sampler != nil)
		})
	}
}

func TestTelemetryValidate(t *testing.T) {
	cfg := &config.Config{Telemetry: config.Telemetry{Tracing: config.Tracing{
		Endpoint: "collector:4318", Protocol: "thrift", SampleRatio: 2,
	}, Metrics: config.Metrics{SlotPollInterval: time.Second}}, HTTP: config.HTTP{MaxCheckpointAge: time.Second}}
	var lines []string
	for _, e := range Validate(cfg) {
		lines = append(lines, e.Error())
	}
	assert.Equal(t, []string{
		`telemetry.tracing.endpoint: must be an http:// or https:// URL such as http://collector:4318, got "collector:4318"`,
		`telemetry.tracing.protocol: must be grpc or http/protobuf, got "thrift"`,
		`telemetry.tracing.sample_ratio: must be between 0 and 1, got 2`,
	}, lines)
}

// TestTelemetryExportBothProtocols exports a span over OTLP/gRPC and
// OTLP/HTTP to an in-process receiver.
func TestTelemetryExportBothProtocols(t *testing.T) {
	recv := otlptest.NewReceiver(t)
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(proto, "/", "_"), func(t *testing.T) {
			endpoint := recv.HTTPURL
			if proto == "grpc" {
				endpoint = recv.GRPCURL
			}
			tp, err := NewTracerProvider(t.Context(), Plan{Enabled: true, Protocol: proto, Endpoint: endpoint, Sampler: sdktrace.AlwaysSample()}, "shop")
			require.NoError(t, err)
			_, s := tp.Tracer("test").Start(context.Background(), "span over "+proto)
			s.End()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, tp.Shutdown(ctx))
			var got *otlptest.Span
			for _, rs := range recv.Spans() {
				if rs.Name == "span over "+proto {
					got = &rs
				}
			}
			require.NotNil(t, got, "receiver got %v", recv.Spans())
			assert.Equal(t, "bridge", got.Service)
		})
	}
}

// testState is a PipelineState whose checkpoint the test sets.
type testState struct{ ckpt atomic.Uint64 }

func (s *testState) Delivered() uint64     { return 0 }
func (s *testState) Ready() bool           { return true }
func (s *testState) Checkpointed() cdc.LSN { return cdc.LSN(s.ckpt.Load()) }

func testPipe(t testing.TB, tp trace.TracerProvider) *Pipe {
	m := NewMetrics()
	var tracer trace.Tracer
	prefix := ""
	if tp != nil {
		tracer, prefix = tp.Tracer(Instrumentation), "traceparent"
	}
	return m.NewPipe("app", nil, tracer, prefix, nil, slog.New(slog.DiscardHandler))
}

// part is a routed transaction, or a part of one, as the pipeline's reader
// hands it to Routed.
type part struct {
	commit  cdc.LSN
	changes []cdc.Change
	last    bool
}

func routed(pt *Pipe, t *cdc.Txn, it *part) { pt.Routed(t, it.commit, it.changes, it.last) }

// testTxn makes a transaction of n inserts into public.items, plus a trace
// context message first when tp is set; it returns the routed item (the
// message is consumed by the router).
func testTxn(commit cdc.LSN, n int, tp string) (*cdc.Txn, *part) {
	t := &cdc.Txn{Xid: 7, CommitLSN: commit, CommitTime: time.Now().Add(-time.Second)}
	size := uint32(n)
	if tp != "" {
		size++
		t.Changes = append(t.Changes, cdc.Change{Op: cdc.OpMessage, Prefix: "traceparent", Content: []byte(tp), Transactional: true})
	}
	for i := 0; i < n; i++ {
		t.Changes = append(t.Changes, cdc.Change{Op: cdc.OpInsert, Schema: "public", Table: "items", Database: "shop"})
	}
	it := &part{commit: commit, last: true}
	for i := range t.Changes {
		c := &t.Changes[i]
		c.Producer, c.Source, c.CommitLSN, c.Seq, c.TxSize, c.CommitTime = "b.app.e", "app", commit, uint32(i), size, t.CommitTime
		if c.Op == cdc.OpMessage {
			continue
		}
		c.Subject = "cdc.app.public.items"
		it.changes = append(it.changes, *c)
	}
	return t, it
}

func counter(t testing.TB, m *Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := m.reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return value(mt)
		}
	}
	return -1
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func TestTelemetryTxnSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pt := testPipe(t, tp)
	ctx := context.Background()
	const remoteTrace, remoteSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

	// A writer's trace context, as JSON with a tracestate.
	txn, it := testTxn(100, 2, fmt.Sprintf(`{"traceparent": "00-%s-%s-01", "tracestate": "app=1"}`, remoteTrace, remoteSpan))
	routed(pt, txn, it)
	require.Empty(t, rec.Ended())
	for _, c := range it.changes {
		require.Contains(t, c.Headers[HeaderTraceparent], remoteTrace)
		require.Equal(t, "app=1", c.Headers[HeaderTracestate])
	}
	pt.Delivered(1, 0)
	require.Len(t, rec.Ended(), 1, "the first change's span ends when its batch is delivered")
	pt.Delivered(1, 100)
	ended := rec.Ended()
	require.Len(t, ended, 3)
	var txnSpan sdktrace.ReadOnlySpan
	for _, s := range ended {
		if s.Name() == "cdc app" {
			txnSpan = s
		}
	}
	require.NotNil(t, txnSpan)
	assert.Equal(t, remoteTrace, txnSpan.SpanContext().TraceID().String())
	assert.Equal(t, remoteSpan, txnSpan.Parent().SpanID().String())
	assert.True(t, txnSpan.Parent().IsRemote())
	for i, s := range ended[:2] {
		assert.Equal(t, "publish cdc.app.public.items", s.Name())
		assert.Equal(t, txnSpan.SpanContext().SpanID(), s.Parent().SpanID())
		assert.Equal(t, trace.SpanKindProducer, s.SpanKind())
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		assert.Equal(t, map[string]string{
			"db.system.name": "postgresql", "db.namespace": "shop", "db.collection.name": "public.items", "db.operation.name": "INSERT", "bridge.op": "insert",
			"messaging.system": "nats", "messaging.operation.type": "send", "messaging.destination.name": "cdc.app.public.items",
			"messaging.message.id": it.changes[i].ID(), "bridge.commit_lsn": "0/64", "bridge.seq": fmt.Sprint(i + 1), "bridge.tx_size": "3",
		}, attrs)
		// The header carries this change's own span.
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(it.changes[i].Headers)))
		assert.Equal(t, s.SpanContext().SpanID(), sc.SpanID())
	}

	// A large transaction in two parts: one transaction span; no context
	// message, so a new trace.
	rec2 := tracetest.NewSpanRecorder()
	tp.RegisterSpanProcessor(rec2)
	txn, it = testTxn(200, 3, "")
	part1 := &part{commit: 200, changes: it.changes[:2]}
	part2 := &part{commit: 200, changes: it.changes[2:], last: true}
	routed(pt, txn, part1)
	pt.Delivered(2, 0)
	routed(pt, txn, part2)
	pt.Delivered(1, 200)
	ended = rec2.Ended()
	require.Len(t, ended, 4)
	txnID := ended[3].SpanContext().SpanID()
	assert.Equal(t, "cdc app", ended[3].Name())
	assert.False(t, ended[3].Parent().IsValid())
	for _, s := range ended[:3] {
		assert.Equal(t, txnID, s.Parent().SpanID())
	}

	// A run that ends leaves nothing open; the spans say why.
	rec3 := tracetest.NewSpanRecorder()
	tp.RegisterSpanProcessor(rec3)
	txn, it = testTxn(300, 2, "not a traceparent")
	routed(pt, txn, it)
	pt.RunEnded(ctx, fmt.Errorf("receiving: %w", &pgconn.PgError{Code: "57P01"}), false)
	ended = rec3.Ended()
	require.Len(t, ended, 3)
	for _, s := range ended {
		assert.Equal(t, codes.Error, s.Status().Code)
	}

	m := pt.m
	assert.Equal(t, 7.0, counter(t, m, "bridge_changes_total", map[string]string{"source": "app", "table": "public.items", "op": "insert"}))
	assert.Equal(t, 3.0, counter(t, m, "bridge_transactions_total", map[string]string{"source": "app"}))
	assert.Equal(t, 1.0, counter(t, m, "bridge_run_restarts_total", map[string]string{"source": "app", "cause": "postgres"}))
	assert.Equal(t, 1.0, counter(t, m, "bridge_errors_total", map[string]string{"source": "app", "kind": "trace_context"}))
}

func TestTelemetryCheckpointAge(t *testing.T) {
	pt := testPipe(t, nil)
	st := &testState{}
	pt.m.Add(pt, st)
	now := time.Now()
	assert.Zero(t, pt.CheckpointAge(now))
	txn, it := testTxn(100, 1, "")
	routed(pt, txn, it)
	pt.Delivered(1, 100)
	assert.Positive(t, pt.CheckpointAge(time.Now().Add(time.Second)))
	st.ckpt.Store(100)
	assert.Zero(t, pt.CheckpointAge(time.Now().Add(time.Second)))
	assert.InDelta(t, 1.0, counter(t, pt.m, "bridge_lag_seconds", map[string]string{"source": "app"}), 0.5)
}

func TestTelemetryErrorCause(t *testing.T) {
	assert.Equal(t, "postgres", errorCause(fmt.Errorf("x: %w", &pgconn.PgError{Code: "XX000"})))
	assert.Equal(t, "timeout", errorCause(context.DeadlineExceeded))
	assert.Equal(t, "other", errorCause(errors.New("boom")))
}

// BenchmarkTracingPerChange measures what the pipeline pays per change for
// telemetry, in transactions of 10 changes: registering them (counters),
// starting a span per change and per transaction, injecting traceparent,
// and ending the spans at delivery. "exported" variants export every span
// over OTLP/HTTP to an in-process receiver (blocking: nothing dropped).
func BenchmarkTracingPerChange(b *testing.B) {
	recv := otlptest.NewReceiver(b)
	recv.Discard = true
	newTP := func(ratio float64, blocking bool) trace.TracerProvider {
		tp, err := NewTracerProvider(context.Background(), Plan{Enabled: true, Protocol: "http/protobuf", Endpoint: recv.HTTPURL,
			Sampler: sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))}, "bench")
		require.NoError(b, err)
		if blocking {
			// Rebuild with a blocking batcher so no span is dropped.
			_ = tp.Shutdown(context.Background())
			exp, err := newOTLPHTTPExporter(recv.HTTPURL)
			require.NoError(b, err)
			tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
				sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBlocking())))
		}
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	const size = 10
	for _, bc := range []struct {
		name string
		pt   func() *Pipe
	}{
		{"no_telemetry", func() *Pipe { return nil }},
		{"tracing_off", func() *Pipe { return testPipe(b, nil) }},
		{"sampled_0.01", func() *Pipe { return testPipe(b, newTP(0.01, false)) }},
		{"sampled_1.0_noop_exporter", func() *Pipe {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			return testPipe(b, tp)
		}},
		{"sampled_1.0", func() *Pipe { return testPipe(b, newTP(1, false)) }},
		{"sampled_1.0_exported", func() *Pipe { return testPipe(b, newTP(1, true)) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pt := bc.pt()
			txn, it := testTxn(1, size, "")
			var commit cdc.LSN
			for b.Loop() {
				commit++
				it.commit = commit
				for i := range it.changes {
					it.changes[i].Headers = nil
				}
				routed(pt, txn, it)
				pt.Delivered(size, commit)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/change")
		})
	}
}

func newOTLPHTTPExporter(base string) (*otlptrace.Exporter, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	return otlptracehttp.New(context.Background(), otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithInsecure())
}

// sinkState is a PipelineState that knows its sinks' positions.
type sinkState struct {
	testState
	written map[string]cdc.LSN
	dead    map[string]uint64
}

func (s *sinkState) SinkWritten() map[string]cdc.LSN { return s.written }

func (s *sinkState) SinkDeadLetters() map[string]uint64 { return s.dead }

// TestTelemetrySinkPositions: each sink's written LSN and failed Writes are
// exported by sink, so the one holding the slot back shows.
func TestTelemetrySinkPositions(t *testing.T) {
	m := NewMetrics()
	pt := m.NewPipe("app", []string{"stream", "mirror"}, nil, "", nil, slog.New(slog.DiscardHandler))
	m.Add(pt, &sinkState{written: map[string]cdc.LSN{"stream": 300, "mirror": 200}, dead: map[string]uint64{"stream": 4}})
	pt.Wrote("mirror", time.Millisecond, errors.New("down"))
	pt.Wrote("mirror", time.Millisecond, errors.New("down"))
	pt.Wrote("stream", time.Millisecond, nil)
	assert.Equal(t, 300.0, counter(t, m, "bridge_sink_written_lsn", map[string]string{"source": "app", "sink": "stream"}))
	assert.Equal(t, 200.0, counter(t, m, "bridge_sink_written_lsn", map[string]string{"source": "app", "sink": "mirror"}))
	assert.Equal(t, 2.0, counter(t, m, "bridge_sink_write_errors_total", map[string]string{"source": "app", "sink": "mirror"}))
	assert.Equal(t, 0.0, counter(t, m, "bridge_sink_write_errors_total", map[string]string{"source": "app", "sink": "stream"}))
	assert.Equal(t, 4.0, counter(t, m, "bridge_sink_dead_letters_total", map[string]string{"source": "app", "sink": "stream"}))
}

// TestSpanOfSchemaEvent: a schema change event's span names its op in
// bridge.op and has no db.operation.name (there is no SQL command to name),
// rather than an empty one.
func TestSpanOfSchemaEvent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	pt := testPipe(t, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	txn, it := testTxn(300, 2, "")
	it.changes[0].Op = cdc.OpSchema
	routed(pt, txn, it)
	pt.Delivered(2, 300)
	var ops []string
	for _, s := range rec.Ended() {
		if s.Name() != "publish cdc.app.public.items" {
			continue
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		op, has := attrs["db.operation.name"]
		ops = append(ops, attrs["bridge.op"]+"/"+op+"/"+fmt.Sprint(has))
	}
	require.Equal(t, []string{"schema//false", "insert/INSERT/true"}, ops)
}
