package natsjs

import (
	"testing"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// BenchmarkWriteModes compares the publishing modes on a file stream of an
// in-process server: 1000-change Writes of 300-byte payloads, in
// transactions of perTx changes; message by message with and without the
// Nats-Expected-Last-Sequence fence, and as atomic batches; with the
// server's default sync interval and with sync_interval: always.
//
//	go test -run '^$' -bench WriteModes -benchtime 20x ./sinks/natsjs/
func BenchmarkWriteModes(b *testing.B) {
	for _, m := range []struct {
		name   string
		perTx  int
		sync   bool
		config map[string]any
	}{
		{"per_message/unfenced", 10, false, map[string]any{"expect_last_sequence": false}},
		{"per_message/fenced", 10, false, nil},
		{"atomic/tx10", 10, false, map[string]any{"atomic_transactions": true}},
		{"atomic/tx100", 100, false, map[string]any{"atomic_transactions": true}},
		{"atomic/tx1000", 1000, false, map[string]any{"atomic_transactions": true}},
		{"sync_always/per_message", 10, true, nil},
		{"sync_always/atomic_tx10", 10, true, map[string]any{"atomic_transactions": true}},
		{"sync_always/atomic_tx100", 100, true, map[string]any{"atomic_transactions": true}},
	} {
		b.Run(m.name, func(b *testing.B) {
			srv := natsembed.StartT(b, natsembed.Options{SyncAlways: m.sync})
			s := connected(b, srv, m.config)
			const size = 1000
			payload := make([]byte, 300)
			for i := range payload {
				payload[i] = 'a' + byte(i%26)
			}
			batches := make([][]cdc.Change, 0, b.N)
			for i := range b.N {
				batch := txs(producer, cdc.LSN(i+1)<<20, size/m.perTx, m.perTx)
				for k := range batch {
					batch[k].Payload = payload
				}
				batches = append(batches, batch)
			}
			b.SetBytes(size * 300)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if err := s.Write(b.Context(), batches[i]); err != nil {
					b.Fatal(err)
				}
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(b.N*size)/el, "msgs/s")
			b.ReportMetric(float64(b.N*size/m.perTx)/el, "txs/s")
		})
	}
}
