package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/natsjs"
)

// feedsEnv is a real in-process nats-server with a stream, written by the
// real nats_jetstream sink with bridge changes in the native format: what
// `bridge serve` reads, without Postgres.
type feedsEnv struct {
	t      testing.TB
	url    string
	stream string
	js     jetstream.JetStream
	sink   sinks.Sink
	lsn    cdc.LSN
}

// serveOrders is public.orders: id is the key.
var serveOrders = &cdc.Relation{ID: 1, Schema: "public", Table: "orders", ReplicaIdentity: 'f', Columns: []cdc.Column{
	{Name: "id", Type: "int8", Key: true}, {Name: "tenant", Type: "int8"}, {Name: "status", Type: "text"},
}}

func newFeedsEnv(t testing.TB, stream string) *feedsEnv {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"cdc.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	raw := map[string]any{"url": srv.URL(), "stream": stream, "create_stream": false}
	sk, err := natsjs.New((&config.Config{}).Decoder("sinks.main.config", raw), sinks.Env{Name: "main"})
	require.NoError(t, err)
	require.NoError(t, sk.Connect(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sk.Close(ctx)
	})
	return &feedsEnv{t: t, url: srv.URL(), stream: stream, js: js, sink: sk, lsn: 0x1000}
}

// insert writes one transaction inserting an order per tenant given (ids
// from id up), and returns the stream sequence of its last message.
func (e *feedsEnv) insert(id int64, tenants ...int64) {
	e.t.Helper()
	var ops []cdc.Change
	for i, tn := range tenants {
		ops = append(ops, cdc.Change{Op: cdc.OpInsert, After: []any{id + int64(i), tn, "open"}})
	}
	e.write(ops)
}

// truncate writes one transaction truncating public.orders.
func (e *feedsEnv) truncate() {
	e.t.Helper()
	e.write([]cdc.Change{{Op: cdc.OpTruncate}})
}

func (e *feedsEnv) write(tx []cdc.Change) {
	e.t.Helper()
	e.lsn += 0x100
	for i := range tx {
		c := &tx[i]
		c.Producer, c.Source, c.CommitLSN, c.LSN = "b.src.e1", "src", e.lsn, e.lsn-0x50
		c.Seq, c.TxSize, c.Xid, c.CommitTime = uint32(i), uint32(len(tx)), uint32(e.lsn), time.Unix(1700000000, 0).UTC()
		c.Schema, c.Table, c.Rel = serveOrders.Schema, serveOrders.Table, serveOrders
		c.Subject = "cdc.src.public.orders"
		c.Payload = format.AppendNative(nil, c)
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(e.t, e.sink.Write(ctx, tx))
}

// feeds opens a Feeds on the stream.
func (e *feedsEnv) feeds(cfg feeds.Config) *feeds.Feeds {
	e.t.Helper()
	cfg.Stream = e.stream
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	fs, err := feeds.New(ctx, e.js, cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(fs.Close)
	return fs
}

// parkPoll starts a long-poll as client that matches nothing and waits
// until the server has parked it; cancel ends it from the client side.
func parkPoll(t *testing.T, base, client string, waiting func() float64) (cancel func()) {
	t.Helper()
	before := waiting()
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/feed?timeout=60s&where="+url.QueryEscape(`{"eq":["tenant",999]}`), nil)
		req.Header.Set("X-Client", client)
		if r, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return waiting() > before }, 20*time.Second, 5*time.Millisecond, "long-poll of %s not parked", client)
	return func() { stop(); <-done }
}

// counter reads one sample of a scrape; a missing sample fails the test.
func counter(t *testing.T, base, name string, kv ...string) float64 {
	t.Helper()
	labels := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	v, ok := metricValue(scrape(t, base), name, labels)
	require.True(t, ok, "no sample %s%v", name, labels)
	return v
}

