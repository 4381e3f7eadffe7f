package natscore

import (
	"context"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

// TestMain checks for leaked goroutines; a test server whose shutdown
// outlived a test's deadline finishes in the background (natsembed), which
// is the test server's, not the sink's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/bridgecdc/bridge/internal/natsembed.(*Server).Shutdown.func1"))
}

const producer = "shop.main.e1"

// decoder is the runtime's strict Decoder for a block at sinks.live.config.
func decoder(raw map[string]any) config.Decoder {
	return (*config.Config)(nil).Decoder("sinks.live.config", raw)
}

// newSink builds a sink on url plus extra config, closed at the end of the test.
func newSink(t testing.TB, url string, extra map[string]any) *Sink {
	t.Helper()
	raw := map[string]any{"url": url, "flush_timeout": "2s"}
	for k, v := range extra {
		raw[k] = v
	}
	sk, err := New(decoder(raw), sinks.Env{Name: "live"})
	require.NoError(t, err)
	s := sk.(*Sink)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func connected(t testing.TB, url string) *Sink {
	t.Helper()
	s := newSink(t, url, nil)
	require.NoError(t, s.Connect(t.Context()))
	return s
}

// reader collects the messages published under cdc.>, reconnecting (and
// resubscribing) after a server restart.
type reader struct {
	nc   *nats.Conn
	mu   sync.Mutex
	msgs []*nats.Msg
}

func subscribe(t testing.TB, url string) *reader {
	t.Helper()
	r := &reader{}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	r.nc = nc
	_, err = nc.Subscribe("cdc.>", func(m *nats.Msg) {
		r.mu.Lock()
		r.msgs = append(r.msgs, m)
		r.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return r
}

func (r *reader) got() []*nats.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*nats.Msg(nil), r.msgs...)
}

// wait waits until n messages arrived and returns them.
func (r *reader) wait(t testing.TB, n int) []*nats.Msg {
	t.Helper()
	require.Eventually(t, func() bool { return len(r.got()) >= n }, 5*time.Second, 5*time.Millisecond,
		"expected %d messages", n)
	return r.got()
}

func ids(msgs []*nats.Msg) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Header.Get(nats.MsgIdHdr)
	}
	return out
}

func changeIDs(batch []cdc.Change) []string {
	out := make([]string, len(batch))
	for i := range batch {
		out[i] = batch[i].ID()
	}
	return out
}

func TestRegistered(t *testing.T) {
	p, err := sinks.Default.Lookup("nats_core")
	require.NoError(t, err)
	require.NotNil(t, p.New)
	require.Equal(t, DefaultConfig(), p.Config)
	require.Contains(t, p.Doc, "at most once")
}

