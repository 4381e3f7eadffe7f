package natsjs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/internal/natsembed"
	_ "github.com/bridgecdc/bridge/sinks/natsjs" // registers nats_jetstream
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

// TestConformance runs the sinktest suite against an embedded server:
// Break shuts it down, Heal restarts it on the same port and store.
func TestConformance(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	opts := srv.Options()
	t.Cleanup(func() { // the server Heal restarted last
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	// The stream exists before the suite starts, so that its server-side
	// goroutines are not mistaken for the sink's in the leak check.
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "SINKTEST", Subjects: []string{"cdc.>"},
		Storage: jetstream.FileStorage, Duplicates: time.Minute})
	require.NoError(t, err)
	nc.Close()

	sinktest.Run(t, sinktest.Harness{
		Type: "nats_jetstream",
		YAML: "url: " + srv.URL() + "\nstream: SINKTEST\nsubjects: [\"cdc.>\"]\nduplicate_window: 1m\nack_timeout: 2s\n",
		Read: func(t *testing.T) []sinktest.Received { return readStream(t, srv.URL(), "SINKTEST") },
		Break: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, srv.Shutdown(ctx))
		},
		Heal: func(t *testing.T) {
			var err error
			srv, err = natsembed.Restart(opts, 30*time.Second)
			require.NoError(t, err)
		},
		Dedupes: true,
		// The in-process server's own file-store loops (atomic batches stage
		// in a store of their own) are the server's, not the sink's.
		IgnoreLeaks: []goleak.Option{
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		},
	})
}

// readStream returns every message of stream, in stream order.
func readStream(t *testing.T, url, stream string) []sinktest.Received {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // no sink has connected yet
	}
	require.NoError(t, err)
	state := st.CachedInfo().State
	var out []sinktest.Received
	for seq := state.FirstSeq; state.Msgs > 0 && seq <= state.LastSeq; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		require.NoError(t, err)
		h := map[string]string{}
		for k, vs := range m.Header {
			h[k] = vs[0]
		}
		out = append(out, sinktest.Received{ID: h[jetstream.MsgIDHeader], Subject: m.Subject, Payload: m.Data, Headers: h})
	}
	return out
}
