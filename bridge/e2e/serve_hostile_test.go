package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// cdcStream starts an in-process NATS server with an empty stream CDC
// over cdc.> and returns its URL and a JetStream client.
func cdcStream(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	ns := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}})
	require.NoError(t, err)
	return ns.URL(), js
}

// hostileFeeds returns a feeds reader of an empty stream on an in-process
// NATS server.
func hostileFeeds(t *testing.T) *feeds.Feeds {
	t.Helper()
	_, js := cdcStream(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	fs, err := feeds.New(ctx, js, feeds.Config{})
	require.NoError(t, err)
	t.Cleanup(fs.Close)
	return fs
}

// listen serves cfg over fs on 127.0.0.1 with the server's own
// http.Server (its limits), and returns the address.
func listen(t *testing.T, fs *feeds.Feeds, cfg serve.Config) string {
	t.Helper()
	srv := serve.New(fs, cfg, testLogger(t))
	hs := srv.HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// rawGet sends target with extra header lines on a new connection and
// returns the status code (0 when the server closed the connection
// without a response).
func rawGet(t *testing.T, addr, target string, headers ...string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(time.Minute)))
	w := bufio.NewWriter(c)
	fmt.Fprintf(w, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", target)
	for _, h := range headers {
		fmt.Fprintf(w, "%s\r\n", h)
	}
	fmt.Fprintf(w, "\r\n")
	_ = w.Flush() // the server may answer and close before reading it all
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// heap returns the bytes of heap and stacks in use after a collection.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// TestServeHostileInput sends `bridge serve` what an attacker would: a
// filter nested 10,000 deep, 1 MB query strings and headers, malformed
// requests, headers sent byte by byte (slowloris), and thousands of
// connections. Each gets a 4xx (or 503 at the connection limit, or a closed
// connection for the slowloris), memory stays bounded, and the server
// keeps serving.
//
// Serial: it measures this process's heap and opens thousands of
// connections in it, and the slowloris must be cut by a 500 ms
// read_header_timeout.
func TestServeHostileInput(t *testing.T) {
	fs := hostileFeeds(t)
	addr := listen(t, fs, serve.Config{ReadHeaderTimeout: 500 * time.Millisecond})
	// Header limit raised: the query limit is what stops long queries.
	roomy := listen(t, fs, serve.Config{MaxHeaderBytes: 4 << 20})
	// Both raised, so that the depth check is what stops deep filters.
	wide := listen(t, fs, serve.Config{MaxHeaderBytes: 4 << 20, MaxQueryBytes: 4 << 20})
	alive := func(a string) {
		t.Helper()
		require.Equal(t, http.StatusOK, rawGet(t, a, "/livez"), "the server still serves")
	}
	feed := func(where string) string { return "/v1/feed?timeout=1ms&where=" + url.QueryEscape(where) }
	deep := func(n int) string { return strings.Repeat(`{"not":`, n) + `{"null":"a"}` + strings.Repeat("}", n) }

	t.Run("nested 10,000 deep", func(t *testing.T) {
		before := heap()
		for _, w := range []string{deep(10000), strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
			strings.Repeat(`{"and":[`, 10000) + `{"null":"a"}` + strings.Repeat("]}", 10000)} {
			require.Equal(t, http.StatusBadRequest, rawGet(t, wide, feed(w)), "past serve.max_filter_depth: 400 before parsing")
			require.Equal(t, http.StatusRequestURITooLong, rawGet(t, roomy, feed(w)), "past serve.max_query_bytes: 414")
			// Default limits: the request line alone may be past
			// serve.max_header_bytes (net/http reads that much and 4 KB).
			want := http.StatusRequestURITooLong
			if len(feed(w)) > 64<<10+4096 {
				want = http.StatusRequestHeaderFieldsTooLarge
			}
			require.Equal(t, want, rawGet(t, addr, feed(w)), "default limits, a request line of %d bytes", len(feed(w)))
		}
		require.Equal(t, http.StatusBadRequest, rawGet(t, addr, feed(deep(17))), "one past the default depth of 16")
		require.Equal(t, http.StatusOK, rawGet(t, addr, feed(deep(15))), "within it")
		for range 20 {
			rawGet(t, wide, feed(deep(10000)))
		}
		grew := int64(heap()) - int64(before)
		t.Logf("heap and stacks grew by %d KB over 26 deep filters", grew>>10)
		require.Less(t, grew, int64(64<<20), "deep filters leave no memory behind")
		alive(addr)
		alive(roomy)
		alive(wide)
	})

	t.Run("1 MB query string and headers", func(t *testing.T) {
		mb := strings.Repeat("a", 1<<20)
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, rawGet(t, addr, "/v1/feed?where="+mb), "past serve.max_header_bytes: 431")
		require.Equal(t, http.StatusRequestURITooLong, rawGet(t, roomy, "/v1/feed?where="+mb), "past serve.max_query_bytes: 414")
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, rawGet(t, addr, "/v1/feed", "Authorization: Bearer "+mb))
		many := make([]string, 5000)
		for i := range many {
			many[i] = fmt.Sprintf("X-H%d: %s", i, strings.Repeat("b", 200))
		}
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, rawGet(t, addr, "/v1/feed", many...))
		alive(addr)
	})

	t.Run("malformed requests", func(t *testing.T) {
		for _, target := range []string{
			"/v1/feed?where=" + url.QueryEscape(`{"eq":`),
			"/v1/feed?where=" + url.QueryEscape("\xff\xfe"),
			"/v1/feed?where=" + url.QueryEscape(`{"eq":["a",1],"ne":["b",2]}`),
			"/v1/feed?where=" + url.QueryEscape(`{"in":["a",[]]}`),
			"/v1/feed?ops=drop",
			"/v1/feed?tables=orders",
			"/v1/feed?tables=" + url.QueryEscape(","),
			"/v1/feed?token=" + url.QueryEscape("x.y.z"),
			"/v1/feed?timeout=-1s",
			"/v1/feed?timeout=" + url.QueryEscape("9999999999999h"),
		} {
			require.Equal(t, http.StatusBadRequest, rawGet(t, addr, target), target)
		}
		alive(addr)
	})

	t.Run("slowloris", func(t *testing.T) {
		// Headers trickled: the connection is closed once
		// serve.read_header_timeout (500ms here) has passed, without a
		// request ever reaching the handler.
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "GET /v1/feed HTTP/1.1\r\nHost: 127.0.0.1\r\n")
		require.NoError(t, err)
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			_, _ = io.Copy(io.Discard, c)
		}()
		sent := 0
		for {
			select {
			case <-closed:
				t.Logf("closed after %d header lines", sent)
				alive(addr)
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := fmt.Fprintf(c, "X-Slow-%d: 1\r\n", sent); err != nil {
				<-closed
				alive(addr)
				return
			}
			if sent++; sent > 600 {
				t.Fatal("a client sending one header line every 100ms for a minute is still connected")
			}
		}
	})

	t.Run("thousands of connections", func(t *testing.T) {
		// Each connection costs two descriptors here (client and server in
		// one process): stay well within the limit.
		var lim syscall.Rlimit
		require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
		n := min(4000, int(lim.Cur)/3)
		if n < 500 {
			t.Skipf("RLIMIT_NOFILE is %d: too low to open many connections", lim.Cur)
		}
		const maxConns = 500
		many := listen(t, fs, serve.Config{MaxConns: maxConns, MaxPerClient: n})
		t.Logf("%d connections, serve.max_conns %d (RLIMIT_NOFILE %d)", n, maxConns, lim.Cur)
		before := heap()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		var refused, failed atomic.Int64
		codes := make(chan int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d net.Dialer
				c, err := d.DialContext(ctx, "tcp", many)
				if err != nil {
					failed.Add(1)
					return
				}
				defer c.Close()
				go func() { <-ctx.Done(); c.Close() }()
				fmt.Fprintf(c, "GET /v1/feed?timeout=60s&where=%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", url.QueryEscape(fmt.Sprintf(`{"eq":["tenant",%d]}`, i)))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					return // closed by the test once all are counted
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
					refused.Add(1)
				}
				codes <- resp.StatusCode
			}()
		}
		// Every connection is either parked in a long-poll or refused.
		require.Eventually(t, func() bool {
			return int(fs.Stats().Waiting)+int(refused.Load())+int(failed.Load()) >= n
		}, 2*time.Minute, 20*time.Millisecond, "parked %d, refused %d, failed dials %d", fs.Stats().Waiting, refused.Load(), failed.Load())
		require.Zero(t, failed.Load(), "every connection was accepted")
		require.Equal(t, maxConns, fs.Stats().Waiting, "serve.max_conns long-polls in progress")
		require.Equal(t, int64(n-maxConns), refused.Load(), "the rest refused with 503 and Retry-After")
		grew := int64(heap()) - int64(before)
		t.Logf("heap and stacks with %d connections open: +%d KB (%d bytes per connection, client and server)", n, grew>>10, grew/int64(n))
		require.Less(t, grew, int64(n)*256<<10, "memory per connection stays bounded (a generous 256 KB for both ends)")
		alive(many)
		cancel()
		wg.Wait()
		close(codes)
		for c := range codes {
			require.Equal(t, http.StatusServiceUnavailable, c)
		}
	})
}
