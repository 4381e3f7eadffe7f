package bridge

// Traces (DESIGN.md §6): a span per transaction, a child span per change, the
// change span's context in the change's headers so the NATS message carries
// it, and the writer's own trace context taken from a logical message in the
// transaction.
//
// Span lifetimes: the transaction span and its change spans start when the
// reader routes the transaction (Pipeline.route → pipeTel.txn). A change
// span ends when the writer's flush has written the batch holding the change
// to every sink (pipeTel.delivered); the transaction span ends when its last
// change is delivered. Spans of changes a run did not deliver end with an
// error status when the run ends (pipeTel.runEnded); the next run replays
// those changes under new spans.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

// WithTracerProvider makes the App trace with tp instead of building a
// provider from bridge.yaml's telemetry.tracing section and the OTEL_*
// variables. The App does not shut tp down. The trace context prefix still
// comes from telemetry.tracing.context_prefix.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(a *App) { a.tp = tp }
}

// instrumentation is the tracer's instrumentation scope.
const instrumentation = "github.com/bridgecdc/bridge"

// Header names of the W3C trace context, lowercase as the specification
// writes them (NATS headers are case-sensitive).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// tracingPlan is what the configuration and the environment ask for.
type tracingPlan struct {
	enabled  bool
	protocol string // "grpc" or "http/protobuf"
	endpoint string // from bridge.yaml; "" leaves it to OTEL_* and the exporter
	sampler  sdktrace.Sampler
	why      string // why tracing is on or off, for the log
}

// planTracing decides, from cfg and the environment (getenv), whether to
// trace and how. OTEL_* variables win over bridge.yaml when set.
func planTracing(cfg config.Tracing, getenv func(string) string) (tracingPlan, error) {
	env := func(k string) string { return strings.TrimSpace(getenv(k)) }
	var p tracingPlan
	exporter := strings.ToLower(env("OTEL_TRACES_EXPORTER"))
	switch exporter {
	case "", "otlp", "none":
	default:
		return p, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported (otlp or none)", exporter)
	}
	envEndpoint := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	switch {
	case strings.EqualFold(env("OTEL_SDK_DISABLED"), "true"):
		p.why = "OTEL_SDK_DISABLED=true"
	case exporter == "none":
		p.why = "OTEL_TRACES_EXPORTER=none"
	case cfg.Enabled != nil:
		p.enabled = *cfg.Enabled
		p.why = "telemetry.tracing.enabled"
	case cfg.Endpoint != "":
		p.enabled, p.why = true, "telemetry.tracing.endpoint is set"
	case envEndpoint:
		p.enabled, p.why = true, "OTEL_EXPORTER_OTLP_ENDPOINT is set"
	case exporter == "otlp":
		p.enabled, p.why = true, "OTEL_TRACES_EXPORTER=otlp"
	default:
		p.why = "no exporter endpoint configured"
	}
	if !p.enabled {
		return p, nil
	}
	p.protocol = firstNonEmpty(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), env("OTEL_EXPORTER_OTLP_PROTOCOL"), cfg.Protocol, "http/protobuf")
	if p.protocol != "grpc" && p.protocol != "http/protobuf" {
		return p, fmt.Errorf("OTLP protocol %q is not supported (grpc or http/protobuf)", p.protocol)
	}
	if !envEndpoint {
		p.endpoint = cfg.Endpoint
	}
	if env("OTEL_TRACES_SAMPLER") == "" {
		p.sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))
	}
	return p, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// validateTelemetry checks the telemetry and http sections; errors name
