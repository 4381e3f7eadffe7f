package natsconn_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/natsconn"
)

// TestTryPublish: against a real server, a probe tells a subject no stream
// binds, one the expected stream binds, one another stream binds and one
// the user may not publish to, and stores nothing.
func TestTryPublish(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "u", Password: "p", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"$JS.API.>", "a.>", "b.>", "none.>"}},
		}}}})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := natsconn.DialProbe(ctx, natsconn.Conn{URL: ns.ClientURL(), User: "u", Password: "p"})
	require.NoError(t, err)
	defer p.Close()
	js, err := jetstream.New(p.NC)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}})
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}})
	require.NoError(t, err)

	res, err := p.TryPublish(ctx, "A", []string{"a.x", "b.x", "none.x", "denied.x"})
	require.NoError(t, err)
	require.Equal(t, map[string]natsconn.Result{
		"a.x": {Outcome: natsconn.Bound}, "b.x": {Outcome: natsconn.OtherStream},
		"none.x": {Outcome: natsconn.NoStream}, "denied.x": {Outcome: natsconn.Denied},
	}, res)
	require.Equal(t, []string{"denied.x"}, p.Denied(true))
	for _, name := range []string{"A", "B"} {
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		require.Zero(t, st.CachedInfo().State.Msgs, "a probe was stored in %s", name)
	}

	_, err = natsconn.DialProbe(ctx, natsconn.Conn{URL: ns.ClientURL(), User: "u", Password: "wrong"})
	require.Error(t, err)
	require.True(t, strings.Contains(strings.ToLower(err.Error()), "authorization"), err.Error())
}
