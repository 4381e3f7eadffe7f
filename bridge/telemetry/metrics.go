package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/retry"
	"github.com/bridgecdc/bridge/internal/buildinfo"
	"github.com/bridgecdc/bridge/sinks"
)

// Metrics is an App's Prometheus registry and the vectors its pipelines
// feed. It is safe for concurrent use.
type Metrics struct {
	reg      *prometheus.Registry
	changes  *prometheus.CounterVec
	txns     *prometheus.CounterVec
	publish  *prometheus.HistogramVec
	restarts *prometheus.CounterVec
	errors   *prometheus.CounterVec
	sinkErrs *prometheus.CounterVec

	mu    sync.Mutex
	pipes []*Pipe
}

// NewMetrics returns a registry with the Go and process collectors,
// bridge_build_info and the bridge's vectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_changes_total",
			Help: "Changes routed to at least one sink, by source, table (schema.table, or _message.<prefix>) and op. A run that restarts routes the undelivered ones again.",
		}, []string{"source", "table", "op"}),
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_transactions_total",
			Help: "Committed transactions read from the source and routed, by source.",
		}, []string{"source"}),
		publish: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bridge_publish_duration_seconds",
			Help:    "Time a sink took to durably accept a batch, by source and sink; successful batches only.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"source", "sink"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_run_restarts_total",
			Help: "Runs that ended with a transient error and were restarted, by source and cause (postgres, nats, sink, connection, timeout, other).",
		}, []string{"source", "cause"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_errors_total",
			Help: "Errors by source and kind: a run-ending cause (postgres, nats, sink, connection, timeout, other), fatal, sink_write, slot_poll, trace_context.",
		}, []string{"source", "kind"}),
		sinkErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_sink_write_errors_total",
			Help: "Failed Writes of a batch to a sink, by source and sink: the sink that holds the slot back when it fails.",
		}, []string{"source", "sink"}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "bridge_build_info", Help: "Always 1; the version label is the bridge's version.",
		ConstLabels: prometheus.Labels{"version": buildinfo.String()},
	})
	build.Set(1)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build, m.changes, m.txns, m.publish, m.restarts, m.errors, m.sinkErrs, (*pipeCollector)(m),
	)
	return m
}

// Registry returns the registry /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// PipelineState is what /metrics reads of a pipeline at scrape time.
type PipelineState interface {
	Delivered() uint64
	Ready() bool
	Checkpointed() cdc.LSN
}

// SinkPositions is implemented by a PipelineState that knows, per sink
// name, the commit LSN up to which the sink holds what it is given
// (bridge_sink_written_lsn).
type SinkPositions interface {
	SinkWritten() map[string]cdc.LSN
}

// SinkDeadLetters is implemented by a PipelineState that knows, per name
// of a sink with a dead-letter subject, the changes the sink stored there
// (bridge_sink_dead_letters_total).
type SinkDeadLetters interface {
	SinkDeadLetters() map[string]uint64
}

// SchemaStats is implemented by a PipelineState that follows its
// tables' schemas (docs/schemas.md): the tables a breaking schema change
// holds, by policy (bridge_schema_held_tables), the changes of held tables
// marked for dead-letter subjects (bridge_schema_dead_lettered_total) and
// the schema versions it registered (bridge_schema_versions_total).
type SchemaStats interface {
	SchemaStats() (heldPause, heldDeadLetter int, deadLettered, versions uint64)
}

// NewPipe returns the observer of source's pipeline, whose changes go to
// sinks (their names). tracer is nil when tracing is off; prefix is the
// trace context message prefix ("" when tracing is off); slot is the slot
// poller's gauge, nil when the source has no slot to poll.
func (m *Metrics) NewPipe(source string, sinks []string, tracer trace.Tracer, prefix string, slot *pgslot.Gauge, log *slog.Logger) *Pipe {
	pt := &Pipe{source: source, tracer: tracer, prefix: prefix, m: m, log: log, slot: slot,
		txnCount: m.txns.WithLabelValues(source), sinkErrs: m.errors.WithLabelValues(source, "sink_write"),
		publish: make(map[string]prometheus.Observer, len(sinks))}
	pt.sinkFails = make(map[string]interface{ Inc() }, len(sinks))
	for _, s := range sinks {
		pt.publish[s] = m.publish.WithLabelValues(source, s)
		pt.sinkFails[s] = m.sinkErrs.WithLabelValues(source, s)
	}
	return pt
}

