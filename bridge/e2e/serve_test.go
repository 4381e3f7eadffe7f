package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// pollResp is a long-poll response body.
type pollResp struct {
	Token    string            `json:"token"`
	UpToDate bool              `json:"up_to_date"`
	Changes  []json.RawMessage `json:"changes"`
	Error    string            `json:"error"`
	Reason   string            `json:"reason"`
	Detail   string            `json:"detail"`
	Position string            `json:"position"`
}

type feedChange struct {
	Seq   uint64         `json:"seq"`
	Op    string         `json:"op"`
	Moved string         `json:"moved"`
	Table string         `json:"table"`
	Key   map[string]any `json:"key"`
	After map[string]any `json:"after"`
}

func get(t testing.TB, base string, q url.Values, hdr http.Header) (*http.Response, pollResp) {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/v1/feed?"+q.Encode(), nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body pollResp
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &body), string(b))
	return resp, body
}

func changesOf(t testing.TB, raw []json.RawMessage) []feedChange {
	out := make([]feedChange, len(raw))
	for i, r := range raw {
		require.NoError(t, json.Unmarshal(r, &out[i]))
	}
	return out
}

// sseEvent is one server-sent event.
type sseEvent struct{ id, event, data string }

// readSSE reads events until the stream ends or stop returns true.
func readSSE(body io.Reader, stop func(sseEvent) bool) []sseEvent {
	var out []sseEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.event != "" {
				out = append(out, cur)
				if stop(cur) {
					return out
				}
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		}
	}
	return out
}

func openSSE(t testing.TB, ctx context.Context, base string, q url.Values, lastID string) *http.Response {
	t.Helper()
	q.Set("sse", "1")
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/feed?"+q.Encode(), nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return resp
}

