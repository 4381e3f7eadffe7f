package checkpoint_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
)

// TestStateJSONCompatible: a checkpoint written before config_rev and
// paused existed decodes, and a state without them writes neither key.
func TestStateJSONCompatible(t *testing.T) {
	var st checkpoint.State
	require.NoError(t, json.Unmarshal([]byte(`{"epoch":"e1","lsn":"0/16B37A0","updated_at":"2024-01-02T03:04:05Z","run":"r"}`), &st))
	require.Equal(t, "e1", st.Epoch)
	require.Empty(t, st.ConfigRev)
	require.False(t, st.Paused)
	b, err := json.Marshal(checkpoint.State{Epoch: "e1", LSN: 1})
	require.NoError(t, err)
	require.NotContains(t, string(b), "config_rev")
	require.NotContains(t, string(b), "paused")
	b, err = json.Marshal(checkpoint.State{Epoch: "e1", LSN: 1, ConfigRev: "abc", Paused: true})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &st))
	require.Equal(t, "abc", st.ConfigRev)
	require.True(t, st.Paused)
}

// TestControl: the operator's order is read, written and watched beside
// the checkpoint; the watch starts with the value now (none: not paused)
// and follows each change.
func TestControl(t *testing.T) {
	js := jsT(t)
	st, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	key := checkpoint.ControlKey("shop", "main")
	require.Equal(t, "shop.main.control", key)

	c, err := st.LoadControl(t.Context(), key)
	require.NoError(t, err)
	require.False(t, c.Paused)
	require.Zero(t, c.Revision)

	ch, err := st.WatchControl(t.Context(), key, nil)
	require.NoError(t, err)
	recv := func() checkpoint.Control {
		select {
		case c := <-ch:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no value from the watch")
		}
		return checkpoint.Control{}
	}
	require.False(t, recv().Paused, "no key: not paused")

	require.NoError(t, st.SetControl(t.Context(), key, checkpoint.Control{Paused: true, Reason: "maintenance", By: "test"}))
	got := recv()
	require.True(t, got.Paused)
	require.Equal(t, "maintenance", got.Reason)
	require.NotZero(t, got.Revision)
	require.False(t, got.At.IsZero(), "SetControl fills At")

	c, err = st.LoadControl(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, got.Revision, c.Revision)

	require.NoError(t, st.SetControl(t.Context(), key, checkpoint.Control{Paused: false}))
	require.False(t, recv().Paused)
}
