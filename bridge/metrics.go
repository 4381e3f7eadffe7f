package bridge

// Metrics on /metrics, and /livez and /readyz (DESIGN.md §6). Every App has
// its own Prometheus registry; nothing is registered globally.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// Defaults for a Config built in code, where zero values stand for them.
const (
	defaultSlotPoll         = 10 * time.Second
	defaultMaxCheckpointAge = time.Minute
)

// metrics is an App's registry and the vectors the pipelines feed.
type metrics struct {
	reg      *prometheus.Registry
	changes  *prometheus.CounterVec
	txns     *prometheus.CounterVec
	publish  *prometheus.HistogramVec
	restarts *prometheus.CounterVec
	errors   *prometheus.CounterVec

	mu    sync.Mutex
	pipes []*pipeTel
}

func newMetrics() *metrics {
	m := &metrics{
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
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "bridge_build_info", Help: "Always 1; the version label is the bridge's version.",
		ConstLabels: prometheus.Labels{"version": version()},
	})
	build.Set(1)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build, m.changes, m.txns, m.publish, m.restarts, m.errors, (*pipeCollector)(m),
	)
	return m
}

// add makes pt visible to /metrics and /readyz.
func (m *metrics) add(pt *pipeTel) {
	m.mu.Lock()
	m.pipes = append(m.pipes, pt)
	m.mu.Unlock()
}

func (m *metrics) snapshot() []*pipeTel {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*pipeTel(nil), m.pipes...)
}

// pipeCollector reports the pipelines' state at scrape time.
type pipeCollector metrics

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
)

var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

func (c *pipeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDelivered, descReady, descCkptLSN, descCkptAge, descLagBytes, descLagSeconds,
		descLastCommit, descSlotExists, descSlotActive, descSlotRetained, descSlotSafe, descSlotStatus} {
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
	for _, pt := range (*metrics)(c).snapshot() {
		src, p := pt.source, pt.p
		ckpt := p.Checkpointed()
		ch <- prometheus.MustNewConstMetric(descDelivered, prometheus.CounterValue, float64(p.Delivered()), src)
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(p.Ready()), src)
		ch <- prometheus.MustNewConstMetric(descCkptLSN, prometheus.GaugeValue, float64(ckpt), src)
		ch <- prometheus.MustNewConstMetric(descCkptAge, prometheus.GaugeValue, pt.checkpointAge(now).Seconds(), src)
		pt.dmu.Lock()
		lastCommit, lastDelay := pt.lastCommit, pt.lastDelay
		pt.dmu.Unlock()
		if !lastCommit.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLagSeconds, prometheus.GaugeValue, max(lastDelay.Seconds(), 0), src)
			ch <- prometheus.MustNewConstMetric(descLastCommit, prometheus.GaugeValue, float64(lastCommit.UnixNano())/1e9, src)
		}
		sg, ok := pt.slot.get()
		if !ok {
			continue
		}
		lag := 0.0
		if sg.row.CurrentWAL > ckpt {
			lag = float64(sg.row.CurrentWAL - ckpt)
		}
		ch <- prometheus.MustNewConstMetric(descLagBytes, prometheus.GaugeValue, lag, src)
		r := sg.row
		ch <- prometheus.MustNewConstMetric(descSlotExists, prometheus.GaugeValue, b2f(r.Exists), src, sg.slot)
		if !r.Exists {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descSlotActive, prometheus.GaugeValue, b2f(r.Active), src, sg.slot)
		ch <- prometheus.MustNewConstMetric(descSlotRetained, prometheus.GaugeValue, float64(r.Retained()), src, sg.slot)
		if r.SafeWALSize != nil {
			ch <- prometheus.MustNewConstMetric(descSlotSafe, prometheus.GaugeValue, float64(*r.SafeWALSize), src, sg.slot)
		}
		for _, s := range walStatuses {
			ch <- prometheus.MustNewConstMetric(descSlotStatus, prometheus.GaugeValue, b2f(r.WALStatus == s), src, sg.slot, s)
		}
	}
}

// timedSink times each Write for bridge_publish_duration_seconds and counts
// failed ones.
type timedSink struct {
	sinks.Sink
	hist prometheus.Observer
	errs prometheus.Counter
}

func (s *timedSink) Write(ctx context.Context, batch []cdc.Change) error {
	start := time.Now()
	err := s.Sink.Write(ctx, batch)
	if err != nil {
		s.errs.Inc()
		return err
	}
	s.hist.Observe(time.Since(start).Seconds())
	return nil
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
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrConnectionReconnecting):
		return "nats"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case IsConnectionLoss(err):
		return "connection"
	}
	return "other"
}

// slotRow is a replication slot's row with the server's WAL end.
type slotRow struct {
	Exists         bool
	Active         bool
	ActivePID      int
	ConfirmedFlush cdc.LSN
	RestartLSN     cdc.LSN
	WALStatus      string
	SafeWALSize    *int64
	// CurrentWAL is pg_current_wal_lsn(), or on a standby the last WAL
	// received.
	CurrentWAL cdc.LSN
}

// Retained returns the WAL bytes the slot holds back.
func (r slotRow) Retained() uint64 {
	if !r.Exists || r.RestartLSN == 0 || r.CurrentWAL < r.RestartLSN {
		return 0
	}
	return uint64(r.CurrentWAL - r.RestartLSN)
}