// TestServeEndToEnd runs Postgres → bridge → JetStream → feeds → HTTP:
// long-poll with filters ANDed with the server's, no redelivery, SSE with
// Last-Event-ID resume, a slow SSE client disconnected and resumed without
// loss, admission limits, bad filters, must-refetch as 409.
func TestServeEndToEnd(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant int, status text, tags text[])`)
	e.pg.ExecT(t, `ALTER TABLE orders REPLICA IDENTITY FULL`)
	cfgPath := e.config("srv", "")
	e.start(cfgPath)
	waitSlotActive(t, e, "slot_srv")
	e.pg.ExecT(t, `INSERT INTO orders VALUES (0, 0, 'open', '{}')`)
	e.waitCount("CDC_srv", 1, 60*time.Second)

	nc, err := nats.Connect(e.natsURL(), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	fs, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_srv"})
	require.NoError(t, err)
	t.Cleanup(fs.Close)

	fixed := feeds.Ne("status", "secret")
	hs := httptest.NewServer(serve.New(fs, serve.Config{Where: &fixed, Tables: []string{"public.orders"}}, testLogger(t)).Handler())
	t.Cleanup(hs.Close)

	where := url.Values{"where": {`{"eq":["tenant",1]}`}}
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for k, x := range where {
			v[k] = x
		}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}

	// An empty poll times out up to date with a token.
	resp, body := get(t, hs.URL, q("token", "now", "timeout", "300ms"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, body.UpToDate)
	require.Empty(t, body.Changes)
	require.Equal(t, body.Token, resp.Header.Get("Bridge-Token"))
	t0 := body.Token

	e.pg.ExecT(t, `INSERT INTO orders VALUES (1, 1, 'open', '{a}'), (2, 2, 'open', '{}'), (3, 1, 'secret', '{}')`)
	resp, body = get(t, hs.URL, q("token", t0), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cs := changesOf(t, body.Changes)
	require.Len(t, cs, 1, "tenant 1 only, and the server's filter hides the secret row")
	require.Equal(t, "insert", cs[0].Op)
	require.Equal(t, float64(1), cs[0].After["id"])
	t1 := body.Token

	// No redelivery.
	_, body = get(t, hs.URL, q("token", t1, "timeout", "300ms"), nil)
	require.Empty(t, body.Changes)

	// A row moving out of the filter arrives as a delete.
	e.pg.ExecT(t, `UPDATE orders SET tenant = 2 WHERE id = 1`)
	_, body = get(t, hs.URL, q("token", t1), nil)
	cs = changesOf(t, body.Changes)
	require.Len(t, cs, 1)
	require.Equal(t, "delete", cs[0].Op)
	require.Equal(t, "out", cs[0].Moved)
	t2 := body.Token

	t.Run("bad requests", func(t *testing.T) {
		resp, body := get(t, hs.URL, url.Values{"where": {`{"and":[{"eq":["a"]}]}`}}, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Contains(t, body.Detail, "where.and[0].eq")
		resp, body = get(t, hs.URL, url.Values{"tables": {"public.users"}}, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Contains(t, body.Detail, "not served")
		resp, _ = get(t, hs.URL, url.Values{"token": {"garbage"}}, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})

	t.Run("admission", func(t *testing.T) {
		for _, tc := range []struct {
			cfg  serve.Config
			code int
		}{
			{serve.Config{MaxPerClient: 1}, http.StatusTooManyRequests},
			{serve.Config{MaxConns: 1}, http.StatusServiceUnavailable},
		} {
			s := httptest.NewServer(serve.New(fs, tc.cfg, testLogger(t)).Handler())
			before := fs.Stats().Waiting
			done := make(chan struct{})
			go func() {
				defer close(done)
				r, err := http.Get(s.URL + "/v1/feed?timeout=10s&where=" + url.QueryEscape(`{"eq":["tenant",999]}`))
				if err == nil {
					r.Body.Close()
				}
			}()
			require.Eventually(t, func() bool { return fs.Stats().Waiting > before }, 20*time.Second, 5*time.Millisecond)
			resp, body := get(t, s.URL, url.Values{}, nil)
			require.Equal(t, tc.code, resp.StatusCode)
			require.NotEmpty(t, resp.Header.Get("Retry-After"))
			require.NotEmpty(t, body.Error)
			s.CloseClientConnections()
			s.Close()
			<-done
		}
	})

	t.Run("sse resume", func(t *testing.T) {
		sctx, scancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer scancel()
		r := openSSE(t, sctx, hs.URL, q("token", t0), "")
		evs := readSSE(r.Body, func(ev sseEvent) bool { return ev.event == "up-to-date" })
		r.Body.Close()
		var got []feedChange
		lastID := ""
		for _, ev := range evs {
			if ev.event == "changes" {
				var b pollResp
				require.NoError(t, json.Unmarshal([]byte(ev.data), &b))
				got = append(got, changesOf(t, b.Changes)...)
				require.Equal(t, b.Token, ev.id)
			}
			lastID = ev.id
		}
		require.Len(t, got, 2, "the insert and the move out")
		require.Equal(t, t2, lastID)

		e.pg.ExecT(t, `INSERT INTO orders VALUES (4, 1, 'open', '{}')`)
		r = openSSE(t, sctx, hs.URL, q(), lastID)
		evs = readSSE(r.Body, func(ev sseEvent) bool { return ev.event == "changes" })
		r.Body.Close()
		require.Equal(t, "changes", evs[len(evs)-1].event)
		var b pollResp
		require.NoError(t, json.Unmarshal([]byte(evs[len(evs)-1].data), &b))
		cs := changesOf(t, b.Changes)
		require.Len(t, cs, 1)
		require.Equal(t, float64(4), cs[0].After["id"])
	})

	t.Run("slow sse client", func(t *testing.T) {
		slowFS, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_srv", MaxBatch: 1})
		require.NoError(t, err)
		defer slowFS.Close()
		s := httptest.NewServer(serve.New(slowFS, serve.Config{MaxLag: 1}, testLogger(t)).Handler())
		defer s.Close()
		start := slowFS.Position()
		from := start.String()
		for i := 100; i < 120; i++ {
			e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO orders VALUES (%d, 7, 'open', '{}')`, i))
		}
		// One message per transaction: wait until all 20 are read.
		require.Eventually(t, func() bool { return slowFS.Position().Seq >= start.Seq+20 }, 60*time.Second, 20*time.Millisecond)
		seen := map[float64]int{}
		slow, lastID := 0, from
		for range 100 {
			if len(seen) == 20 {
				break
			}
			r := openSSE(t, t.Context(), s.URL, url.Values{"where": {`{"eq":["tenant",7]}`}}, lastID)
			evs := readSSE(r.Body, func(ev sseEvent) bool { return ev.event == "up-to-date" })
			r.Body.Close()
			for _, ev := range evs {
				switch ev.event {
				case "changes":
					var b pollResp
					require.NoError(t, json.Unmarshal([]byte(ev.data), &b))
					for _, c := range changesOf(t, b.Changes) {
						seen[c.After["id"].(float64)]++
					}
					lastID = ev.id
				case "error":
					require.Contains(t, ev.data, `"reason":"slow"`)
					slow++
				}
			}
		}
		require.Len(t, seen, 20, "every row, across reconnects")
		for id, n := range seen {
			require.Equal(t, 1, n, "row %v delivered once", id)
		}
		require.Positive(t, slow, "disconnected as slow at least once")
		require.Equal(t, float64(slow), counter(t, s.URL, "bridge_feeds_sse_disconnects_total", "reason", "slow"),
			"every slow disconnect counted on /metrics")
	})

	t.Run("command", func(t *testing.T) {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		stop := startServeCmd(t, io.Discard, "http://"+addr, "-c", cfgPath, "--listen", addr, "--stream", "CDC_srv")
		resp, body := get(t, "http://"+addr, url.Values{"token": {t0}, "where": {`{"eq":["id",2]}`}}, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Len(t, body.Changes, 1)
		require.NoError(t, stop(), "bridge serve stops when its context ends")
	})

	t.Run("health", func(t *testing.T) {
		for _, p := range []string{"/livez", "/readyz", "/v1/position"} {
			r, err := http.Get(hs.URL + p)
			require.NoError(t, err)
			r.Body.Close()
			require.Equal(t, http.StatusOK, r.StatusCode, p)
		}
	})

	// Must-refetch: a TRUNCATE of the table the feed reads.
	e.pg.ExecT(t, `TRUNCATE orders`)
	tok := t2
	for range 5 { // the changes before the truncate first, then 409
		resp, body = get(t, hs.URL, q("token", tok), nil)
		if resp.StatusCode != http.StatusOK {
			break
		}
		tok = body.Token
	}
	require.Equal(t, http.StatusConflict, resp.StatusCode, "%+v", body)
	require.Equal(t, "must-refetch", body.Error)
	require.Equal(t, feeds.ReasonTruncate, body.Reason)
	require.NotEmpty(t, body.Position)
	resp, body = get(t, hs.URL, q("token", body.Position, "timeout", "200ms"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%+v", body)
}

// BenchmarkServeIdleConnMemory reports the memory (heap in use plus
// goroutine stacks) per idle long-poll connection, client and server in
// one process, for bridge serve and for a handler that only blocks: the
// difference is what the feed adds to net/http's own cost. Run with
// -benchtime=1x.
func BenchmarkServeIdleConnMemory(b *testing.B) {
	const n = 2000
	ns := natsembed.StartT(b, natsembed.Options{})
	nc, err := nats.Connect(ns.URL())
	require.NoError(b, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(b, err)
	_, err = js.CreateStream(b.Context(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	require.NoError(b, err)
	fs, err := feeds.New(b.Context(), js, feeds.Config{})
	require.NoError(b, err)
	defer fs.Close()

	measure := func(h http.Handler, parked func() bool) float64 {
		hs := httptest.NewServer(h)
		defer hs.Close()
		tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/v1/feed?timeout=60s&where="+url.QueryEscape(fmt.Sprintf(`{"eq":["tenant",%d]}`, i)), nil)
				if r, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, r.Body)
					r.Body.Close()
				}
			}()
		}
		for !parked() {
			time.Sleep(10 * time.Millisecond)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		cancel()
		wg.Wait()
		return float64((m1.HeapInuse+m1.StackInuse)-(m0.HeapInuse+m0.StackInuse)) / n
	}
	for range b.N {
		var blocked atomic.Int64
		block := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			blocked.Add(1)
			<-r.Context().Done()
			blocked.Add(-1)
		})
		allBlocked := func() bool { return blocked.Load() == n }
		measure(block, allBlocked) // warm-up: one-time allocations of the client and server
		srv := serve.New(fs, serve.Config{MaxPerClient: n}, nil)
		full := measure(srv.Handler(), func() bool { return fs.Stats().Waiting == n })
		plain := measure(block, allBlocked)
		b.ReportMetric(full, "bytes/conn")
		b.ReportMetric(plain, "plain-http-bytes/conn")
		b.ReportMetric(full-plain, "feed-bytes/conn")
	}
}
