package natskv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks/natskv"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

// TestConformance runs the sinktest suite in its Mirror mode against an
// embedded server: Break shuts it down, Heal restarts it on the same port
// and store. Every case checks the rows the bucket holds against the
// changes written, folded per key.
func TestConformance(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	opts := srv.Options()
	t.Cleanup(func() { // the server Heal restarted last
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	// The bucket exists before the suite starts, so that its server-side
	// goroutines are not mistaken for the sink's in the leak check.
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "SINKTEST", Storage: jetstream.FileStorage})
	require.NoError(t, err)
	nc.Close()

	sinktest.Run(t, sinktest.Harness{
		Type: "nats_kv",
		YAML: "url: " + srv.URL() + "\nbucket: SINKTEST\nack_timeout: 2s\n",
		Read: func(t *testing.T) []sinktest.Received { return readBucket(t, srv.URL(), "SINKTEST") },
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
		Mirror:  suiteKey,
		IgnoreLeaks: []goleak.Option{
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
			goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		},
	})
}

// suiteKey is the key of a sinktest change's row, worked out by hand: the
// suite's tables have one int8 key column, first.
func suiteKey(c *cdc.Change) (string, bool) {
	if c.Op == cdc.OpMessage {
		return "", false
	}
	row := c.After
	if row == nil {
		row = c.Before
	}
	return fmt.Sprintf("%s.%s.%d", c.Schema, c.Table, row[0].(int64)), true
}

// entry is one key's last message in a bucket.
type entry struct {
	key     string
	seq     uint64
	op      string // KV-Operation: "", DEL or PURGE
	header  nats.Header
	payload []byte
}

// lastPerKey returns the last message of every key of bucket, in stream
// order (nil when the bucket does not exist yet), by a batched direct get:
// no consumer, whose server-side goroutines the leak check would see.
// Enough for the suite's buckets (the server answers at most 1024).
func lastPerKey(t testing.TB, url, bucket string) []entry {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := "$KV." + bucket + "."
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, js, "KV_"+bucket, []string{prefix + ">"})
	require.NoError(t, err)
	var out []entry
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return nil
		}
		require.NoError(t, err, "reading bucket %s", bucket)
		out = append(out, entry{key: m.Subject[len(prefix):], seq: m.Sequence, op: m.Header.Get("KV-Operation"),
			header: m.Header, payload: m.Data})
	}
	return out
}

// readBucket is the suite's Read: each row key's last value.
func readBucket(t *testing.T, url, bucket string) []sinktest.Received {
	t.Helper()
	var out []sinktest.Received
	for _, e := range lastPerKey(t, url, bucket) {
		if e.header.Get(natskv.HeaderTruncate) != "" {
			continue // a table's own key
		}
		h := map[string]string{}
		for k, vs := range e.header {
			h[k] = vs[0]
		}
		out = append(out, sinktest.Received{ID: h[natskv.HeaderID], Key: e.key, Payload: e.payload, Headers: h, Deleted: e.op != ""})
	}
	return out
}
