package checkpoint_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
)

// TestOwnerHeartbeat: the owner record round-trips beside the
// checkpoint, each write a new revision; a delete at the writer's last
// revision removes it, and one at an older revision leaves a successor's.
func TestOwnerHeartbeat(t *testing.T) {
	st, err := checkpoint.Open(t.Context(), jsT(t), "bridge_checkpoints", 1)
	require.NoError(t, err)
	key := checkpoint.OwnerKey("shop", "main")
	require.Equal(t, "shop.main.owner", key)

	o, err := st.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Zero(t, o, "missing key")

	started := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	r1, err := st.SetOwner(t.Context(), key, checkpoint.Owner{Run: "a", PID: 42, Started: started})
	require.NoError(t, err)
	o, err = st.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, r1, o.Revision)
	require.Equal(t, "a", o.Run)
	require.Equal(t, 42, o.PID)
	require.True(t, o.Started.Equal(started))
	require.False(t, o.At.IsZero(), "At is set when zero")

	r2, err := st.SetOwner(t.Context(), key, checkpoint.Owner{Run: "b", PID: 43, Fleet: "f", Epoch: 7, TimeoutMS: 5000})
	require.NoError(t, err)
	o, err = st.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "f", o.Fleet)
	require.Equal(t, uint64(7), o.Epoch)
	require.Equal(t, int64(5000), o.TimeoutMS)
	require.Greater(t, r2, r1)
	require.NoError(t, st.DeleteOwner(t.Context(), key, r1), "a stale delete is no error")
	o, err = st.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "b", o.Run, "a delete at an older revision leaves the successor's heartbeat")

	require.NoError(t, st.DeleteOwner(t.Context(), key, r2))
	o, err = st.LoadOwner(t.Context(), key)
	require.NoError(t, err)
	require.Zero(t, o, "deleted: no heartbeat")
}
