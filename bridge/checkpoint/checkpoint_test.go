package checkpoint_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func jsT(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

func TestRoundTrip(t *testing.T) {
	js := jsT(t)
	st, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	key := checkpoint.Key("shop", "main")

	got, rev, err := st.Load(t.Context(), key)
	require.NoError(t, err)
	require.Zero(t, rev, "missing key")
	require.Zero(t, got.LSN)

	want := checkpoint.State{
		Epoch: checkpoint.NewEpoch(), LSN: 0x16B37A0, Cursors: map[string]string{"main": "42"},
		Run: "run1", SystemID: "7312345678901234567",
	}
	rev1, err := st.Save(t.Context(), key, want, 0)
	require.NoError(t, err)
	require.NotZero(t, rev1)

	got, rev, err = st.Load(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, rev1, rev)
	require.False(t, got.UpdatedAt.IsZero(), "Save fills UpdatedAt")
	want.UpdatedAt = got.UpdatedAt
	require.Equal(t, want, got)

	want.LSN = 0x16B3800
	want.UpdatedAt = time.Time{}
	rev2, err := st.Save(t.Context(), key, want, rev1)
	require.NoError(t, err)
	require.Greater(t, rev2, rev1)
	got, rev, err = st.Load(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, rev2, rev)
	require.Equal(t, cdc.LSN(0x16B3800), got.LSN)

	// Opening again finds the existing bucket.
	again, err := checkpoint.Open(t.Context(), js, "bridge_checkpoints", 1)
	require.NoError(t, err)
	_, rev, err = again.Load(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, rev2, rev)

	kv, err := js.KeyValue(t.Context(), "bridge_checkpoints")
	require.NoError(t, err)
	status, err := kv.Status(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, checkpoint.History, status.History())
}

func TestStoredForm(t *testing.T) {
	b, err := json.Marshal(checkpoint.State{Epoch: "abcd1234", LSN: 0x16B37A0})
	require.NoError(t, err)
	require.Contains(t, string(b), `"lsn":"0/16B37A0"`)
	var back checkpoint.State
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, cdc.LSN(0x16B37A0), back.LSN)
}

func TestFenced(t *testing.T) {
	js := jsT(t)
	st, err := checkpoint.Open(t.Context(), js, "cp", 1)
	require.NoError(t, err)
	key := checkpoint.Key("shop", "main")

	a := checkpoint.State{Epoch: "e1", LSN: 100, Run: "a"}
	revA, err := st.Save(t.Context(), key, a, 0)
	require.NoError(t, err)

	t.Run("create over existing", func(t *testing.T) {
		_, err := st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: 50, Run: "b"}, 0)
		require.ErrorIs(t, err, checkpoint.ErrFenced)
		require.ErrorContains(t, err, "another bridge instance owns this source")
	})

	// b takes over at the revision it loaded.
	_, revB0, err := st.Load(t.Context(), key)
	require.NoError(t, err)
	revB, err := st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: 200, Run: "b"}, revB0)
	require.NoError(t, err)

	t.Run("zombie update", func(t *testing.T) {
		_, err := st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: 150, Run: "a"}, revA)
		require.ErrorIs(t, err, checkpoint.ErrFenced)
		require.ErrorContains(t, err, "run b")
		got, rev, err := st.Load(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, revB, rev, "nothing written")
		require.Equal(t, cdc.LSN(200), got.LSN)
	})

	t.Run("retry of own lost write", func(t *testing.T) {
		s := checkpoint.State{Epoch: "e1", LSN: 300, Run: "b", Cursors: map[string]string{"main": "9"}}
		rev, err := st.Save(t.Context(), key, s, revB)
		require.NoError(t, err)
		again, err := st.Save(t.Context(), key, s, revB) // as if the reply had been lost
		require.NoError(t, err)
		require.Equal(t, rev, again)

		// The next save after a lost reply carries a newer position: it
		// goes on top of the run's own write, not into ErrFenced.
		next := checkpoint.State{Epoch: "e1", LSN: 400, Run: "b"}
		nrev, err := st.Save(t.Context(), key, next, revB)
		require.NoError(t, err)
		require.Greater(t, nrev, rev)
		got, _, err := st.Load(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, cdc.LSN(400), got.LSN)

		// Another run still fences.
		_, err = st.Save(t.Context(), key, checkpoint.State{Epoch: "e1", LSN: 500, Run: "c"}, revB)
		require.ErrorIs(t, err, checkpoint.ErrFenced)
	})

	require.False(t, errors.Is(nil, checkpoint.ErrFenced))
}

func TestKey(t *testing.T) {
	valid := regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)
	for _, tc := range []struct{ bridge, source, want string }{
		{"shop", "main", "shop.main"},
		{"shop", "a.b", "shop.a=2Eb"},
		{"shop.a", "b", "shop=2Ea.b"},
		{"my-bridge", "src_1", "my-bridge.src_1"},
		{"x", "", "x.="},
		{"x", "naïve café", "x.na=C3=AFve=20caf=C3=A9"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			k := checkpoint.Key(tc.bridge, tc.source)
			require.Equal(t, tc.want, k)
			require.Regexp(t, valid, k)
		})
	}
}

func TestNewEpoch(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		e := checkpoint.NewEpoch()
		require.Regexp(t, `^[0-9a-v]{8}$`, e)
		require.False(t, seen[e])
		seen[e] = true
	}
}

func TestOpen(t *testing.T) {
	js := jsT(t)
	t.Run("replicas beyond the cluster", func(t *testing.T) {
		_, err := checkpoint.Open(t.Context(), js, "r3", 3)
		require.ErrorContains(t, err, `opening checkpoint bucket "r3"`)
	})
	t.Run("escaped keys are usable", func(t *testing.T) {
		st, err := checkpoint.Open(t.Context(), js, "cp", 0) // 0 replicas means 1
		require.NoError(t, err)
		key := checkpoint.Key("x", "naïve café")
		_, err = st.Save(t.Context(), key, checkpoint.State{Epoch: "e"}, 0)
		require.NoError(t, err)
		got, rev, err := st.Load(t.Context(), key)
		require.NoError(t, err)
		require.NotZero(t, rev)
		require.Equal(t, "e", got.Epoch)
	})
}