// their YAML path.
func validateTelemetry(cfg *config.Config) []error {
	var errs []error
	tr := cfg.Telemetry.Tracing
	if tr.Endpoint != "" {
		if _, err := endpointURL(tr.Endpoint); err != nil {
			errs = append(errs, &config.FieldError{Path: "telemetry.tracing.endpoint", Msg: err.Error()})
		}
	}
	if tr.Protocol != "grpc" && tr.Protocol != "http/protobuf" {
		errs = append(errs, &config.FieldError{Path: "telemetry.tracing.protocol", Msg: fmt.Sprintf("must be grpc or http/protobuf, got %q", tr.Protocol)})
	}
	if tr.SampleRatio < 0 || tr.SampleRatio > 1 {
		errs = append(errs, &config.FieldError{Path: "telemetry.tracing.sample_ratio", Msg: fmt.Sprintf("must be between 0 and 1, got %g", tr.SampleRatio)})
	}
	if cfg.Telemetry.Metrics.SlotPollInterval <= 0 {
		errs = append(errs, &config.FieldError{Path: "telemetry.metrics.slot_poll_interval", Msg: fmt.Sprintf("must be > 0, got %s", cfg.Telemetry.Metrics.SlotPollInterval)})
	}
	if cfg.HTTP.MaxCheckpointAge <= 0 {
		errs = append(errs, &config.FieldError{Path: "http.max_checkpoint_age", Msg: fmt.Sprintf("must be > 0, got %s", cfg.HTTP.MaxCheckpointAge)})
	}
	return errs
}

// endpointURL parses a collector base URL.
func endpointURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("must be an http:// or https:// URL such as http://collector:4318, got %q", config.Redact(s))
	}
	if u.User != nil {
		return nil, fmt.Errorf("must not hold credentials (%q); pass them in OTEL_EXPORTER_OTLP_HEADERS, e.g. authorization=Basic ...", config.Redact(s))
	}
	return u, nil
}

