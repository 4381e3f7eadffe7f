package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeProjectionsBounded asks `bridge serve` (the binary, over real
// HTTP) for many column sets (columns=): one after the other they never
// hold more than serve.max_projections; with every set in use a request
// for another gets 503 with Retry-After and its reason, while one for a
// set in use, or for all columns, is served; a request naming more than
// serve.max_columns columns gets 400; sets no request uses expire after
// serve.projection_idle. Before, each distinct set was kept for the
// process's life, with its own encoding of every change.
func TestServeProjectionsBounded(t *testing.T) {
	defer parallel(t)()
	natsURL, _ := cdcStream(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg := serveYAML(t, natsURL, fmt.Sprintf("  listen: %q\n  max_projections: 3\n  max_columns: 4\n  projection_idle: 300ms\n", addr))
	b := startBinary(t, nil, "serve", "-c", cfg)
	base := "http://" + addr
	waitHTTP(t, b, base, "/readyz")
	poll := func(ctx context.Context, cols, timeout string) (int, string, http.Header) {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/feed?token=now&timeout="+timeout+"&columns="+cols, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error(), nil
		}
		defer resp.Body.Close()
		var body strings.Builder
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		body.Write(buf[:n])
		return resp.StatusCode, body.String(), resp.Header
	}

	for i := range 30 {
		code, body, _ := poll(t.Context(), fmt.Sprintf("id,c%d", i), "1ms")
		require.Equal(t, http.StatusOK, code, "set %d: %s", i, body)
		require.LessOrEqual(t, counter(t, base, "bridge_feeds_projections"), float64(3), "after set %d", i)
	}

	// Three sets held by parked long-polls.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = poll(ctx, fmt.Sprintf("id,p%d", i), "60s")
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return counter(t, base, "bridge_feeds_requests_in_progress") == 3 }, 30*time.Second, 20*time.Millisecond)

	code, body, hdr := poll(t.Context(), "id,another", "1ms")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.NotEmpty(t, hdr.Get("Retry-After"))
	require.Equal(t, "columns: 3 column sets are in use, the server's limit (serve.max_projections): retry later, or ask for columns another request uses, or for all columns", detail(t, body))
	code, body, _ = poll(t.Context(), "p1,id", "1ms")
	require.Equal(t, http.StatusOK, code, "a set in use is shared: %s", body)
	code, body, _ = poll(t.Context(), "", "1ms")
	require.Equal(t, http.StatusOK, code, "all columns are always served: %s", body)

	code, body, _ = poll(t.Context(), "a,b,c,d,e", "1ms")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Equal(t, "columns: 5 columns, more than the server's limit of 4 (serve.max_columns)", detail(t, body))
	code, body, _ = poll(t.Context(), "p2,p2,id,id,id", "1ms")
	require.Equal(t, http.StatusOK, code, "a column named twice counts once: %s", body)

	cancel()
	wg.Wait()
	require.Eventually(t, func() bool { return counter(t, base, "bridge_feeds_projections") == 0 }, 30*time.Second, 50*time.Millisecond,
		"sets no request uses expire after serve.projection_idle")
}
