package checkpoint

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/natsembed"
)

// staleReads is a real bucket whose Get answers from an older revision,
// as a replica behind the leader of a clustered bucket does after a
// server restart (direct gets are served by any replica).
type staleReads struct {
	jetstream.KeyValue
	at uint64
}

func (s staleReads) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	return s.KeyValue.GetRevision(ctx, key, s.at)
}

// TestSaveAfterLostReplyReadFromStaleReplica: a Save whose reply was lost
// was written; the retry at the old revision is refused, and the read back
// comes from a replica that has not seen the write. That is not another
// instance's takeover: the error must not be ErrFenced (which stops the
// pipeline for good), and once reads catch up the retry goes on top of the
// run's own write.
func TestSaveAfterLostReplyReadFromStaleReplica(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := Open(t.Context(), js, "cp", 1)
	require.NoError(t, err)
	key := Key("shop", "main")

	r1, err := st.Save(t.Context(), key, State{Epoch: "e1", LSN: 100, Run: "a"}, 0)
	require.NoError(t, err)
	// The run's next Save is written, but its reply is lost.
	lost, err := st.Save(t.Context(), key, State{Epoch: "e1", LSN: 200, Run: "a"}, r1)
	require.NoError(t, err)

	real := st.kv
	st.kv = staleReads{KeyValue: real, at: r1}
	_, err = st.Save(t.Context(), key, State{Epoch: "e1", LSN: 300, Run: "a"}, r1)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrFenced, "a stale read is no takeover")
	require.ErrorContains(t, err, "replica behind")

	st.kv = real
	next, err := st.Save(t.Context(), key, State{Epoch: "e1", LSN: 300, Run: "a"}, r1)
	require.NoError(t, err)
	require.Greater(t, next, lost)
}