// newTracerProvider builds the SDK provider the plan asks for. It does no
// network I/O: exporters connect on their first export.
func newTracerProvider(ctx context.Context, p tracingPlan, bridgeName string) (*sdktrace.TracerProvider, error) {
	var client otlptrace.Client
	var u *url.URL
	if p.endpoint != "" {
		var err error
		if u, err = endpointURL(p.endpoint); err != nil {
			return nil, err
		}
	}
	if p.protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if u != nil {
			opts = append(opts, otlptracegrpc.WithEndpoint(u.Host))
			if u.Scheme == "http" {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		client = otlptracegrpc.NewClient(opts...)
	} else {
		var opts []otlptracehttp.Option
		if u != nil {
			// Like OTEL_EXPORTER_OTLP_ENDPOINT: a base URL.
			opts = append(opts, otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(strings.TrimSuffix(u.Path, "/")+"/v1/traces"))
			if u.Scheme == "http" {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		client = otlptracehttp.NewClient(opts...)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("creating OTLP %s trace exporter: %w", p.protocol, err)
	}
	// service.name defaults to "bridge"; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES win.
	base := resource.NewSchemaless(attribute.String("service.name", "bridge"), attribute.String("bridge.name", bridgeName),
		attribute.String("service.version", version()))
	fromEnv, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("reading OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	res, err := resource.Merge(base, fromEnv)
	if err != nil {
		return nil, fmt.Errorf("building the trace resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if p.sampler != nil {
		opts = append(opts, sdktrace.WithSampler(p.sampler))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

// txnRec is a routed transaction that is not yet delivered in full.
type txnRec struct {
	commit     cdc.LSN
	commitTime time.Time
	registered int  // changes routed so far
	delivered  int  // of which delivered
	complete   bool // its last part is routed
	span       trace.Span
	spans      []trace.Span // change spans, when recording
}

// pipeTel is a pipeline's telemetry: spans and the counters the pipeline
// feeds. A nil *pipeTel does nothing. txn is called by the reader,
// delivered by the writer, runEnded after both are done.
type pipeTel struct {
	p      *Pipeline
	source string
	tracer trace.Tracer // nil: tracing off
	prop   propagation.TraceContext
	prefix string // trace context message prefix; "" when tracing is off
	m      *metrics
	log    *slog.Logger

	txnCount interface{ Inc() } // bridge_transactions_total{source}

	// Reader state.
	counts     map[countKey]countVal
	names      map[nameKey]spanNames
	attrs      []attribute.KeyValue // scratch
	opened     bool                 // a transaction is routed in part, more parts to come
	openCommit cdc.LSN              // its commit LSN
	openCtx    context.Context
	openSpan   trace.Span

	mu    sync.Mutex
	queue []txnRec // routed, not yet delivered, in order
	head  int

	popped []txnRec     // writer's scratch
	ends   []trace.Span // writer's scratch

	// Delivery state, for lag and checkpoint age.
	dmu        sync.Mutex
	lastCommit time.Time // commit time of the last delivered transaction
	lastDelay  time.Duration
	lastLSN    cdc.LSN
	unckpt     []deliveredAt // delivered, maybe not checkpointed

	slot slotGauge
}

type countKey struct {
	schema, table, prefix string
	op                    cdc.Op
}

type nameKey struct{ subject, schema, table string }

type spanNames struct{ span, collection string }

type countVal struct {
	c interface{ Add(float64) }
}

type deliveredAt struct {
	lsn cdc.LSN
	at  time.Time
}

// maxUnckpt bounds pipeTel.unckpt; past it, entries are merged (keeping
// the oldest time), which can only overstate the checkpoint age.
const maxUnckpt = 4096

// txn registers it, a routed transaction or a part of a large one (t is the
// whole transaction as the source emitted it), before it goes to the
// writer: it counts the changes and, when tracing, starts the spans and puts
// each change span's context into the change's headers.
func (pt *pipeTel) txn(_ context.Context, t *cdc.Txn, it *txnItem) {
	if pt == nil {
		return
	}
	pt.count(it.changes)
	first := !pt.opened || pt.openCommit != it.commit
	var txnCtx context.Context
	var txnSpan trace.Span
	var spans []trace.Span
	if pt.tracer != nil {
		if first {
			txnCtx, txnSpan = pt.startTxn(t)
		} else {
			txnCtx, txnSpan = pt.openCtx, pt.openSpan
		}
		spans = pt.startChanges(txnCtx, txnSpan, it.changes)
	}
	pt.mu.Lock()
	if first {
		if pt.head > 0 && pt.head >= len(pt.queue)/2 {
			n := copy(pt.queue, pt.queue[pt.head:])
			clear(pt.queue[n:])
			pt.queue, pt.head = pt.queue[:n], 0
		}
		pt.queue = append(pt.queue, txnRec{commit: it.commit, commitTime: t.CommitTime, span: txnSpan})
	}
	r := &pt.queue[len(pt.queue)-1]
	r.registered += len(it.changes)
	r.spans = append(r.spans, spans...)
	r.complete = it.last
	pt.mu.Unlock()
	if first && pt.txnCount != nil {
		pt.txnCount.Inc()
	}
	pt.opened, pt.openCommit, pt.openCtx, pt.openSpan = !it.last, it.commit, txnCtx, txnSpan
}

// count adds cs to bridge_changes_total.
func (pt *pipeTel) count(cs []cdc.Change) {
	if pt.m == nil || len(cs) == 0 {
		return
	}
	if pt.counts == nil {
		pt.counts = map[countKey]countVal{}
	}
	var k countKey
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		v, ok := pt.counts[k]
		if !ok {
			table := k.schema + "." + k.table
			if k.op == cdc.OpMessage {
				table = "_message." + k.prefix
			}
			if len(pt.counts) > 10000 {
				clear(pt.counts)
			}
			v = countVal{pt.m.changes.WithLabelValues(pt.source, table, string(k.op))}
			pt.counts[k] = v
		}
		v.c.Add(float64(n))
	}
	for i := range cs {
		c := &cs[i]
		ck := countKey{schema: c.Schema, table: c.Table, op: c.Op}
		if c.Op == cdc.OpMessage {
			ck = countKey{prefix: c.Prefix, op: c.Op}
		}
		if ck != k {
			flush()
			k, n = ck, 0
		}
		n++
	}
	flush()
}

// startTxn starts a transaction span, a child of the writer's trace context
// when the transaction carries one.
func (pt *pipeTel) startTxn(t *cdc.Txn) (context.Context, trace.Span) {
	parent := context.Background()
	if pt.prefix != "" {
		for i := range t.Changes {
			c := &t.Changes[i]
			if c.Op != cdc.OpMessage || c.Prefix != pt.prefix {
				continue
			}
			if ctx, ok := pt.remote(c.Content); ok {
				parent = ctx
				break
			}
		}
	}
	db := ""
	if len(t.Changes) > 0 {
		db = t.Changes[0].Database
	}
	return pt.tracer.Start(parent, "cdc "+pt.source,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("db.system.name", "postgresql"),
			attribute.String("db.namespace", db),
			attribute.String("bridge.source", pt.source),
			attribute.String("bridge.commit_lsn", t.CommitLSN.String()),
			attribute.Int64("bridge.xid", int64(t.Xid)),
			attribute.String("bridge.commit_time", t.CommitTime.UTC().Format(time.RFC3339Nano)),
			attribute.Int("bridge.tx_size", txSize(t)),
		))
}

func txSize(t *cdc.Txn) int {
	if len(t.Changes) > 0 {
		return int(t.Changes[0].TxSize)
	}
	return 0
}

// remote parses a trace context message: a traceparent, or a JSON object
// with traceparent and tracestate.
func (pt *pipeTel) remote(content []byte) (context.Context, bool) {
	s := strings.TrimSpace(string(content))
	carrier := propagation.MapCarrier{}
	if strings.HasPrefix(s, "{") {
		var j struct {
			Traceparent string `json:"traceparent"`
			Tracestate  string `json:"tracestate"`
		}
		if err := json.Unmarshal([]byte(s), &j); err == nil {
			carrier[HeaderTraceparent], carrier[HeaderTracestate] = j.Traceparent, j.Tracestate
		}
	} else {
		carrier[HeaderTraceparent] = s
	}
	ctx := pt.prop.Extract(context.Background(), carrier)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		if pt.m != nil {
			pt.m.errors.WithLabelValues(pt.source, "trace_context").Inc()
		}
		pt.log.Debug("ignoring a trace context message that holds no valid W3C traceparent", "prefix", pt.prefix, "content_bytes", len(content))
		return nil, false
	}
	return ctx, true
}

// opNames are db.operation.name values: the SQL command for row changes.
var opNames = map[cdc.Op]string{
	cdc.OpInsert: "INSERT", cdc.OpUpdate: "UPDATE", cdc.OpDelete: "DELETE",
	cdc.OpTruncate: "TRUNCATE", cdc.OpMessage: "pg_logical_emit_message", cdc.OpRead: "SELECT",
}

// startChanges starts a span per change (when the transaction is sampled)
// and injects its context into the change's headers.
func (pt *pipeTel) startChanges(txnCtx context.Context, txnSpan trace.Span, cs []cdc.Change) []trace.Span {
	if !txnSpan.IsRecording() {
		// Not sampled: no spans, but consumers still continue the trace
		// (unsampled) from the transaction's context.
		for i := range cs {
			pt.inject(txnCtx, &cs[i])
		}
		return nil
	}
	if pt.names == nil || len(pt.names) > 10000 {
		pt.names = map[nameKey]spanNames{}
	}
	spans := make([]trace.Span, len(cs))
	var lsn cdc.LSN
	var lsnText string
	for i := range cs {
		c := &cs[i]
		k := nameKey{subject: c.Subject, schema: c.Schema, table: c.Table}
		n, ok := pt.names[k]
		if !ok {
			n.span = "publish " + c.Subject
			if c.Op != cdc.OpMessage {
				n.collection = c.Schema + "." + c.Table
			}
			pt.names[k] = n
		}
		if lsnText == "" || c.CommitLSN != lsn {
			lsn, lsnText = c.CommitLSN, c.CommitLSN.String()
		}
		ctx, s := pt.tracer.Start(txnCtx, n.span, trace.WithSpanKind(trace.SpanKindProducer))
		// Set after the start, from a reused slice: the SDK copies it.
		pt.attrs = append(pt.attrs[:0],
			attribute.String("db.system.name", "postgresql"),
			attribute.String("db.namespace", c.Database),
			attribute.String("db.collection.name", n.collection),
			attribute.String("db.operation.name", opNames[c.Op]),
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", c.Subject),
			attribute.String("messaging.message.id", c.ID()),
			attribute.String("bridge.commit_lsn", lsnText),
			attribute.Int64("bridge.seq", int64(c.Seq)),
			attribute.Int64("bridge.tx_size", int64(c.TxSize)),
		)
		s.SetAttributes(pt.attrs...)
		pt.inject(ctx, c)
		spans[i] = s
	}
	return spans
}

func (pt *pipeTel) inject(ctx context.Context, c *cdc.Change) {
	h := make(map[string]string, len(c.Headers)+2)
	maps.Copy(h, c.Headers)
	pt.prop.Inject(ctx, propagation.MapCarrier(h))
	c.Headers = h
}

// delivered records that the writer's flush wrote the next n routed changes
// to every sink, and every transaction up to done (0: none) in full.
func (pt *pipeTel) delivered(n int, done cdc.LSN) {
	if pt == nil {
		return
	}
	now := time.Now()
	popped, ends := pt.popped[:0], pt.ends[:0]
	pt.mu.Lock()
	for i := pt.head; n > 0 && i < len(pt.queue); i++ {
		r := &pt.queue[i]
		k := min(n, r.registered-r.delivered)
		if r.delivered < len(r.spans) {
			ends = append(ends, r.spans[r.delivered:min(r.delivered+k, len(r.spans))]...)
		}
		r.delivered += k
		n -= k
	}
	for done != 0 && pt.head < len(pt.queue) {
		r := &pt.queue[pt.head]
		if !r.complete || r.commit > done {
			break
		}
		popped = append(popped, *r)
		pt.queue[pt.head] = txnRec{}
		pt.head++
	}
	pt.mu.Unlock()
	for _, s := range ends {
		s.End(trace.WithTimestamp(now))
	}
	defer func() {
		clear(popped)
		clear(ends)
		pt.popped, pt.ends = popped[:0], ends[:0]
	}()
	if len(popped) == 0 {
		return
	}
	for i := range popped {
		r := &popped[i]
		for _, s := range r.spans[min(r.delivered, len(r.spans)):] {
			s.End(trace.WithTimestamp(now))
		}
		if r.span != nil {
			r.span.End(trace.WithTimestamp(now))
		}
	}
	last := popped[len(popped)-1]
	pt.dmu.Lock()
	pt.lastCommit, pt.lastLSN = last.commitTime, last.commit
	if !last.commitTime.IsZero() {
		pt.lastDelay = now.Sub(last.commitTime)
	}
	if k := len(pt.unckpt); k >= maxUnckpt {
		pt.unckpt[k-1].lsn = last.commit
	} else {
		pt.unckpt = append(pt.unckpt, deliveredAt{lsn: last.commit, at: now})
	}
	pt.dmu.Unlock()
}

// checkpointAge returns how long the oldest delivered transaction the
// checkpoint does not cover yet has waited; 0 when it covers all.
func (pt *pipeTel) checkpointAge(now time.Time) time.Duration {
	ck := pt.p.Checkpointed()
	pt.dmu.Lock()
	defer pt.dmu.Unlock()
	i := 0
	for i < len(pt.unckpt) && pt.unckpt[i].lsn <= ck {
		i++
	}
	if i > 0 {
		n := copy(pt.unckpt, pt.unckpt[i:])
		pt.unckpt = pt.unckpt[:n]
	}
	if len(pt.unckpt) == 0 {
		return 0
	}
	return now.Sub(pt.unckpt[0].at)
}

// runEnded ends the spans of what the run did not deliver and counts why
// the run ended.
func (pt *pipeTel) runEnded(ctx context.Context, err error) {
	if pt == nil {
		return
	}
	pt.mu.Lock()
	left := pt.queue[pt.head:]
	pt.queue, pt.head = nil, 0
	pt.mu.Unlock()
	pt.opened, pt.openCtx, pt.openSpan = false, nil, nil
	msg := "not delivered: the run ended; the change is sent again by the next run"
	for i := range left {
		r := &left[i]
		for _, s := range r.spans[min(r.delivered, len(r.spans)):] {
			s.SetStatus(codes.Error, msg)
			s.End()
		}
		if r.span != nil {
			r.span.SetStatus(codes.Error, msg)
			r.span.End()
		}
	}
	if err == nil || ctx.Err() != nil || pt.m == nil {
		return
	}
	cause := errorCause(err)
	if isFatal(err) {
		pt.m.errors.WithLabelValues(pt.source, "fatal").Inc()
		return
	}
	pt.m.restarts.WithLabelValues(pt.source, cause).Inc()
	pt.m.errors.WithLabelValues(pt.source, cause).Inc()
}
