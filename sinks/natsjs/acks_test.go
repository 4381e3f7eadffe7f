package natsjs

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
)

// TestAckParse covers the replies a JetStream publish gets: the hand-read
// common form (with the server's "duplicate": true spacing and optional
// fields) and everything else through encoding/json.
func TestAckParse(t *testing.T) {
	a := &acker{stream: "CDC"}
	for _, tc := range []struct {
		name  string
		data  string
		hdr   nats.Header
		seq   uint64
		dup   bool
		errIs error
		code  jetstream.ErrorCode
	}{
		{name: "stored", data: `{"stream":"CDC","seq":12}`, seq: 12},
		{name: "duplicate", data: `{"stream":"CDC","seq":1,"duplicate": true}`, seq: 1, dup: true},
		{name: "duplicate, no space", data: `{"stream":"CDC","seq":9,"duplicate":true}`, seq: 9, dup: true},
		{name: "domain and batch", data: `{"stream":"CDC", "domain":"hub","seq":77,"batch":"b1","count":3}`, seq: 77},
		// Stored, but in another stream: not where the sink resumes from.
		{name: "another stream's name as a prefix", data: `{"stream":"CDC2","seq":5}`, code: jsErrCodeStreamNotMatch},
		{name: "another stream", data: `{"stream":"OTHER","seq":5}`, code: jsErrCodeStreamNotMatch},
		{name: "refused by another stream", data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 0"},"stream":"OTHER","seq":0}`, code: jsErrCodeStreamNotMatch},
		{name: "refused", data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"CDC","seq":0}`, code: 10071},
		{name: "no responders", hdr: nats.Header{"Status": []string{"503"}}, errIs: jetstream.ErrNoStreamResponse},
		{name: "other status", hdr: nats.Header{"Status": []string{"408"}}, errIs: jetstream.ErrInvalidJSAck},
		{name: "garbage", data: `not json`, errIs: jetstream.ErrInvalidJSAck},
		{name: "no stream", data: `{"seq":4}`, errIs: jetstream.ErrInvalidJSAck},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := a.parse(&nats.Msg{Data: []byte(tc.data), Header: tc.hdr})
			require.Equal(t, uint8(ackDone), r.state)
			switch {
			case tc.code != 0:
				var apiErr *jetstream.APIError
				require.ErrorAs(t, r.err, &apiErr)
				assert.Equal(t, tc.code, apiErr.ErrorCode)
			case tc.errIs != nil:
				require.ErrorIs(t, r.err, tc.errIs)
			default:
				require.NoError(t, r.err)
				assert.Equal(t, tc.seq, r.seq)
				assert.Equal(t, tc.dup, r.dup)
			}
		})
	}
}

// TestAckTimeout: a server that stops answering (a frozen link) fails the
// Write after ack_timeout, with nothing reported delivered; once it answers
// again, the next Write after Connect and Delivered stores every change
// once.
func TestAckTimeout(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	p := newProxy(t, srv.NATS().Addr().String())
	// Unfenced, so that every publish is in flight at once (a fenced Write
	// awaits its first ack before the rest).
	s := connected(t, srv, map[string]any{"url": p.URL(), "atomic_transactions": false, "expect_last_sequence": false, "ack_timeout": "300ms"})
	all := txs(producer, 0x1000, 12, 4)
	require.NoError(t, s.Write(t.Context(), all[:8]))

	p.freeze()
	start := time.Now()
	err := s.Write(t.Context(), all[8:])
	took := time.Since(start)
	require.ErrorIs(t, err, jetstream.ErrAsyncPublishTimeout)
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	assert.Len(t, berr.Failed, 40, "nothing acked is reported delivered")
	assert.GreaterOrEqual(t, took, 300*time.Millisecond, "waited for ack_timeout")
	// Each publish waits ack_timeout from its own publish, not from the
	// end of the previous wait: 40 unanswered publishes fail together, not
	// after 40 × ack_timeout (12 s).
	assert.Less(t, took, 4*time.Second, "the unanswered publishes timed out one after another")
	assert.False(t, errors.Is(err, sinks.ErrNotConnected))

	p.thaw()
	writeRest(t, s, all[8:])
	require.Equal(t, ids(all), storedIDs(t, srv.URL(), "CDC"))
}
