package checkpoint_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
)

// TestSaveOverOwnWriteOnFullStore: a Save whose earlier reply was lost
// finds its own run's write on top and writes over it; when that write
// fails for another reason (here the bucket's byte limit: a full store),
// the run is not fenced by itself: the error says what failed and is not
// ErrFenced, which would stop the pipeline for good.
func TestSaveOverOwnWriteOnFullStore(t *testing.T) {
	js := jsT(t)
	_, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "cpfull", History: checkpoint.History, MaxBytes: 2048})
	require.NoError(t, err)
	st, err := checkpoint.Open(t.Context(), js, "cpfull", 1)
	require.NoError(t, err)
	key := checkpoint.Key("shop", "main")

	rev0, err := st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: 100, Run: "b"}, 0)
	require.NoError(t, err)
	_, err = st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: 200, Run: "b"}, rev0) // its reply "lost"
	require.NoError(t, err)

	// The next save of the same run still expects rev0 and carries more
	// than the bucket has room for.
	big := checkpoint.State{Epoch: "e1", LSN: 300, Run: "b", Cursors: map[string]string{"main": strings.Repeat("9", 4096)}}
	_, err = st.Save(t.Context(), key, big, rev0)
	require.Error(t, err)
	require.NotErrorIs(t, err, checkpoint.ErrFenced, "a run is not fenced by its own write: %v", err)
	require.ErrorContains(t, err, "over this run's own revision")

	got, _, err := st.Load(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "b", got.Run)
	require.EqualValues(t, 200, got.LSN, "nothing written")
}
