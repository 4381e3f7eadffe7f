package natsjs

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
)

// sweepLimit is the max_payload of the payload-boundary tests' server.
const sweepLimit = 4096

// sizedChanges returns transactions of perTx changes whose payloads are
// sizes[i] bytes, in order, commit LSNs from base upwards.
func sizedChanges(base cdc.LSN, sizes []int, perTx int) []cdc.Change {
	batch := txs(producer, base, len(sizes)/perTx, perTx)
	for i := range batch {
		p := bytes.Repeat([]byte{'a' + byte(i%26)}, sizes[i])
		copy(p, batch[i].ID()) // each payload its own
		batch[i].Payload = p
	}
	return batch
}

// sweepSizes returns payload sizes from limit-width to limit+over in steps
// of step bytes, n of them rounded down to a multiple of perTx.
func sweepSizes(limit, width, over, step, perTx int) []int {
	var out []int
	for size := limit - width; size <= limit+over; size += step {
		out = append(out, size)
	}
	return out[:len(out)/perTx*perTx]
}

// wireSize is what NATS counts against max_payload: the header block as
// sent plus the payload (the subject does not count).
func wireSize(h nats.Header, data []byte) int {
	if len(h) == 0 {
		return len(data)
	}
	return natsconn.HeaderSize(h) + len(data)
}

// without returns a copy of h without keys.
func without(h nats.Header, keys ...string) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		out[k] = v
	}
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// checkDiverted checks that each stored message is batch[i]'s: inline when
// the whole message fits max_payload, else offloaded (when bucket is set)
// or dead-lettered (to dlq), the decision exact: a diverted change's
// message, as it would have been sent inline with every header the publish
// adds, is over the limit. It returns how many went each way.
func checkDiverted(t *testing.T, url, stream string, batch []cdc.Change, limit int, bucket, dlq string) (inline, offloaded, dead int) {
	t.Helper()
	msgs := stored(t, url, stream)
	require.Len(t, msgs, len(batch), "every change stored once")
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for i, m := range msgs {
		c := &batch[i]
		require.Equal(t, c.ID(), m.Header.Get(jetstream.MsgIDHeader), "#%d in order", i)
		size := len(c.Payload)
		switch {
		case m.Header.Get(HeaderPayloadObject) != "":
			offloaded++
			require.NotEmpty(t, bucket, "#%d offloaded without a bucket", i)
			require.Equal(t, c.Subject, m.Subject)
			require.Empty(t, m.Data)
			require.Equal(t, bucket+"/"+c.ID(), m.Header.Get(HeaderPayloadObject))
			require.Equal(t, strconv.Itoa(size), m.Header.Get(HeaderPayloadBytes))
			obs, err := js.ObjectStore(t.Context(), bucket)
			require.NoError(t, err)
			got, err := obs.GetBytes(t.Context(), c.ID())
			require.NoError(t, err)
			require.Equal(t, c.Payload, got, "#%d: the object holds the payload", i)
			inl := wireSize(without(m.Header, HeaderPayloadObject, HeaderPayloadBytes), c.Payload)
			require.Greater(t, inl, limit, "#%d (%d-byte payload) offloaded though its message, %d bytes, fits", i, size, inl)
		case m.Header.Get(HeaderDeadLetterReason) != "":
			dead++
			require.NotEmpty(t, dlq, "#%d dead-lettered without a dead-letter subject", i)
			require.Equal(t, dlq, m.Subject)
			require.Equal(t, c.Subject, m.Header.Get(HeaderOriginalSubject))
			require.Contains(t, m.Header.Get(HeaderDeadLetterReason), fmt.Sprintf("max_payload of %d", limit))
			if len(m.Data) == 0 {
				require.Equal(t, strconv.Itoa(size), m.Header.Get(HeaderPayloadBytes))
			} else {
				require.Equal(t, c.Payload, m.Data)
			}
			inl := wireSize(without(m.Header, HeaderDeadLetterReason, HeaderOriginalSubject, HeaderPayloadBytes), c.Payload)
			require.Greater(t, inl, limit, "#%d (%d-byte payload) dead-lettered though its message, %d bytes, fits", i, size, inl)
		default:
			inline++
			require.Equal(t, c.Subject, m.Subject)
			require.Equal(t, c.Payload, m.Data, "#%d inline", i)
			require.LessOrEqual(t, wireSize(m.Header, m.Data), limit)
		}
	}
	return inline, offloaded, dead
}

