package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/control"
)

// TestHistoryRingIsBounded: a source's ring keeps the last size samples,
// oldest first, and the rate is the delivered count's increase over time
// (unknown for the first sample and after the count went down).
func TestHistoryRingIsBounded(t *testing.T) {
	h := newHistory(3)
	t0 := time.Unix(1000, 0)
	for i, d := range []uint64{0, 10, 30, 60, 5} {
		h.record("app", t0.Add(time.Duration(i)*2*time.Second), d, [4]float64{float64(i), -1, 0, 100})
	}
	p := h.points("app")
	require.Len(t, p.At, 3)
	assert.Equal(t, []int64{t0.Add(4 * time.Second).UnixMilli(), t0.Add(6 * time.Second).UnixMilli(), t0.Add(8 * time.Second).UnixMilli()}, p.At)
	assert.Equal(t, []float64{10, 15, -1}, p.Series["rate"], "(30-10)/2s, (60-30)/2s, then a count that went down")
	assert.Equal(t, []float64{2, 3, 4}, p.Series["lag_bytes"])
	assert.Len(t, h.rings["app"].buf, 3, "the ring never grows")

	h.record("gone", t0, 1, [4]float64{})
	h.forget(map[string]bool{"app": true})
	assert.Empty(t, h.points("gone").At, "a removed source's history is dropped")
	assert.Len(t, h.points("app").At, 3)
}

// fakeActions records the actions called; err, when set, is returned.
type fakeActions struct {
	calls []string
	by    []string // the actor of each action
	err   error
}

func (f *fakeActions) Pause(_ context.Context, source string, req control.PauseRequest) (control.SourceReply, error) {
	f.calls = append(f.calls, "pause "+source+" "+req.Reason)
	f.by = append(f.by, req.By)
	return control.SourceReply{Source: control.SourceStatus{Name: source, State: "paused"}}, f.err
}

func (f *fakeActions) Resume(_ context.Context, source string, req control.ResumeRequest) (control.SourceReply, error) {
	f.calls = append(f.calls, "resume "+source)
	f.by = append(f.by, req.By)
	return control.SourceReply{Source: control.SourceStatus{Name: source, State: "streaming"}}, f.err
}

func (f *fakeActions) Snapshot(_ context.Context, source string, req control.SnapshotRequest) (control.SnapshotReply, error) {
	f.calls = append(f.calls, "snapshot "+source+" "+strings.Join(req.Tables, ","))
	f.by = append(f.by, req.By)
	return control.SnapshotReply{Source: source, ID: "s1", Tables: req.Tables}, f.err
}

func status(context.Context) control.StatusReply {
	lag := uint64(4096)
	return control.StatusReply{Identity: control.Identity{Bridge: "shop", Instance: "i1"}, ConfigRev: "r1",
		Sources: []control.SourceStatus{{Name: "app", Type: "pgoutput", State: "streaming", Delivered: 42, Sinks: []string{"js"},
			Slot: &control.Slot{Name: "s", Exists: true, RetainedWALBytes: 8192, WALStatus: "reserved"}, LagBytes: &lag}}}
}

func newConsole(t *testing.T, opt Options) http.Handler {
	t.Helper()
	if opt.Status == nil {
		opt.Status = status
	}
	c, err := New(opt)
	require.NoError(t, err)
	return c.Handler()
}

