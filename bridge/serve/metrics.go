package serve

// Metrics of `bridge serve` on its /metrics (docs/feeds.md). Every
// Server has its own Prometheus registry; nothing is registered
// globally.

import (
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bridgecdc/bridge/bridge/feeds"
)

// Modes of a feed request: the mode label.
const (
	modeLongPoll = "longpoll"
	modeSSE      = "sse"
)

// Outcomes of a feed request: the outcome label. A long-poll's outcome is
// its response; an SSE request's is the response that starts (ok) or
// refuses the stream, and how the stream ended is an SSE disconnect reason.
const (
	outcomeOK         = "ok"
	outcomeRefetch    = "must-refetch"
	outcomeBadRequest = "bad-request"
	outcomeTooMany    = "too-many-requests"
	outcomeOverloaded = "overloaded"
	outcomeClientGone = "client-gone" // a long-poll whose client left before the response
	// Refused by serve.auth: no or an invalid token (401), a table or
	// claim not granted (403).
	outcomeUnauthorized = "unauthorized"
	outcomeForbidden    = "forbidden"
)

// Reasons an SSE stream ended: the reason label of the disconnects.
const (
	disconnectSlow         = "slow"          // too far behind the stream's head (max_lag)
	disconnectWriteTimeout = "write-timeout" // an event not taken within write_timeout
	disconnectClientGone   = "client-gone"   // the client closed the stream
	disconnectRefetch      = "must-refetch"  // a must-refetch event ended the stream
	disconnectError        = "error"         // an error event (the server closing, the stream unreadable)
	disconnectExpired      = "expired"       // the caller's token expired
)

var (
	requestModes    = []string{modeLongPoll, modeSSE}
	requestOutcomes = []string{outcomeOK, outcomeRefetch, outcomeBadRequest, outcomeTooMany, outcomeOverloaded, outcomeClientGone, outcomeUnauthorized, outcomeForbidden}
	refetchReasons  = []string{feeds.ReasonGone, feeds.ReasonStream, feeds.ReasonResync, feeds.ReasonEpoch, feeds.ReasonTruncate}
	sseEndReasons   = []string{disconnectSlow, disconnectWriteTimeout, disconnectClientGone, disconnectRefetch, disconnectError, disconnectExpired}
)

// feedMetrics is a Server's registry and the vectors its handlers feed.
type feedMetrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.CounterVec
	refetches   *prometheus.CounterVec
	disconnects *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	delivered   *prometheus.CounterVec
}