// TestPayloadBoundary sweeps payload sizes across the server's max_payload
// in small steps, with every way a Write publishes (message by message,
// atomic batches, fast batches; fenced or not) and every diversion (object
// store, dead letters, both): each change is stored once, in order, inline
// exactly when its whole message (every header the publish adds included)
// fits, and the Write succeeds. A size check that leaves out a header
// publishes a message the client or server refuses for good instead.
func TestPayloadBoundary(t *testing.T) {
	modes := []struct {
		name  string
		cfg   map[string]any
		perTx int
	}{
		{"per message", map[string]any{}, 1},
		{"atomic", map[string]any{"atomic_transactions": true}, 2},
		{"fast batch", map[string]any{"fast_batch": true}, 1},
	}
	diverts := []struct {
		name        string
		bucket, dlq string
	}{
		{"bucket", "big", ""},
		{"dead letters", "", "cdc.dead"},
		{"both", "big", "cdc.dead"},
	}
	for _, mode := range modes {
		for _, fenced := range []bool{true, false} {
			for _, d := range diverts {
				t.Run(fmt.Sprintf("%s/fenced=%v/%s", mode.name, fenced, d.name), func(t *testing.T) {
					srv := natsembed.StartT(t, natsembed.Options{MaxPayload: sweepLimit})
					cfg := map[string]any{"expect_last_sequence": fenced}
					for k, v := range mode.cfg {
						cfg[k] = v
					}
					if d.bucket != "" {
						cfg["large_payload_bucket"] = d.bucket
					}
					if d.dlq != "" {
						cfg["dead_letter_subject"] = d.dlq
					}
					s := connected(t, srv, cfg)
					// Two Writes: the first starts the fence's chain, the
					// second publishes behind it.
					sizes := sweepSizes(sweepLimit, 600, 40, 4, mode.perTx)
					batch := sizedChanges(0x1000, sizes, mode.perTx)
					half := len(batch) / 2 / mode.perTx * mode.perTx
					require.NoError(t, s.Write(t.Context(), batch[:half]))
					require.NoError(t, s.Write(t.Context(), batch[half:]))
					inline, offloaded, dead := checkDiverted(t, srv.URL(), "CDC", batch, sweepLimit, d.bucket, d.dlq)
					t.Logf("%d inline, %d offloaded, %d dead-lettered", inline, offloaded, dead)
					require.NotZero(t, inline)
					require.NotZero(t, offloaded+dead)
				})
			}
		}
	}
}

// TestPayloadBoundaryRefused: without a bucket or a dead-letter subject, a
// change whose whole message fits is published and the next larger one is
// refused by the sink itself, permanently, naming the size with every
// header counted and the fix, before anything is sent.
func TestPayloadBoundaryRefused(t *testing.T) {
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{MaxPayload: sweepLimit})
			s := connected(t, srv, map[string]any{"expect_last_sequence": fenced})
			sizes := sweepSizes(sweepLimit, 500, 0, 2, 1)
			batch := sizedChanges(0x1000, sizes, 1)
			var refused error
			n := 0
			for i := range batch {
				if refused = s.Write(t.Context(), batch[i:i+1]); refused != nil {
					break
				}
				n++
			}
			require.Error(t, refused, "a payload of max_payload bytes cannot fit with headers")
			require.True(t, sinks.IsPermanent(refused), "%v", refused)
			require.ErrorContains(t, refused, "set large_payload_bucket")
			require.NotErrorIs(t, refused, nats.ErrMaxPayload, "decided before the publish")
			msgs := stored(t, srv.URL(), "CDC")
			require.Len(t, msgs, n)
			require.NotZero(t, n)
			last := msgs[n-1]
			// The refused one is two bytes larger than the last stored one,
			// with the same headers (the fence's value may have one more digit).
			want := wireSize(last.Header, last.Data) + 2
			if fenced {
				want += len(strconv.FormatUint(last.Sequence, 10)) - len(strconv.FormatUint(last.Sequence-1, 10))
			}
			require.Greater(t, want, sweepLimit)
			require.Contains(t, refused.Error(), fmt.Sprintf("the message is %d bytes", want))
			require.True(t, strings.Contains(refused.Error(), batch[n].ID()), "%v", refused)
		})
	}
}

// TestPayloadBoundaryAtomicReplay: an atomic batch the stream refuses for
// a change it holds already is published again message by message, with
// other headers than the batch's: each message is sized again for that.
func TestPayloadBoundaryAtomicReplay(t *testing.T) {
	stream := "CDC_" + strings.Repeat("X", 60)
	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			srv := natsembed.StartT(t, natsembed.Options{MaxPayload: sweepLimit})
			s := connected(t, srv, map[string]any{"stream": stream, "expect_last_sequence": fenced, "atomic_transactions": true,
				"large_payload_bucket": "big", "dead_letter_subject": "cdc.dead"})
			batch := sizedChanges(0x1000, sweepSizes(sweepLimit, 500, 0, 4, 2), 2)
			var want []cdc.Change // in the order the stream stores them
			for i := 0; i < len(batch); i += 2 {
				tx := batch[i : i+2]
				require.NoError(t, s.Write(t.Context(), tx[1:]), "tx %d: its second change alone", i/2)
				require.NoError(t, s.Write(t.Context(), tx), "tx %d: whole, as a replay", i/2)
				want = append(want, tx[1], tx[0])
			}
			inline, offloaded, dead := checkDiverted(t, srv.URL(), stream, want, sweepLimit, "big", "cdc.dead")
			t.Logf("%d inline, %d offloaded, %d dead-lettered", inline, offloaded, dead)
			require.NotZero(t, inline)
			require.NotZero(t, offloaded)
		})
	}
}