func TestConfig(t *testing.T) {
	env := sinks.Env{Name: "live", NATS: sinks.NATSEnv{URL: "nats://env:4222", NATSClient: config.NATSClient{User: "u", Password: "p"}}}

	t.Run("defaults", func(t *testing.T) {
		sk, err := New(decoder(nil), env)
		require.NoError(t, err)
		want := DefaultConfig()
		want.URL = "nats://env:4222"
		require.Equal(t, want, sk.(*Sink).cfg)
		require.Equal(t, "u", sk.(*Sink).conn.User)
		require.Equal(t, "p", sk.(*Sink).conn.Password)
		require.Equal(t, 5*time.Second, want.FlushTimeout)
	})
	t.Run("no url anywhere", func(t *testing.T) {
		sk, err := New(decoder(nil), sinks.Env{})
		require.NoError(t, err)
		require.Equal(t, nats.DefaultURL, sk.(*Sink).cfg.URL)
	})
	t.Run("own url gets no env credentials", func(t *testing.T) {
		sk, err := New(decoder(map[string]any{"url": "nats://other:4222", "flush_timeout": "250ms"}), env)
		require.NoError(t, err)
		cfg := sk.(*Sink).cfg
		require.Equal(t, "nats://other:4222", cfg.URL)
		require.Empty(t, sk.(*Sink).conn.User)
		require.Empty(t, sk.(*Sink).conn.Password)
		require.Equal(t, 250*time.Millisecond, cfg.FlushTimeout)
	})
	for _, tc := range []struct {
		name string
		raw  map[string]any
		path string
		msg  string
	}{
		{"flush timeout zero", map[string]any{"flush_timeout": "0s"}, "flush_timeout", "must be > 0"},
		{"flush timeout not a duration", map[string]any{"flush_timeout": 5}, "flush_timeout", "expected a duration"},
		{"password without user", map[string]any{"password": "secret"}, "user", "must be set"},
		{"context that does not exist", map[string]any{"url": "nats://x:4222", "context": "/nonexistent/ctx.json"}, "context", "/nonexistent/ctx.json does not exist"},
		{"unknown key", map[string]any{"flush_timout": "1s"}, "flush_timout", "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(decoder(tc.raw), env)
			var fe *config.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, "sinks.live.config."+tc.path, fe.Path)
			require.Contains(t, fe.Msg, tc.msg)
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// exampleCreds writes a .creds file that parses, for a doc example whose
// creds key names a file that exists only in production (Validate reads
// it), and returns its path.
func exampleCreds(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bridge.creds")
	require.NoError(t, os.WriteFile(p, natsembed.CredsT(t), 0o600))
	return p
}

// TestDocExample decodes the YAML example of doc.go.
func TestDocExample(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(f.Doc.Text(), "\n") {
		if strings.HasPrefix(l, "\t") {
			lines = append(lines, strings.TrimPrefix(l, "\t"))
		}
	}
	require.NotEmpty(t, lines, "doc.go has no indented YAML example")
	var doc struct {
		Sinks map[string]struct {
			Type   string         `yaml:"type"`
			Config map[string]any `yaml:"config"`
		} `yaml:"sinks"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &doc))
	live := doc.Sinks["live"]
	require.Equal(t, "nats_core", live.Type)
	require.Equal(t, "/etc/bridge/bridge.creds", live.Config["creds"])
	creds := exampleCreds(t)
	live.Config["creds"] = creds
	sk, err := New(decoder(live.Config), sinks.Env{})
	require.NoError(t, err)
	cfg := sk.(*Sink).cfg
	require.Equal(t, "nats://nats-1:4222,nats://nats-2:4222", cfg.URL)
	require.Equal(t, creds, cfg.Creds)
	require.Equal(t, 2*time.Second, cfg.FlushTimeout)
}

func TestWriteInOrderWithHeaders(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	r := subscribe(t, srv.URL())
	s := connected(t, srv.URL())
	require.NoError(t, s.Connect(t.Context()), "Connect is idempotent")
	require.True(t, s.AtMostOnce())

	batch := sinktest.Changes(40, producer)
	batch[0].Headers["Nats-Rollup"] = "all" // reserved: dropped
	batch[0].Headers["x-bad"] = "a\r\nNats-Rollup: all"
	for _, b := range [][2]int{{0, 1}, {1, 17}, {17, 40}} {
		require.NoError(t, s.Write(t.Context(), batch[b[0]:b[1]]))
	}
	got := r.wait(t, len(batch))
	require.Equal(t, changeIDs(batch), ids(got))
	for i, m := range got {
		c := &batch[i]
		require.Equal(t, c.Subject, m.Subject)
		require.Equal(t, c.Payload, m.Data)
		h := m.Header
		require.Equal(t, c.ID(), h.Get("Nats-Msg-Id"))
		require.Equal(t, c.CommitLSN.String(), h.Get("Bridge-Commit-Lsn"))
		require.Equal(t, strconv.Itoa(int(c.Seq)), h.Get("Bridge-Seq"))
		require.Equal(t, strconv.Itoa(int(c.TxSize)), h.Get("Bridge-Tx-Size"))
		require.Equal(t, strconv.Itoa(int(c.Xid)), h.Get("Bridge-Xid"))
		require.Equal(t, string(c.Op), h.Get("Bridge-Op"))
		require.Equal(t, s.Run(), h.Get("Bridge-Run"))
		require.Equal(t, c.Headers["traceparent"], h.Get("traceparent"), "lowercase key kept as given")
		if c.Op == cdc.OpMessage {
			require.NotContains(t, h, "Bridge-Table")
		} else {
			require.Equal(t, c.Schema+"."+c.Table, h.Get("Bridge-Table"))
		}
	}
	require.NotContains(t, got[0].Header, "Nats-Rollup")
	require.NotContains(t, got[0].Header, "x-bad")
}

func TestNotConnected(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	batch := sinktest.Changes(20, producer)

	require.ErrorIs(t, s.Write(t.Context(), batch[:5]), sinks.ErrNotConnected, "Write before Connect")
	require.NoError(t, s.Connect(t.Context()))
	require.NoError(t, s.Write(t.Context(), batch[:5]))

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))

	ctx, cancel = context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Write(ctx, batch[5:10])
	require.ErrorIs(t, err, sinks.ErrNotConnected)
	require.Less(t, time.Since(start), time.Second, "Write returned after its deadline")

	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	require.ErrorIs(t, s.Connect(ctx), sinks.ErrNotConnected, "Connect waits for the server within ctx")
	require.Less(t, time.Since(start), time.Second)

	again := natsembed.StartT(t, srv.Options())
	r := subscribe(t, again.URL())
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Connect(ctx))
	require.NoError(t, s.Write(ctx, batch[5:]))
	require.Equal(t, changeIDs(batch[5:]), ids(r.wait(t, 15)))
}

func TestOversizedIsPermanent(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{MaxPayload: 4096})
	r := subscribe(t, srv.URL())
	s := connected(t, srv.URL())
	batch := sinktest.Changes(6, producer)
	batch[2].Payload = make([]byte, 8000)

	err := s.Write(t.Context(), batch)
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	require.Equal(t, []int{2, 3, 4, 5}, berr.Indexes())
	require.True(t, sinks.IsPermanent(berr.Failed[2]), "%v", berr.Failed[2])
	require.ErrorContains(t, berr.Failed[2], "max_payload of 4096")
	for i := 3; i < 6; i++ {
		require.ErrorIs(t, berr.Failed[i], errSkipped)
		require.False(t, sinks.IsPermanent(berr.Failed[i]))
	}
	require.True(t, sinks.IsPermanent(err))
	require.Equal(t, changeIDs(batch[:2]), ids(r.wait(t, 2)), "the changes before the oversized one were delivered")
	require.NoError(t, s.Write(t.Context(), batch[3:]), "the connection survives")
	require.Equal(t, changeIDs(append(batch[:2:2], batch[3:]...)), ids(r.wait(t, 5)))
}

func TestInvalidSubjectIsPermanent(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv.URL())
	for _, subj := range []string{"", "cdc.*", "cdc.>", "cdc..x", "cdc x"} {
		batch := sinktest.Changes(3, producer)
		batch[1].Subject = subj
		err := s.Write(t.Context(), batch)
		var berr *sinks.BatchError
		require.ErrorAs(t, err, &berr, "subject %q", subj)
		require.Equal(t, []int{1, 2}, berr.Indexes())
		require.True(t, sinks.IsPermanent(berr.Failed[1]))
		require.ErrorContains(t, berr.Failed[1], "invalid subject")
	}
}

func TestClose(t *testing.T) {
	t.Run("idempotent, then refuses", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{})
		s := connected(t, srv.URL())
		require.NoError(t, s.Write(t.Context(), sinktest.Changes(3, producer)))
		require.NoError(t, s.Close(t.Context()))
		require.NoError(t, s.Close(t.Context()))
		require.True(t, sinks.IsPermanent(s.Write(t.Context(), sinktest.Changes(3, producer))))
		require.True(t, sinks.IsPermanent(s.Connect(t.Context())))
	})
	t.Run("never connected", func(t *testing.T) {
		s := newSink(t, "nats://127.0.0.1:1", nil)
		require.NoError(t, s.Close(t.Context()))
	})
	t.Run("server shut down", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{})
		s := connected(t, srv.URL())
		require.NoError(t, s.Write(t.Context(), sinktest.Changes(3, producer)))
		require.NoError(t, srv.Shutdown(t.Context()))
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_ = s.Close(ctx)
		require.Less(t, time.Since(start), 300*time.Millisecond, "Close took longer than its 100ms deadline")
	})
}

// TestConformance runs the sinktest suite: Break shuts the server down,
// Heal restarts it on the same port and waits for the subscriber to be back.
func TestConformance(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	opts := srv.Options()
	r := subscribe(t, srv.URL())
	down := false
	t.Cleanup(func() { // the server Heal restarted last
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	sinktest.Run(t, sinktest.Harness{
		Type: "nats_core",
		YAML: "url: " + srv.URL() + "\nflush_timeout: 2s\n",
		Read: func(t *testing.T) []sinktest.Received {
			var out []sinktest.Received
			for _, m := range r.got() {
				h := map[string]string{}
				for k, vs := range m.Header {
					h[k] = vs[0]
				}
				out = append(out, sinktest.Received{ID: h[nats.MsgIdHdr], Subject: m.Subject, Payload: m.Data, Headers: h})
			}
			return out
		},
		Break: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, srv.Shutdown(ctx))
			down = true
		},
		Heal: func(t *testing.T) {
			if down { // the suite heals again in its cleanup; a running server stays
				var err error
				srv, err = natsembed.Restart(opts, 30*time.Second)
				require.NoError(t, err)
				down = false
			}
			// A flush fails with "connection closed" when the fresh
			// connection blips while the server settles (a loaded machine):
			// what matters is that one round trip succeeds.
			var last error
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if last = r.nc.FlushTimeout(2 * time.Second); last == nil {
					return
				}
			}
			require.NoError(t, last, "the subscriber is not back on the server")
		},
		AtMostOnce: true,
	})
}