// Add makes pt, the observer of the pipeline st, visible to /metrics.
func (m *Metrics) Add(pt *Pipe, st PipelineState) {
	m.mu.Lock()
	pt.state = st
	m.pipes = append(m.pipes, pt)
	m.mu.Unlock()
}

// Remove hides pt from /metrics and /readyz: its source was removed or
// rebuilt by a reload.
func (m *Metrics) Remove(pt *Pipe) {
	m.mu.Lock()
	m.pipes = slices.DeleteFunc(m.pipes, func(x *Pipe) bool { return x == pt })
	m.mu.Unlock()
}

// SlotPollFailed counts a failed slot poll of source.
func (m *Metrics) SlotPollFailed(source string) {
	m.errors.WithLabelValues(source, "slot_poll").Inc()
}

// Pipes returns the observers added so far, sorted by source name.
func (m *Metrics) Pipes() []*Pipe {
	m.mu.Lock()
	out := append([]*Pipe(nil), m.pipes...)
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b *Pipe) int { return strings.Compare(a.source, b.source) })
	return out
}

// Source returns the name of the source pt observes.
func (pt *Pipe) Source() string { return pt.source }

// State returns the pipeline pt observes, as Metrics.Add gave it.
func (pt *Pipe) State() PipelineState { return pt.state }

// pipeCollector reports the pipelines' state at scrape time.
type pipeCollector Metrics

