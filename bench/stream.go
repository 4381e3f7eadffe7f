package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// StreamMsgs returns how many messages stream holds (0 when it does not exist yet).
func StreamMsgs(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(cctx, stream)
	if err != nil {
		if err == jetstream.ErrStreamNotFound {
			return 0, nil
		}
		return 0, err
	}
	info, err := s.Info(cctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// WaitStored polls stream every interval until it holds n messages and
// returns the time it first saw them. alive returns an error when the
// producer has died.
func WaitStored(ctx context.Context, js jetstream.JetStream, stream string, n int, within, interval time.Duration, alive func() error) (time.Time, error) {
	return WaitStoredFirst(ctx, js, stream, n, within, interval, alive, nil)
}

// WaitStoredFirst is WaitStored that also calls first, once, at the first
// poll that finds the stream holding any message, with that count.
func WaitStoredFirst(ctx context.Context, js jetstream.JetStream, stream string, n int, within, interval time.Duration, alive func() error, first func(got uint64)) (time.Time, error) {
	deadline := time.Now().Add(within)
	var last uint64
	for {
		got, err := StreamMsgs(ctx, js, stream)
		now := time.Now()
		if err == nil {
			if got > 0 && first != nil {
				first(got)
				first = nil
			}
			last = got
			if got >= uint64(n) {
				return now, nil
			}
		}
		if alive != nil {
			if err := alive(); err != nil {
				return now, fmt.Errorf("stream %s holds %d of %d messages: %w", stream, last, n, err)
			}
		}
		if now.After(deadline) {
			return now, fmt.Errorf("stream %s holds %d messages after %s, want %d", stream, last, within, n)
		}
		select {
		case <-ctx.Done():
			return now, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Verified is what reading a stream back found.
type Verified struct {
	Msgs         int             `json:"msgs"`
	Duplicates   int             `json:"duplicates"`    // ids seen before
	OutOfOrder   int             `json:"out_of_order"`  // positions not above the previous one
	BadIDs       int             `json:"bad_ids"`       // not parseable as a bridge id
	PayloadBytes float64         `json:"payload_bytes"` // mean payload size
	HeaderBytes  float64         `json:"header_bytes"`  // mean header block size
	First, Last  time.Time       `json:"-"`             // stored timestamps
	Sample       MsgSample       `json:"-"`             // the first message
	Latencies    []time.Duration `json:"-"`             // stored − commit_time, when read with payloads
}

// MsgSample is one stored message, for building an equal-sized synthetic load.
type MsgSample struct {
	Subject string
	Header  map[string][]string
	Data    []byte
}

// OK reports whether every change is stored exactly once, in order.
func (v Verified) OK(want int) bool {
	return v.Msgs == want && v.Duplicates == 0 && v.OutOfOrder == 0 && v.BadIDs == 0
}

// Verify reads the whole stream back and checks that the Nats-Msg-Id's
// positions are unique and strictly increasing. With payloads it also
// computes the latency from each change's commit_time to its stored
// timestamp; without, it reads headers only (Nats-Msg-Size gives the size).
func Verify(ctx context.Context, js jetstream.JetStream, stream string, payloads bool) (Verified, error) {
	var v Verified
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return v, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return v, err
	}
	total := info.State.Msgs
	if total == 0 {
		return v, nil
	}
	// The first message in full, as a sample.
	if raw, err := s.GetMsg(ctx, info.State.FirstSeq); err == nil {
		v.Sample = MsgSample{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: !payloads})
	if err != nil {
		return v, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(8192))
	if err != nil {
		return v, err
	}
	defer it.Stop()
	var last cdc.Pos
	var prod string
	var pbytes, hbytes int64
	for uint64(v.Msgs) < total {
		nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			return v, fmt.Errorf("reading %s after %d of %d messages: %w", stream, v.Msgs, total, err)
		}
		v.Msgs++
		md, err := m.Metadata()
		if err != nil {
			return v, err
		}
		if v.Msgs == 1 {
			v.First = md.Timestamp
		}
		v.Last = md.Timestamp
		h := m.Headers()
		id := h.Get(jetstream.MsgIDHeader)
		p, pos, err := cdc.ParseID(id)
		switch {
		case err != nil:
			v.BadIDs++
		case prod == "":
			prod, last = p, pos
		case p != prod:
			v.BadIDs++ // one producer per run
		case pos == last:
			v.Duplicates++
		case !last.Less(pos):
			v.OutOfOrder++
		default:
			last = pos
		}
		for k, vs := range h {
			if k == "Nats-Msg-Size" {
				continue
			}
			for _, x := range vs {
				hbytes += int64(len(k) + len(x) + 4)
			}
		}
		if payloads {
			pbytes += int64(len(m.Data()))
			var body struct {
				CommitTime time.Time `json:"commit_time"`
			}
			if err := json.Unmarshal(m.Data(), &body); err == nil && !body.CommitTime.IsZero() {
				v.Latencies = append(v.Latencies, md.Timestamp.Sub(body.CommitTime))
			}
		} else if n, err := strconv.Atoi(h.Get("Nats-Msg-Size")); err == nil {
			pbytes += int64(n)
		}
	}
	v.PayloadBytes = float64(pbytes) / float64(v.Msgs)
	v.HeaderBytes = float64(hbytes)/float64(v.Msgs) + float64(len("NATS/1.0\r\n\r\n"))
	return v, nil
}

// Percentiles of a latency sample.
type Percentiles struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
}

// Percentile computes p50/p99/p99.9/max (nearest rank).
func Percentile(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Percentiles{N: len(s), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: s[len(s)-1]}
}

// DeleteStream removes a stream (ignoring a missing one) to free the disk.
func DeleteStream(ctx context.Context, js jetstream.JetStream, stream string) {
	_ = js.DeleteStream(ctx, stream)
}