// TestServeMetrics drives long-polls and an SSE stream through a feed
// server on a real stream: deliveries from the window and from a catch-up,
// must-refetch for a token of another stream and for a truncate, a bad
// request, 429 and 503 from the admission limits, clients leaving; then
// checks that every counter on /metrics moved by exactly what happened.
func TestServeMetrics(t *testing.T) {
	defer parallel(t)()
	e := newFeedsEnv(t, "CDC")
	fs := e.feeds(feeds.Config{WindowTxns: 2})
	hs := httptest.NewServer(serve.New(fs, serve.Config{
		MaxConns: 2, MaxPerClient: 1, ClientHeader: "X-Client", Hold: time.Minute,
	}, testLogger(t)).Handler())
	t.Cleanup(hs.Close)
	metric := func(name string, kv ...string) float64 { return counter(t, hs.URL, name, kv...) }

	// Every series is there from the start, at zero.
	for _, o := range []string{"ok", "must-refetch", "bad-request", "too-many-requests", "overloaded", "client-gone"} {
		require.Zero(t, metric("bridge_feeds_requests_total", "mode", "longpoll", "outcome", o), o)
	}
	require.Zero(t, metric("bridge_feeds_sse_disconnects_total", "reason", "slow"))
	require.Zero(t, metric("bridge_feeds_must_refetch_total", "reason", "gone"))

	t0 := fs.Position()
	require.Zero(t, t0.Seq, "an empty stream")
	for i := range int64(5) {
		e.insert(10*i+1, 1) // five transactions of one change each, tenant 1
	}
	require.Eventually(t, func() bool { return fs.Position().Seq == 5 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, float64(5), metric("bridge_feeds_head_sequence"))
	require.Equal(t, float64(2), metric("bridge_feeds_window_transactions"), "window_txns")
	require.Equal(t, float64(3), metric("bridge_feeds_window_start_sequence"), "sequences 1-3 left the window")

	// A long-poll from the stream's start is far behind the window: it
	// rides a replay, one shared pass over the stream, which serves what
	// precedes the window (read from the stream: no receipt times) and the
	// window after it.
	q := func(kv ...string) url.Values {
		v := url.Values{"where": {`{"eq":["tenant",1]}`}, "timeout": {"5s"}}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	okPolls, delivered, fromWindow := 0, 0, 0
	resp, body := get(t, hs.URL, q("token", t0.String()), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
	okPolls++
	require.Len(t, body.Changes, 5, "the replay returns what precedes the window and the window")
	delivered += len(body.Changes)
	require.Equal(t, float64(1), metric("bridge_feeds_catch_ups_total"))
	require.Equal(t, float64(1), metric("bridge_feeds_replays_total"))
	require.Equal(t, float64(5), metric("bridge_feeds_changes_delivered_total", "mode", "longpoll"))
	fromWindow += 2 // sequences 4 and 5
	require.Equal(t, float64(fromWindow), metric("bridge_feeds_delivery_latency_seconds", "mode", "longpoll"),
		"the window's changes have receipt times, the 3 read from the stream none")
	tok := body.Token
	require.True(t, strings.HasSuffix(tok, ".5"), tok)

	// Two more transactions: served from the window, with receipt times.
	e.insert(51, 1)
	e.insert(61, 1)
	for !strings.HasSuffix(tok, ".7") {
		resp, body = get(t, hs.URL, q("token", tok), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
		require.NotEmpty(t, body.Changes)
		okPolls++
		delivered += len(body.Changes)
		fromWindow += len(body.Changes)
		tok = body.Token
	}
	require.Equal(t, 4, fromWindow)
	t5 := tok

	// A bad request, and a token of another stream.
	resp, _ = get(t, hs.URL, url.Values{"where": {`{"eq":["tenant"]}`}}, nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, body = get(t, hs.URL, q("token", "zzzz.1"), nil)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Equal(t, feeds.ReasonStream, body.Reason)

	// Admission: client a holds its one request, a second gets 429; with
	// b holding one too the server is full and c gets 503.
	waiting := func() float64 { return metric("bridge_feeds_waiting") }
	stopA := parkPoll(t, hs.URL, "a", waiting)
	resp, body = get(t, hs.URL, q(), http.Header{"X-Client": {"a"}})
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%+v", body)
	stopB := parkPoll(t, hs.URL, "b", waiting)
	require.Equal(t, float64(2), metric("bridge_feeds_requests_in_progress"))
	require.Equal(t, float64(2), metric("bridge_feeds_registered"))
	resp, body = get(t, hs.URL, q(), http.Header{"X-Client": {"c"}})
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%+v", body)
	stopA()
	stopB()
	require.Eventually(t, func() bool {
		return metric("bridge_feeds_requests_total", "mode", "longpoll", "outcome", "client-gone") == 2
	}, 20*time.Second, 10*time.Millisecond, "the server notices both clients leaving")

	// SSE: one change from the window, then the client leaves.
	sctx, scancel := context.WithTimeout(t.Context(), 30*time.Second)
	r := openSSE(t, sctx, hs.URL, q("token", t5), "")
	e.insert(100, 1)
	evs := readSSE(r.Body, func(ev sseEvent) bool { return ev.event == "changes" })
	require.Equal(t, "changes", evs[len(evs)-1].event)
	scancel()
	r.Body.Close()
	require.Eventually(t, func() bool {
		return metric("bridge_feeds_sse_disconnects_total", "reason", "client-gone") == 1
	}, 20*time.Second, 10*time.Millisecond)
	t6 := evs[len(evs)-1].id

	// A truncate of the table the feed reads.
	e.truncate()
	resp, body = get(t, hs.URL, q("token", t6), nil)
	require.Equal(t, http.StatusConflict, resp.StatusCode, "%+v", body)
	require.Equal(t, feeds.ReasonTruncate, body.Reason)

	fams := scrape(t, hs.URL)
	want := map[string]float64{
		`bridge_feeds_requests_total{mode="longpoll",outcome="ok"}`:                float64(okPolls),
		`bridge_feeds_requests_total{mode="longpoll",outcome="must-refetch"}`:      2,
		`bridge_feeds_requests_total{mode="longpoll",outcome="bad-request"}`:       1,
		`bridge_feeds_requests_total{mode="longpoll",outcome="too-many-requests"}`: 1,
		`bridge_feeds_requests_total{mode="longpoll",outcome="overloaded"}`:        1,
		`bridge_feeds_requests_total{mode="longpoll",outcome="client-gone"}`:       2,
		`bridge_feeds_requests_total{mode="sse",outcome="ok"}`:                     1,
		`bridge_feeds_requests_total{mode="sse",outcome="must-refetch"}`:           0,
		`bridge_feeds_must_refetch_total{reason="stream"}`:                         1,
		`bridge_feeds_must_refetch_total{reason="truncate"}`:                       1,
		`bridge_feeds_must_refetch_total{reason="gone"}`:                           0,
		`bridge_feeds_sse_disconnects_total{reason="client-gone"}`:                 1,
		`bridge_feeds_sse_disconnects_total{reason="slow"}`:                        0,
		`bridge_feeds_sse_disconnects_total{reason="write-timeout"}`:               0,
		`bridge_feeds_changes_delivered_total{mode="longpoll"}`:                    float64(delivered),
		`bridge_feeds_changes_delivered_total{mode="sse"}`:                         1,
		`bridge_feeds_delivery_latency_seconds{mode="longpoll"}`:                   float64(fromWindow), // sample count
		`bridge_feeds_delivery_latency_seconds{mode="sse"}`:                        1,
		`bridge_feeds_catch_ups_total`:                                             1,
		`bridge_feeds_gaps_total`:                                                  0,
		`bridge_feeds_stream_recreates_total`:                                      0,
		`bridge_feeds_head_sequence`:                                               float64(fs.Position().Seq),
		`bridge_feeds_requests_in_progress`:                                        0,
		`bridge_feeds_registered`:                                                  0,
		`bridge_feeds_waiting`:                                                     0,
		`bridge_feeds_ready`:                                                       1,
		`bridge_feeds_serialisations_total`:                                        float64(fs.Stats().Serialisations),
	}
	got := map[string]float64{}
	for k := range want {
		name, lbl, _ := strings.Cut(strings.TrimSuffix(k, "}"), "{")
		labels := map[string]string{}
		for _, kv := range strings.Split(lbl, ",") {
			if l, v, ok := strings.Cut(kv, "="); ok {
				labels[l] = strings.Trim(v, `"`)
			}
		}
		v, ok := metricValue(fams, name, labels)
		require.True(t, ok, "no sample %s", k)
		got[k] = v
	}
	assert.Equal(t, want, got)
	require.Positive(t, got[`bridge_feeds_serialisations_total`])
	require.Equal(t, float64(9), got[`bridge_feeds_head_sequence`])

	// The text format passes Prometheus's own lint.
	rsp, err := http.Get(hs.URL + "/metrics")
	require.NoError(t, err)
	defer rsp.Body.Close()
	problems, err := promlint.New(rsp.Body).Lint()
	require.NoError(t, err)
	var ours []promlint.Problem
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "bridge_") {
			ours = append(ours, p)
		}
	}
	require.Empty(t, ours)
}

// TestServeConfigFile runs `bridge serve` from bridge.yaml's serve
// section, then with flags that override some of its keys: the file's
// keys apply unless a flag is given, and a given flag wins.
func TestServeConfigFile(t *testing.T) {
	defer parallel(t)()
	e := newFeedsEnv(t, "CDC_file")
	fileAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := serveYAML(t, e.url, fmt.Sprintf(`  listen: %q
  stream: CDC_file
  where: {eq: [tenant, 1]}
  tables: [public.orders]
  max_per_client: 1
  client_header: X-Client
  hold: 1m
`, fileAddr))
	e.insert(1, 1, 2) // tenants 1 and 2
	e.insert(3, 2, 1)

	// run starts `bridge serve` with args until t ends, and returns its
	// base URL once ready.
	run := func(t *testing.T, addr string, args ...string) string {
		base := "http://" + addr
		startServeCmd(t, io.Discard, base, append([]string{"-c", p}, args...)...)
		return base
	}
	// client_header without a key is proxy mode (serve.auth.mode):
	// every feed request names its client.
	me := http.Header{"X-Client": {"me"}}
	tenants := func(t *testing.T, base string) []float64 {
		resp, body := get(t, base, url.Values{"token": {"now"}, "timeout": {"1ms"}}, me)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
		resp, body = get(t, base, url.Values{"token": {strings.Split(body.Token, ".")[0] + ".0"}, "timeout": {"5s"}}, me)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
		var out []float64
		for _, c := range changesOf(t, body.Changes) {
			out = append(out, c.After["tenant"].(float64))
		}
		return out
	}
	waiting := func(t *testing.T, base string) func() float64 {
		return func() float64 { return counter(t, base, "bridge_feeds_waiting") }
	}

	t.Run("file", func(t *testing.T) {
		base := run(t, fileAddr)
		require.Equal(t, []float64{1, 1}, tenants(t, base), "serve.where")
		resp, body := get(t, base, url.Values{"timeout": {"1ms"}}, nil)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no client header, no feed (proxy mode)")
		require.Equal(t, "no X-Client header: requests must come through the authenticating proxy", body.Detail)
		resp, body = get(t, base, url.Values{"tables": {"public.items"}}, me)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "serve.tables")
		require.Contains(t, body.Detail, "not served")
		stop := parkPoll(t, base, "a", waiting(t, base))
		defer stop()
		resp, _ = get(t, base, url.Values{"timeout": {"1ms"}}, http.Header{"X-Client": {"a"}})
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "serve.max_per_client: 1")
		resp, _ = get(t, base, url.Values{"timeout": {"1ms"}}, http.Header{"X-Client": {"b"}})
		require.Equal(t, http.StatusOK, resp.StatusCode, "serve.client_header: clients a and b are apart")
	})

	t.Run("flags", func(t *testing.T) {
		flagAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		base := run(t, flagAddr, "--listen", flagAddr, "--where", `{"eq":["tenant",2]}`, "--max-per-client", "2", "--tables", "")
		require.Equal(t, []float64{2, 2}, tenants(t, base), "--where replaces serve.where (ANDed they would match nothing)")
		resp, _ := get(t, base, url.Values{"tables": {"public.items"}, "timeout": {"1ms"}}, me)
		require.Equal(t, http.StatusOK, resp.StatusCode, `--tables "" serves every table`)
		stop1 := parkPoll(t, base, "a", waiting(t, base))
		defer stop1()
		stop2 := parkPoll(t, base, "a", waiting(t, base))
		defer stop2()
		resp, _ = get(t, base, url.Values{"timeout": {"1ms"}}, http.Header{"X-Client": {"a"}})
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "--max-per-client 2")
	})
}
