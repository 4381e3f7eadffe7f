package checkpoint_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/internal/faultproxy"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// TestSaveFailsWhenTheConnectionIsLost: a Save under way when its
// connection goes silent for good fails with nats.ErrDisconnected as soon
// as the pings take the connection for dead, not at ctx's deadline; the
// next Save, over the new connection, works.
func TestSaveFailsWhenTheConnectionIsLost(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	p, err := faultproxy.Start(strings.TrimPrefix(srv.URL(), "nats://"))
	require.NoError(t, err)
	defer p.Close()
	nc, err := nats.Connect("nats://"+p.Addr(), nats.PingInterval(100*time.Millisecond), nats.MaxPingsOutstanding(2),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	key := checkpoint.Key("shop", "main")
	rev, err := st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: cdc.LSN(1)}, 0)
	require.NoError(t, err)

	p.BlackHole()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err = st.Save(ctx, key, checkpoint.State{Epoch: "e1", LSN: cdc.LSN(2)}, rev)
	require.ErrorIs(t, err, nats.ErrDisconnected, "the Save waited for its deadline")
	t.Logf("failed after %s: %v", time.Since(began).Round(time.Millisecond), err)

	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)
	_, cur, err := st.Load(t.Context(), key)
	require.NoError(t, err)
	_, err = st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: cdc.LSN(3)}, cur)
	require.NoError(t, err)
}

// TestTimeoutChecksTheConnection: a round trip that times out on a
// connection whose link went silent, with pings too slow to have noticed,
// makes the store ping the connection and reconnect it; the next Save
// works over the new link.
func TestTimeoutChecksTheConnection(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	p, err := faultproxy.Start(strings.TrimPrefix(srv.URL(), "nats://"))
	require.NoError(t, err)
	defer p.Close()
	nc, err := nats.Connect("nats://"+p.Addr(), nats.PingInterval(time.Hour), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	key := checkpoint.Key("shop", "main")
	rev, err := st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: cdc.LSN(1)}, 0)
	require.NoError(t, err)

	p.BlackHole()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, err = st.Save(ctx, key, checkpoint.State{Epoch: "e1", LSN: cdc.LSN(2)}, rev)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Eventually(t, func() bool { return nc.Stats().Reconnects == 1 && nc.IsConnected() }, 30*time.Second, 10*time.Millisecond,
		"the store did not replace the silent connection")
	_, cur, err := st.Load(t.Context(), key)
	require.NoError(t, err)
	_, err = st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: cdc.LSN(3)}, cur)
	require.NoError(t, err)
}