// newFeedMetrics registers the metrics of s, reading fs's Stats and s's
// admission count at scrape time.
func newFeedMetrics(s *Server, fs *feeds.Feeds) *feedMetrics {
	m := &feedMetrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_feeds_requests_total",
			Help: "Feed requests by mode (longpoll, sse) and outcome (ok, must-refetch, bad-request, too-many-requests, overloaded, client-gone, unauthorized, forbidden). An SSE request counts once, when its stream starts (ok) or is refused.",
		}, []string{"mode", "outcome"}),
		refetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_feeds_must_refetch_total",
			Help: "Must-refetch answers (409 responses and SSE must-refetch events) by reason (gone, stream, resync, epoch, truncate).",
		}, []string{"reason"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_feeds_sse_disconnects_total",
			Help: "SSE streams ended, by reason: slow (behind by more than max_lag), write-timeout, client-gone, must-refetch, error, expired (the caller's token).",
		}, []string{"reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bridge_feeds_delivery_latency_seconds",
			Help:    "Time from this process reading a change from the stream to the response or event carrying it being written, by mode; includes the wait for a client's next long-poll. Changes read for feeds behind the window (catch-ups) are not observed.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"mode"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_feeds_changes_delivered_total",
			Help: "Changes written in long-poll responses and SSE events, by mode; catch-ups included.",
		}, []string{"mode"}),
	}
	for _, mode := range requestModes {
		for _, o := range requestOutcomes {
			m.requests.WithLabelValues(mode, o)
		}
		m.latency.WithLabelValues(mode)
		m.delivered.WithLabelValues(mode)
	}
	for _, r := range refetchReasons {
		m.refetches.WithLabelValues(r)
	}
	for _, r := range sseEndReasons {
		m.disconnects.WithLabelValues(r)
	}

	gauge := func(name, help string, f func(feeds.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(fs.Stats()) })
	}
	counter := func(name, help string, f func(feeds.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f(fs.Stats())) })
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests, m.refetches, m.disconnects, m.latency, m.delivered,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "bridge_feeds_requests_in_progress",
			Help: "Feed requests (long-polls and SSE streams) admitted and not finished; max_conns bounds it.",
		}, func() float64 { return float64(s.inProgress()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "bridge_feeds_ready",
			Help: "1 while the stream consumer is at a transaction boundary (/readyz answers 200), else 0.",
		}, func() float64 {
			if fs.Ready() {
				return 1
			}
			return 0
		}),
		gauge("bridge_feeds_registered", "Feeds registered: one per feed request being served.",
			func(st feeds.Stats) float64 { return float64(st.Feeds) }),
		gauge("bridge_feeds_waiting", "Feeds parked until a matching transaction arrives.",
			func(st feeds.Stats) float64 { return float64(st.Waiting) }),
		gauge("bridge_feeds_head_sequence", "Stream sequence of the position: the last transaction boundary read.",
			func(st feeds.Stats) float64 { return float64(st.Head) }),
		gauge("bridge_feeds_window_start_sequence", "The in-memory window serves tokens at or after this stream sequence; older tokens are read from the stream (catch-ups).",
			func(st feeds.Stats) float64 { return float64(st.WindowFrom) }),
		gauge("bridge_feeds_window_transactions", "Transactions in the in-memory window (window_txns bounds it).",
			func(st feeds.Stats) float64 { return float64(st.WindowTxns) }),
		gauge("bridge_feeds_projections", "Column sets (columns=) held: in use, or idle for less than projection_idle (max_projections bounds it).",
			func(st feeds.Stats) float64 { return float64(st.Projections) }),
		gauge("bridge_feeds_encoded_bytes", "Bytes of the window's change encodings, counted in its memory bound.",
			func(st feeds.Stats) float64 { return float64(st.EncodedBytes) }),
		counter("bridge_feeds_serialisations_total", "Change encodings made: one per change, projection and delivery kind, shared by every feed carrying it.",
			func(st feeds.Stats) int64 { return st.Serialisations }),
		counter("bridge_feeds_catch_ups_total", "Reads from the stream itself for feeds behind the in-memory window.",
			func(st feeds.Stats) int64 { return st.CatchUps }),
		counter("bridge_feeds_replays_total", "Passes over history shared by the feeds far behind the head (reconnecting clients): the stream is read once for all of them.",
			func(st feeds.Stats) int64 { return st.Replays }),
		counter("bridge_feeds_backfills_total", "Replays whose reads from the stream were added to the in-memory window, so that later reconnections there are served from memory.",
			func(st feeds.Stats) int64 { return st.Backfills }),
		counter("bridge_feeds_catch_up_messages_total", "Messages read from the stream itself for feeds behind the in-memory window.",
			func(st feeds.Stats) int64 { return st.CatchUpMessages }),
		counter("bridge_feeds_gaps_total", "Jumps of the stream sequence met by the consumer (messages deleted by the stream's limits).",
			func(st feeds.Stats) int64 { return st.Gaps }),
		counter("bridge_feeds_stream_recreates_total", "Times the stream was found deleted and recreated; every feed then gets must-refetch.",
			func(st feeds.Stats) int64 { return st.Recreates }),
	)
	return m
}

func (m *feedMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *feedMetrics) request(mode, outcome string) {
	m.requests.WithLabelValues(mode, outcome).Inc()
}

func (m *feedMetrics) refetch(re *feeds.RefetchError) {
	m.refetches.WithLabelValues(re.Reason).Inc()
}

func (m *feedMetrics) disconnect(reason string) {
	m.disconnects.WithLabelValues(reason).Inc()
}

// deliver counts the changes of b, written at now, and observes the
// latency of those read from the window.
func (m *feedMetrics) deliver(mode string, b feeds.Batch, now time.Time) {
	if len(b.Changes) == 0 {
		return
	}
	m.delivered.WithLabelValues(mode).Add(float64(len(b.Changes)))
	h := m.latency.WithLabelValues(mode)
	for i := range b.Changes {
		if rt := b.Changes[i].Received; !rt.IsZero() {
			h.Observe(now.Sub(rt).Seconds())
		}
	}
}

// writeFailure names why an SSE write failed: its deadline passed, or the
// client is gone.
func writeFailure(err error) string {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return disconnectWriteTimeout
	}
	return disconnectClientGone
}
