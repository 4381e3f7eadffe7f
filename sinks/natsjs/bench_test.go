package natsjs

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// bigBatches returns n changes in transactions of 10, 300-byte payloads.
func bigBatches(n int, base cdc.LSN) []cdc.Change {
	batch := txs(producer, base, n/10, 10)
	payload := make([]byte, 300)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for i := range batch {
		batch[i].Payload = payload
	}
	return batch
}

// BenchmarkWrite writes 1000-change batches of 300-byte payloads to a file
// stream on an in-process server.
func BenchmarkWrite(b *testing.B) {
	srv := natsembed.StartT(b, natsembed.Options{})
	s := connected(b, srv, nil)
	const size = 1000
	batches := make([][]cdc.Change, 0, b.N)
	for i := range b.N {
		batches = append(batches, bigBatches(size, cdc.LSN(i+1)<<20))
	}
	b.SetBytes(size * 300)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if err := s.Write(b.Context(), batches[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "msgs/s")
}

// TestDelivered100k measures Delivered over a stream of 100k messages
// (a 90k-message gap to read through, 10k of them after the cursor of a
// second producer interleaved).
func TestDelivered100k(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	const n = 100_000
	all := bigBatches(n, 0x1000)
	for i := 0; i < n; i += 1000 {
		require.NoError(t, s.Write(t.Context(), all[i:i+1000]))
	}
	for _, tc := range []struct {
		name   string
		cursor string
		want   int
	}{
		{"whole stream", "", n},
		{"last 10k", fmt.Sprint(n - 10_000), 10_000},
	} {
		start := time.Now()
		got, err := s.Delivered(t.Context(), producer, tc.cursor)
		took := time.Since(start)
		require.NoError(t, err)
		require.Len(t, got, tc.want)
		t.Logf("Delivered over %s (%d messages): %s (%.0f msgs/s)", tc.name, tc.want, took, float64(tc.want)/took.Seconds())
	}
}

func BenchmarkDelivered(b *testing.B) {
	srv := natsembed.StartT(b, natsembed.Options{})
	s := connected(b, srv, nil)
	const n = 100_000
	all := bigBatches(n, 0x1000)
	for i := 0; i < n; i += 1000 {
		require.NoError(b, s.Write(b.Context(), all[i:i+1000]))
	}
	b.ResetTimer()
	for range b.N {
		got, err := s.Delivered(b.Context(), producer, "")
		if err != nil || len(got) != n {
			b.Fatal(err, len(got))
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
}