func do(h http.Handler, method, path, body string, header map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

var jsonCT = map[string]string{"Content-Type": "application/json"}

// TestActions: the buttons' endpoint calls the control plane's action
// with the request decoded, maps a control error to its HTTP status, and
// refuses what a page elsewhere could send (no JSON content type, another
// origin) without calling anything.
func TestActions(t *testing.T) {
	fa := &fakeActions{}
	h := newConsole(t, Options{Actions: fa})

	w := do(h, "POST", "/console/api/sources/app/pause", `{"reason":"maintenance"}`, jsonCT)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Contains(t, w.Body.String(), `"state":"paused"`)
	w = do(h, "POST", "/console/api/sources/app/snapshot", `{"tables":["public.items"]}`, jsonCT)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	w = do(h, "POST", "/console/api/sources/app/resume", ``, jsonCT)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Equal(t, []string{"pause app maintenance", "snapshot app public.items", "resume app"}, fa.calls)

	fa.calls = nil
	w = do(h, "POST", "/console/api/sources/app/pause", `{}`, map[string]string{"Content-Type": "text/plain"})
	assert.Equal(t, http.StatusUnsupportedMediaType, w.Code)
	w = do(h, "POST", "/console/api/sources/app/pause", `{}`, map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"})
	assert.Equal(t, http.StatusForbidden, w.Code)
	assert.Contains(t, w.Body.String(), "evil.example")
	w = do(h, "POST", "/console/api/sources/app/resync", `{}`, jsonCT)
	assert.Equal(t, http.StatusNotFound, w.Code, "resync is not a console action")
	w = do(h, "POST", "/console/api/sources/app/pause", `{"reason":`, jsonCT)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Empty(t, fa.calls, "nothing refused reached the control plane")

	fa.err = control.Errorf(control.CodeConflict, "source %q is fenced, not paused", "app")
	w = do(h, "POST", "/console/api/sources/app/pause", `{}`, jsonCT)
	assert.Equal(t, http.StatusConflict, w.Code)
	assert.Contains(t, w.Body.String(), `source \"app\" is fenced, not paused`)

	off := newConsole(t, Options{})
	w = do(off, "POST", "/console/api/sources/app/pause", `{}`, jsonCT)
	assert.Equal(t, http.StatusForbidden, w.Code, "no Actions: no buttons")
}

// TestProtect: the API goes through Protect; the page's files, which hold
// no data, do not.
func TestProtect(t *testing.T) {
	fa := &fakeActions{}
	protect := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer good" {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	feed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("feed " + r.URL.Path)) })
	h := newConsole(t, Options{Actions: fa, Protect: protect, Feed: feed})
	for _, path := range []string{"/console/", "/console/console.js", "/console/console.css"} {
		w := do(h, "GET", path, "", nil)
		assert.Equal(t, http.StatusOK, w.Code, path)
	}
	assert.Equal(t, http.StatusUnauthorized, do(h, "GET", "/console/api/overview", "", nil).Code)
	assert.Equal(t, http.StatusUnauthorized, do(h, "GET", "/console/api/v1/feed?sse=1", "", nil).Code)
	assert.Equal(t, http.StatusUnauthorized, do(h, "POST", "/console/api/sources/app/pause", "{}", jsonCT).Code)
	assert.Empty(t, fa.calls)

	auth := map[string]string{"Authorization": "Bearer good", "Content-Type": "application/json"}
	assert.Equal(t, http.StatusOK, do(h, "GET", "/console/api/overview", "", auth).Code)
	w := do(h, "GET", "/console/api/v1/feed?sse=1", "", auth)
	assert.Equal(t, "feed /v1/feed", w.Body.String(), "the tail reaches the feed handler at its own path")
	assert.Equal(t, http.StatusOK, do(h, "POST", "/console/api/sources/app/pause", "{}", auth).Code)
}

// TestAllow: the overview and the buttons ask Allow, for reading and for
// acting; a refusal is a 403 with its reason, the overview offers the
// buttons only to callers who may press them, and the actor recorded is
// the one Allow names, never the body's "by".
func TestAllow(t *testing.T) {
	fa := &fakeActions{}
	// Bearer reader may read, Bearer operator may act.
	allow := func(r *http.Request, control bool) (string, error) {
		switch who := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); {
		case who == "operator", who == "reader" && !control:
			return "token sub " + who, nil
		case who == "reader":
			return who, errors.New("pausing, resuming and snapshotting sources needs bridge:control, which the token does not grant (claim \"scope\")")
		default:
			return who, errors.New("reading the console's overview needs bridge:status or bridge:control, which the token does not grant (claim \"scope\")")
		}
	}
	h := newConsole(t, Options{Actions: fa, Allow: allow})
	as := func(who string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + who, "Content-Type": "application/json"}
	}
	overview := func(who string) (int, Overview, string) {
		w := do(h, "GET", "/console/api/overview", "", as(who))
		var o Overview
		_ = json.Unmarshal(w.Body.Bytes(), &o)
		return w.Code, o, w.Body.String()
	}

	code, _, body := overview("tenant")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, `"detail":"reading the console's overview needs bridge:status or bridge:control`)
	code, o, _ := overview("reader")
	assert.Equal(t, http.StatusOK, code)
	assert.False(t, o.Actions, "no buttons for a reader")
	code, o, _ = overview("operator")
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, o.Actions)

	for _, who := range []string{"tenant", "reader"} {
		w := do(h, "POST", "/console/api/sources/app/pause", `{"by":"someone else"}`, as(who))
		assert.Equal(t, http.StatusForbidden, w.Code, who)
		assert.Contains(t, w.Body.String(), "needs bridge:", who)
	}
	assert.Empty(t, fa.calls, "nothing refused reached the control plane")
	for _, a := range []string{"pause", "resume", "snapshot"} {
		w := do(h, "POST", "/console/api/sources/app/"+a, `{"by":"someone else"}`, as("operator"))
		assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
	}
	assert.Equal(t, []string{"console, token sub operator", "console, token sub operator", "console, token sub operator"}, fa.by,
		"the actor is who authenticated, not the body's by")

	fa.by = nil
	open := newConsole(t, Options{Actions: fa})
	w := do(open, "POST", "/console/api/sources/app/pause", `{"by":"someone else"}`, jsonCT)
	require.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, []string{"console, no authentication, from 192.0.2.1:1234"}, fa.by)
}