var (
	descDelivered = prometheus.NewDesc("bridge_changes_delivered_total",
		"Changes written to every sink by this process, by source.", []string{"source"}, nil)
	descReady = prometheus.NewDesc("bridge_pipeline_ready",
		"1 while the source's pipeline is streaming, else 0.", []string{"source"}, nil)
	descCkptLSN = prometheus.NewDesc("bridge_checkpoint_lsn",
		"The checkpointed commit LSN as a number (bytes into the WAL).", []string{"source"}, nil)
	descCkptAge = prometheus.NewDesc("bridge_checkpoint_age_seconds",
		"How long the oldest delivered transaction not yet covered by the checkpoint has waited; 0 when the checkpoint covers everything delivered.", []string{"source"}, nil)
	descLagBytes = prometheus.NewDesc("bridge_lag_bytes",
		"WAL bytes between the server's WAL end (last slot poll) and the checkpoint.", []string{"source"}, nil)
	descLagSeconds = prometheus.NewDesc("bridge_lag_seconds",
		"Delivery time minus commit time of the last delivered transaction.", []string{"source"}, nil)
	descLastCommit = prometheus.NewDesc("bridge_last_delivered_commit_timestamp_seconds",
		"Commit time (Unix seconds) of the last delivered transaction; time() minus it is how old the newest delivered data is.", []string{"source"}, nil)
	descSinkLSN = prometheus.NewDesc("bridge_sink_written_lsn",
		"Commit LSN (bytes into the WAL) up to which the sink holds what the routes give it, by source and sink. Postgres is acknowledged only what every sink holds: the lowest is the sink holding the slot back.", []string{"source", "sink"}, nil)
	descSinkDead = prometheus.NewDesc("bridge_sink_dead_letters_total",
		"Changes a sink stored on its dead_letter_subject instead of their subject because the server would refuse them for good (too large, subject not bound to the stream), by source and sink.", []string{"source", "sink"}, nil)
	descSchemaHeld = prometheus.NewDesc("bridge_schema_held_tables",
		"Tables whose breaking schema change a route holds until the operator resumes the source, by source and policy (on_schema_change: pause holds the source, dead_letter the table's changes); 0 when none, or schemas are off.", []string{"source", "policy"}, nil)
	descSchemaDead = prometheus.NewDesc("bridge_schema_dead_lettered_total",
		"Changes of tables held by a breaking schema change put on the dead-letter subjects of routes with on_schema_change: dead_letter, by source. A run that restarts routes the undelivered ones again.", []string{"source"}, nil)
	descSchemaVersions = prometheus.NewDesc("bridge_schema_versions_total",
		"Schema versions (new shapes of tables) this process registered in the schema registry, by source.", []string{"source"}, nil)
	descSlotExists = prometheus.NewDesc("bridge_slot_exists",
		"1 when the replication slot exists (last slot poll).", []string{"source", "slot"}, nil)
	descSlotActive = prometheus.NewDesc("bridge_slot_active",
		"1 when a walsender is streaming from the slot.", []string{"source", "slot"}, nil)
	descSlotRetained = prometheus.NewDesc("bridge_slot_retained_wal_bytes",
		"WAL the slot keeps on the server: WAL end minus restart_lsn.", []string{"source", "slot"}, nil)
	descSlotSafe = prometheus.NewDesc("bridge_slot_safe_wal_bytes",
		"WAL that can still be written before the slot is invalidated (safe_wal_size; only with max_slot_wal_keep_size).", []string{"source", "slot"}, nil)
	descSlotStatus = prometheus.NewDesc("bridge_slot_wal_status",
		"1 for the slot's wal_status (reserved, extended, unreserved, lost), 0 for the others.", []string{"source", "slot", "wal_status"}, nil)
	descSlotFailover = prometheus.NewDesc("bridge_slot_failover",
		"1 when the slot is a failover slot (PostgreSQL 17, source option failover: true).", []string{"source", "slot"}, nil)
	descSlotSyncedStandbys = prometheus.NewDesc("bridge_slot_synced_standbys",
		"Standbys among the hosts of the source's DSN that hold a synced copy of the failover slot that their promotion keeps (0 for a slot that is not a failover slot).", []string{"source", "slot"}, nil)
	descSlotFailoverReady = prometheus.NewDesc("bridge_slot_failover_ready",
		"1 when a failover to a standby of the DSN loses nothing of the stream: a failover slot, synchronized_standby_slots set on the primary, and a standby holding a synced copy (0 for a slot that is not a failover slot).", []string{"source", "slot"}, nil)
)

var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

func (c *pipeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDelivered, descReady, descCkptLSN, descCkptAge, descLagBytes, descLagSeconds,
		descLastCommit, descSinkLSN, descSinkDead, descSchemaHeld, descSchemaDead, descSchemaVersions, descSlotExists, descSlotActive, descSlotRetained, descSlotSafe, descSlotStatus,
		descSlotFailover, descSlotSyncedStandbys, descSlotFailoverReady} {
		ch <- d
	}
}

