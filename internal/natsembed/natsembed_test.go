package natsembed_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/internal/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRestartKeepsStreams(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	require.NotEqual(t, -1, srv.Options().Port)

	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), "s.1", []byte("hello"))
	require.NoError(t, err)
	nc.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	require.NoError(t, srv.Shutdown(ctx), "second Shutdown is a no-op")

	again := natsembed.StartT(t, srv.Options())
	require.Equal(t, srv.URL(), again.URL())

	nc, err = nats.Connect(again.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err = jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), "S")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.CachedInfo().State.Msgs)
}

func TestStartRequiresStoreDir(t *testing.T) {
	_, err := natsembed.Start(natsembed.Options{Port: -1})
	require.ErrorContains(t, err, "StoreDir")
}

func TestLogfAndMaxPayload(t *testing.T) {
	lines := make(chan string, 1000)
	srv := natsembed.StartT(t, natsembed.Options{MaxPayload: 1024, SyncAlways: true, Logf: func(f string, a ...any) {
		select {
		case lines <- f:
		default:
		}
	}})
	require.NotEmpty(t, lines)
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	require.EqualValues(t, 1024, nc.MaxPayload())
}