// readSlotRow reads slot's row (Exists false when there is none) and the
// WAL end, on a regular connection. Needs PostgreSQL 13 or later.
func readSlotRow(ctx context.Context, c *pgx.Conn, slot string) (slotRow, error) {
	var r slotRow
	var cur, confirmed, restart, status *string
	var pid *int32
	err := c.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END)::text,
			s.slot_name IS NOT NULL, coalesce(s.active, false), s.active_pid, s.confirmed_flush_lsn::text, s.restart_lsn::text,
			s.wal_status, s.safe_wal_size
		FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).
		Scan(&cur, &r.Exists, &r.Active, &pid, &confirmed, &restart, &status, &r.SafeWALSize)
	if err != nil {
		return r, fmt.Errorf("reading slot %q: %w", slot, err)
	}
	parse := func(s *string) cdc.LSN {
		if s == nil {
			return 0
		}
		l, _ := cdc.ParseLSN(*s)
		return l
	}
	r.CurrentWAL, r.ConfirmedFlush, r.RestartLSN = parse(cur), parse(confirmed), parse(restart)
	if pid != nil {
		r.ActivePID = int(*pid)
	}
	if status != nil {
		r.WALStatus = *status
	}
	return r, nil
}

// pgSource is what status and the slot poller need of a Postgres source's
// config block, decoded leniently (other keys and other source types are
// ignored).
type pgSource struct {
	DSN, Slot string
}

// pgSourceOf returns the source's DSN and slot; ok is false when its block
// has no dsn.
func pgSourceOf(name string, p config.Plugin) (pgSource, bool) {
	dsn, _ := p.Config["dsn"].(string)
	slot, _ := p.Config["slot"].(string)
	if slot == "" {
		slot = "bridge_" + name
	}
	return pgSource{DSN: dsn, Slot: slot}, dsn != ""
}

// connectPG opens a regular connection for status queries.
func connectPG(ctx context.Context, dsn, appName string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing dsn %s: %w", config.Redact(dsn), err)
	}
	cc.RuntimeParams["application_name"] = appName
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 10 * time.Second
	}
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", config.Redact(dsn), err)
	}
	return c, nil
}

// slotGauge is the last slot poll.
type slotGauge struct {
	mu   sync.Mutex
	ok   bool
	slot string
	row  slotRow
	at   time.Time // when the poll was taken
}

type slotSnap struct {
	slot string
	row  slotRow
}

func (g *slotGauge) set(slot string, r slotRow, ok bool) {
	g.mu.Lock()
	g.slot, g.row, g.ok, g.at = slot, r, ok, time.Now()
	g.mu.Unlock()
}

func (g *slotGauge) get() (slotSnap, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slotSnap{slot: g.slot, row: g.row}, g.ok
}

// pollSlot reads the source's slot every interval until ctx ends.
func pollSlot(ctx context.Context, pt *pipeTel, src pgSource, every time.Duration, log *slog.Logger) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
	}()
	failing := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, max(every, 5*time.Second))
		var err error
		if conn == nil {
			conn, err = connectPG(qctx, src.DSN, "bridge:"+pt.source+":metrics")
		}
		var r slotRow
		if err == nil {
			r, err = readSlotRow(qctx, conn, src.Slot)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			pt.slot.set(src.Slot, slotRow{}, false)
			if pt.m != nil {
				pt.m.errors.WithLabelValues(pt.source, "slot_poll").Inc()
			}
			if !failing {
				log.Warn("cannot read the replication slot for metrics; retrying", "slot", src.Slot, "err", err)
			}
			failing = true
			if conn != nil {
				cctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = conn.Close(cctx)
				cancel()
				conn = nil
			}
		default:
			if failing {
				log.Info("reading the replication slot for metrics again", "slot", src.Slot)
			}
			failing = false
			pt.slot.set(src.Slot, r, true)
		}
		t.Reset(every)
	}
}

// startHTTP listens on http.listen and serves /metrics, /livez and /readyz.
func (a *App) startHTTP() error {
	addr := a.cfg.HTTP.Listen
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http.listen: serving /metrics on %s: %w (choose another address, or set it to \"\" to turn the server off)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	a.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.httpAddr = ln.Addr().String()
	srv := a.httpSrv
	go func() { _ = srv.Serve(ln) }()
	a.log.Info("serving /metrics, /livez and /readyz", "addr", a.httpAddr)
	return nil
}

// readyz answers 200 when every pipeline is streaming and its checkpoint
// keeps up with deliveries (http.max_checkpoint_age), else 503; the body
// has a line per source.
func (a *App) readyz(w http.ResponseWriter, _ *http.Request) {
	maxAge := a.cfg.HTTP.MaxCheckpointAge
	if maxAge <= 0 {
		maxAge = defaultMaxCheckpointAge
	}
	pipes := a.metrics.snapshot()
	sort.Slice(pipes, func(i, j int) bool { return pipes[i].source < pipes[j].source })
	ok := len(pipes) > 0
	var b strings.Builder
	if len(pipes) == 0 {
		b.WriteString("starting\n")
	}
	now := time.Now()
	for _, pt := range pipes {
		age := pt.checkpointAge(now)
		switch {
		case !pt.p.Ready():
			ok = false
			fmt.Fprintf(&b, "%s: not streaming\n", pt.source)
		case age > maxAge:
			ok = false
			fmt.Fprintf(&b, "%s: checkpoint %s behind deliveries (max %s)\n", pt.source, age.Round(time.Millisecond), maxAge)
		default:
			fmt.Fprintf(&b, "%s: streaming, checkpoint %s\n", pt.source, pt.p.Checkpointed())
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(b.String()))
}
