package telemetry

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/pgslot"
)

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

// Pipe is one pipeline's telemetry: its spans and the figures /metrics and
// /readyz read. It is the pipeline's observer (pipeline.Observer): Routed is
// called by the pipeline's reader, Delivered and Wrote by its writer,
// RunEnded after both have stopped. A nil *Pipe does nothing.
type Pipe struct {
	source string
	state  PipelineState // set by Metrics.Add
	tracer trace.Tracer  // nil: tracing off
	prop   propagation.TraceContext
	prefix string // trace context message prefix; "" when tracing is off
	m      *Metrics
	log    *slog.Logger

	txnCount interface{ Inc() }             // bridge_transactions_total{source}
	publish  map[string]prometheus.Observer // bridge_publish_duration_seconds{source, sink}, by sink
	sinkErrs interface{ Inc() }             // bridge_errors_total{source, kind="sink_write"}
	// bridge_sink_write_errors_total{source, sink}, by sink
	sinkFails map[string]interface{ Inc() }

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

	slot *pgslot.Gauge // the slot poller's last reading; nil when the source has no slot to poll
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

// maxUnckpt bounds Pipe.unckpt; past it, entries are merged (keeping
// the oldest time), which can only overstate the checkpoint age.
const maxUnckpt = 4096

// Routed registers changes, a routed transaction or a part of a large one
// (t is the whole transaction as the source emitted it; commit its commit
// LSN; last true for its last part), before they go to the writer: it
// counts them and, when tracing, starts the spans and puts each change
// span's context into the change's headers.
func (pt *Pipe) Routed(t *cdc.Txn, commit cdc.LSN, changes []cdc.Change, last bool) {
	if pt == nil {
		return
	}
	pt.count(changes)
	first := !pt.opened || pt.openCommit != commit
	var txnCtx context.Context
	var txnSpan trace.Span
	var spans []trace.Span
	if pt.tracer != nil {
		if first {
			txnCtx, txnSpan = pt.startTxn(t)
		} else {
			txnCtx, txnSpan = pt.openCtx, pt.openSpan
		}
		spans = pt.startChanges(txnCtx, txnSpan, changes)
	}
	pt.mu.Lock()
	if first {
		if pt.head > 0 && pt.head >= len(pt.queue)/2 {
			n := copy(pt.queue, pt.queue[pt.head:])
			clear(pt.queue[n:])
			pt.queue, pt.head = pt.queue[:n], 0
		}
		pt.queue = append(pt.queue, txnRec{commit: commit, commitTime: t.CommitTime, span: txnSpan})
	}
	r := &pt.queue[len(pt.queue)-1]
	r.registered += len(changes)
	r.spans = append(r.spans, spans...)
	r.complete = last
	pt.mu.Unlock()
	if first && pt.txnCount != nil {
		pt.txnCount.Inc()
	}
	pt.opened, pt.openCommit, pt.openCtx, pt.openSpan = !last, commit, txnCtx, txnSpan
}

// count adds cs to bridge_changes_total.
func (pt *Pipe) count(cs []cdc.Change) {
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
func (pt *Pipe) startTxn(t *cdc.Txn) (context.Context, trace.Span) {
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
	attrs := []attribute.KeyValue{
		attribute.String("db.system.name", "postgresql"),
		attribute.String("db.namespace", db),
		attribute.String("bridge.source", pt.source),
		attribute.String("bridge.commit_lsn", t.CommitLSN.String()),
		attribute.Int64("bridge.xid", int64(t.Xid)),
		attribute.String("bridge.commit_time", t.CommitTime.UTC().Format(time.RFC3339Nano)),
	}
	if n := txSize(t); n > 0 {
		attrs = append(attrs, attribute.Int("bridge.tx_size", n))
	}
	return pt.tracer.Start(parent, "cdc "+pt.source, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// txSize returns t's number of changes, 0 when not known yet (a large
// transaction handed over while it arrives).
func txSize(t *cdc.Txn) int {
	if len(t.Changes) > 0 {
		return int(t.Changes[0].TxSize)
	}
	return 0
}

// remote parses a trace context message: a traceparent, or a JSON object
// with traceparent and tracestate.
func (pt *Pipe) remote(content []byte) (context.Context, bool) {
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
// Schema change events and control messages have none (the attribute is
// left out; bridge.op names them).
var opNames = map[cdc.Op]string{
	cdc.OpInsert: "INSERT", cdc.OpUpdate: "UPDATE", cdc.OpDelete: "DELETE",
	cdc.OpTruncate: "TRUNCATE", cdc.OpMessage: "pg_logical_emit_message", cdc.OpRead: "SELECT",
}

// startChanges starts a span per change (when the transaction is sampled)
// and injects its context into the change's headers.
func (pt *Pipe) startChanges(txnCtx context.Context, txnSpan trace.Span, cs []cdc.Change) []trace.Span {
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
			attribute.String("db.collection.name", n.collection))
		if op, ok := opNames[c.Op]; ok {
			pt.attrs = append(pt.attrs, attribute.String("db.operation.name", op))
		}
		pt.attrs = append(pt.attrs,
			attribute.String("bridge.op", string(c.Op)),
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

func (pt *Pipe) inject(ctx context.Context, c *cdc.Change) {
	h := make(map[string]string, len(c.Headers)+2)
	maps.Copy(h, c.Headers)
	pt.prop.Inject(ctx, propagation.MapCarrier(h))
	c.Headers = h
}

// Delivered records that the writer wrote the next n routed changes to
// every sink, and every transaction up to done (0: none) in full.
func (pt *Pipe) Delivered(n int, done cdc.LSN) {
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

// CheckpointAge returns how long the oldest delivered transaction the
// checkpoint does not cover yet has waited; 0 when it covers all.
func (pt *Pipe) CheckpointAge(now time.Time) time.Duration {
	var ck cdc.LSN
	if pt.state != nil {
		ck = pt.state.Checkpointed()
	}
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

// RunEnded ends the spans of what the run did not deliver and counts why
// the run ended: err (nil when it ended without error), fatal when it stops
// the pipeline.
func (pt *Pipe) RunEnded(ctx context.Context, err error, fatal bool) {
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
	if fatal {
		pt.m.errors.WithLabelValues(pt.source, "fatal").Inc()
		return
	}
	pt.m.restarts.WithLabelValues(pt.source, cause).Inc()
	pt.m.errors.WithLabelValues(pt.source, cause).Inc()
}

// Wrote records one Write of a batch to sink that took d and failed with
// err (nil: every change delivered).
func (pt *Pipe) Wrote(sink string, d time.Duration, err error) {
	if pt == nil {
		return
	}
	if err != nil {
		if pt.sinkErrs != nil {
			pt.sinkErrs.Inc()
		}
		if c := pt.sinkFails[sink]; c != nil {
			c.Inc()
		}
		return
	}
	if h := pt.publish[sink]; h != nil {
		h.Observe(d.Seconds())
	}
}