func (c *pipeCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, pt := range (*Metrics)(c).Pipes() {
		src, p := pt.source, pt.state
		ckpt := p.Checkpointed()
		ch <- prometheus.MustNewConstMetric(descDelivered, prometheus.CounterValue, float64(p.Delivered()), src)
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(p.Ready()), src)
		ch <- prometheus.MustNewConstMetric(descCkptLSN, prometheus.GaugeValue, float64(ckpt), src)
		ch <- prometheus.MustNewConstMetric(descCkptAge, prometheus.GaugeValue, pt.CheckpointAge(now).Seconds(), src)
		pt.dmu.Lock()
		lastCommit, lastDelay := pt.lastCommit, pt.lastDelay
		pt.dmu.Unlock()
		if !lastCommit.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLagSeconds, prometheus.GaugeValue, max(lastDelay.Seconds(), 0), src)
			ch <- prometheus.MustNewConstMetric(descLastCommit, prometheus.GaugeValue, float64(lastCommit.UnixNano())/1e9, src)
		}
		if sp, ok := p.(SinkPositions); ok {
			for sink, lsn := range sp.SinkWritten() {
				ch <- prometheus.MustNewConstMetric(descSinkLSN, prometheus.GaugeValue, float64(lsn), src, sink)
			}
		}
		if sd, ok := p.(SinkDeadLetters); ok {
			for sink, n := range sd.SinkDeadLetters() {
				ch <- prometheus.MustNewConstMetric(descSinkDead, prometheus.CounterValue, float64(n), src, sink)
			}
		}
		// Exported for every source (0 with schemas off), so that the
		// dashboard and BridgeSchemaChangeHeld find the series.
		var pause, dead int
		var deadLettered, versions uint64
		if ss, ok := p.(SchemaStats); ok {
			pause, dead, deadLettered, versions = ss.SchemaStats()
		}
		ch <- prometheus.MustNewConstMetric(descSchemaHeld, prometheus.GaugeValue, float64(pause), src, "pause")
		ch <- prometheus.MustNewConstMetric(descSchemaHeld, prometheus.GaugeValue, float64(dead), src, "dead_letter")
		ch <- prometheus.MustNewConstMetric(descSchemaDead, prometheus.CounterValue, float64(deadLettered), src)
		ch <- prometheus.MustNewConstMetric(descSchemaVersions, prometheus.CounterValue, float64(versions), src)
		if pt.slot == nil {
			continue
		}
		sg, ok := pt.slot.Last()
		if !ok {
			continue
		}
		lag := 0.0
		if sg.Row.CurrentWAL > ckpt {
			lag = float64(sg.Row.CurrentWAL - ckpt)
		}
		ch <- prometheus.MustNewConstMetric(descLagBytes, prometheus.GaugeValue, lag, src)
		r := sg.Row
		ch <- prometheus.MustNewConstMetric(descSlotExists, prometheus.GaugeValue, b2f(r.Exists), src, sg.Slot)
		if !r.Exists {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descSlotActive, prometheus.GaugeValue, b2f(r.Active), src, sg.Slot)
		ch <- prometheus.MustNewConstMetric(descSlotRetained, prometheus.GaugeValue, float64(r.Retained()), src, sg.Slot)
		if r.SafeWALSize != nil {
			ch <- prometheus.MustNewConstMetric(descSlotSafe, prometheus.GaugeValue, float64(*r.SafeWALSize), src, sg.Slot)
		}
		for _, s := range walStatuses {
			ch <- prometheus.MustNewConstMetric(descSlotStatus, prometheus.GaugeValue, b2f(r.WALStatus == s), src, sg.Slot, s)
		}
		ch <- prometheus.MustNewConstMetric(descSlotFailover, prometheus.GaugeValue, b2f(r.Failover), src, sg.Slot)
		// Exported for every slot (0 for one that is not a failover slot),
		// so that dashboards and alerts find the series before the option
		// is turned on.
		synced, ready := 0, false
		if r.Failover {
			synced, ready = r.FailoverStandbys(), r.FailoverReady()
		}
		ch <- prometheus.MustNewConstMetric(descSlotSyncedStandbys, prometheus.GaugeValue, float64(synced), src, sg.Slot)
		ch <- prometheus.MustNewConstMetric(descSlotFailoverReady, prometheus.GaugeValue, b2f(ready), src, sg.Slot)
	}
}

// errorCause classifies an error that ended a run, for metric labels.
func errorCause(err error) string {
	var be *sinks.BatchError
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &be), errors.Is(err, sinks.ErrNotConnected):
		return "sink"
	case errors.As(err, &pgErr), errors.As(err, &connErr):
		return "postgres"
	case errors.As(err, &apiErr), errors.Is(err, checkpoint.ErrFenced), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrStaleConnection):
		return "nats"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case retry.IsConnectionLoss(err):
		return "connection"
	}
	return "other"
}
