package e2e_test

import (
	"context"
	"encoding/json"
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
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/bridge/serve/ssetest"
)

// TestServeKeepAliveAdvancesPosition: a client that only waits (its
// filter matches nothing being written) sees its last event ID move with
// the keep-alives, as a browser's EventSource would record it;
// reconnecting with that ID it receives every matching change written
// since, exactly once, and nothing from before. A long-poll that times
// out returns the same kind of position. Server drains end streams with
// the position reached.
func TestServeKeepAliveAdvancesPosition(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, tenant int)`)
	cfgPath := e.config("ka", "")
	e.start(cfgPath)
	waitSlotActive(t, e, "slot_ka")
	e.pg.ExecT(t, `INSERT INTO orders VALUES (0, 0)`)
	e.waitCount("CDC_ka", 1, 60*time.Second)

	nc, err := nats.Connect(e.natsURL(), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	fs, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_ka"})
	require.NoError(t, err)
	t.Cleanup(fs.Close)
	srv := serve.New(fs, serve.Config{KeepAlive: 100 * time.Millisecond}, testLogger(t))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections() // an SSE stream left open by a failure
		hs.Close()
	})
	addr := hs.Listener.Addr().String()
	target := "/v1/feed?sse=1&where=" + url.QueryEscape(`{"eq":["tenant",1]}`)

	// oracle: the ids of tenant 1's rows, in commit order.
	var want []int
	id := 1
	insert := func(tenant int, rows int) {
		var vals []string
		for range rows {
			vals = append(vals, fmt.Sprintf("(%d, %d)", id, tenant))
			if tenant == 1 {
				want = append(want, id)
			}
			id++
		}
		e.pg.ExecT(t, `INSERT INTO orders VALUES `+strings.Join(vals, ", "))
	}
	caughtUp := func() uint64 {
		t.Helper()
		last := e.waitCount("CDC_ka", id, 60*time.Second) // the rows and the first one
		n := last[len(last)-1].Seq
		require.Eventually(t, func() bool { return fs.Position().Seq >= n }, 60*time.Second, 10*time.Millisecond)
		return n
	}
	seqOf := func(id string) uint64 {
		t.Helper()
		tok, err := feeds.ParseToken(id)
		require.NoError(t, err)
		return tok.Seq
	}
	got := map[int]int{}
	var order []int
	take := func(b ssetest.Block) {
		t.Helper()
		require.Equal(t, "changes", b.Type, "data: %s", b.Data)
		var body pollResp
		require.NoError(t, json.Unmarshal([]byte(b.Data), &body))
		require.Equal(t, body.Token, b.LastEventID, "a changes event's id is its token")
		for _, c := range changesOf(t, body.Changes) {
			n := int(c.After["id"].(float64))
			got[n]++
			order = append(order, n)
		}
	}
	// readUntil reads blocks, taking changes, until stop says so.
	readUntil := func(s *ssetest.Stream, stop func(ssetest.Block) bool) ssetest.Block {
		t.Helper()
		require.NoError(t, s.SetDeadline(time.Now().Add(60*time.Second)))
		for {
			b, err := s.Next()
			require.NoError(t, err)
			if b.Dispatched && b.Type == "changes" {
				take(b)
			}
			if stop(b) {
				return b
			}
		}
	}

	s, err := ssetest.Open(ctx, addr, target+"&token=now", "", nil)
	require.NoError(t, err)
	first := readUntil(s, func(b ssetest.Block) bool { return b.Dispatched && b.Type == "up-to-date" })
	start := seqOf(first.LastEventID)

	// Only other tenants' changes: the client's position follows them on
	// keep-alives, without an event.
	for range 10 {
		insert(2, 2)
	}
	end := caughtUp()
	require.Greater(t, end, start)
	ka := readUntil(s, func(b ssetest.Block) bool {
		return !b.Dispatched && b.Comment == "keep-alive" && seqOf(b.LastEventID) >= end
	})
	require.Equal(t, end, seqOf(ka.LastEventID), "the keep-alive's id is the position reached")
	require.Empty(t, got, "nothing matched yet")

	// A match, then more waiting: the id moves past both.
	insert(1, 2)
	insert(2, 3)
	end = caughtUp()
	readUntil(s, func(b ssetest.Block) bool { return !b.Dispatched && seqOf(b.LastEventID) >= end })
	require.NoError(t, s.Close())
	lastID := s.LastEventID()

	// Written while the client is away, matches among them.
	for i := range 6 {
		insert(1+i%2, 1+i%3)
	}
	end = caughtUp()
	s, err = ssetest.Open(ctx, addr, target, lastID, nil)
	require.NoError(t, err)
	readUntil(s, func(b ssetest.Block) bool {
		return b.Dispatched && b.Type == "up-to-date" && seqOf(b.LastEventID) >= end
	})

	// A long-poll that times out returns the position reached likewise.
	insert(2, 4)
	end = caughtUp()
	resp, body := get(t, hs.URL, url.Values{"where": {`{"eq":["tenant",1]}`}, "token": {s.LastEventID()}, "timeout": {"300ms"}}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body.Changes)
	require.Equal(t, end, seqOf(body.Token), "a long-poll's timeout returns the position reached")

	// A drain (as http.Server.Shutdown does) ends the stream with the
	// position reached.
	srv.Drain()
	b := readUntil(s, func(b ssetest.Block) bool { return b.Dispatched && b.Type == "error" })
	require.Contains(t, b.Data, `"reason":"shutdown"`)
	require.Equal(t, end, seqOf(b.LastEventID))
	_, err = s.Next()
	require.ErrorIs(t, err, io.EOF, "the stream ends after the error event")
	s.Close()

	require.Equal(t, want, order, "every match once, in commit order")
	for n, k := range got {
		require.Equal(t, 1, k, "row %d delivered once", n)
	}
}