// TestOverview: the overview joins the control plane's status with the
// figures of the metrics registry: lag in seconds, checkpoint age, the
// sink's publish latency and errors, a snapshot's progress.
func TestOverview(t *testing.T) {
	reg := prometheus.NewRegistry()
	gauge := func(name string, labels prometheus.Labels, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: name, ConstLabels: labels})
		g.Set(v)
		reg.MustRegister(g)
	}
	app := prometheus.Labels{"source": "app"}
	gauge("bridge_lag_seconds", app, 1.5)
	gauge("bridge_checkpoint_age_seconds", app, 0.25)
	gauge("bridge_snapshot_running", app, 1)
	gauge("bridge_snapshot_tables_remaining", app, 1)
	gauge("bridge_snapshot_rows", prometheus.Labels{"source": "app", "table": "public.items"}, 250)
	gauge("bridge_snapshot_rows_estimate", prometheus.Labels{"source": "app", "table": "public.items"}, 1000)
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bridge_errors_total", Help: "e"}, []string{"source", "kind"})
	errs.WithLabelValues("app", "sink_write").Add(2)
	errs.WithLabelValues("app", "postgres").Add(1)
	pub := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bridge_publish_duration_seconds", Help: "p", Buckets: []float64{0.001, 0.01}}, []string{"source", "sink"})
	pub.WithLabelValues("app", "js").Observe(0.0005)
	pub.WithLabelValues("app", "js").Observe(0.005)
	sinkErrs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bridge_sink_write_errors_total", Help: "e"}, []string{"source", "sink"})
	sinkErrs.WithLabelValues("app", "js").Add(3)
	dead := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bridge_sink_dead_letters_total", Help: "d"}, []string{"source", "sink"})
	dead.WithLabelValues("app", "js").Add(5)
	reg.MustRegister(errs, pub, sinkErrs, dead)

	c, err := New(Options{Status: status, Gatherer: reg, Interval: time.Second})
	require.NoError(t, err)
	c.Sample(context.Background())
	w := do(c.Handler(), "GET", "/console/api/overview", "", nil)
	require.Equal(t, http.StatusOK, w.Code)
	var o Overview
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &o))
	require.Len(t, o.Sources, 1)
	s := o.Sources[0]
	assert.Equal(t, "streaming", s.State)
	assert.Equal(t, uint64(42), s.Delivered)
	require.NotNil(t, s.LagSeconds)
	assert.InDelta(t, 1.5, *s.LagSeconds, 1e-9)
	require.NotNil(t, s.CheckpointAgeSeconds)
	assert.InDelta(t, 0.25, *s.CheckpointAgeSeconds, 1e-9)
	assert.Equal(t, map[string]float64{"sink_write": 2, "postgres": 1}, s.Errors)
	assert.Equal(t, []float64{4096}, s.History.Series["lag_bytes"])
	assert.Equal(t, []float64{8192}, s.History.Series["retained_wal"])
	require.NotNil(t, s.Snapshot)
	assert.True(t, s.Snapshot.Running)
	require.Len(t, s.Snapshot.Tables, 1)
	assert.Equal(t, SnapshotTable{Table: "public.items", Rows: 250, Estimate: 1000, ETASeconds: -1}, s.Snapshot.Tables[0])

	require.Len(t, o.Sinks, 1)
	k := o.Sinks[0]
	assert.Equal(t, "js", k.Name)
	assert.Equal(t, uint64(42), k.Delivered)
	assert.InDelta(t, 3, k.WriteErrors, 1e-9, "the sink's own failed writes")
	require.NotNil(t, k.DeadLetters)
	assert.InDelta(t, 5, *k.DeadLetters, 1e-9)
	require.NotNil(t, k.Latency)
	assert.Equal(t, uint64(2), k.Latency.Count)
	assert.Equal(t, []Bucket{{LE: 0.001, Count: 1}, {LE: 0.01, Count: 2}}, k.Latency.Buckets)
	assert.False(t, o.Actions)
	assert.False(t, o.Tail)
}
