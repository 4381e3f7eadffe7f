// Changes the server would refuse: a payload too large for one message goes
// to the object store (large_payload_bucket), and any other refusal to the
// dead-letter subject (dead_letter_subject).

package natsjs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsconn"
)

// HeaderPayloadObject names the object ("<bucket>/<name>") holding a payload
// too large for one message; the message itself then carries no payload.
const HeaderPayloadObject = "Bridge-Payload-Object"

// offload puts msg's payload into the large-payload object store under the
// change's id and turns msg into a reference to it (a claim check). Putting
// the same id twice stores the same bytes, so replays stay exactly-once.
func (s *Sink) offload(ctx context.Context, js jetstream.JetStream, c *cdc.Change, msg *nats.Msg) error {
	bucket := s.cfg.LargePayloadBucket
	obs, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bucket, Storage: jetstream.FileStorage, Replicas: s.cfg.Replicas,
			Description: "payloads too large for one message, by change id"})
	}
	if err != nil {
		return fmt.Errorf("opening object store %q for the %d-byte payload of %s: %w", bucket, len(msg.Data), c.ID(), err)
	}
	chunk := uint32(128 << 10)
	if limit, _ := s.msgLimit(s.conn()); limit > 0 && limit-1024 < int(chunk) {
		chunk = uint32(max(limit-1024, 256))
	}
	meta := jetstream.ObjectMeta{Name: c.ID(), Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk}}
	if _, err := obs.Put(ctx, meta, bytes.NewReader(msg.Data)); err != nil {
		return fmt.Errorf("storing the %d-byte payload of %s in object store %q: %w", len(msg.Data), c.ID(), bucket, err)
	}
	msg.Header.Set(HeaderPayloadObject, bucket+"/"+c.ID())
	msg.Header.Set(HeaderPayloadBytes, strconv.Itoa(len(msg.Data)))
	msg.Data = nil
	return nil
}

func (s *Sink) conn() *nats.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nc
}

// Dead-letter headers, added to the change's own.
const (
	HeaderDeadLetterReason = "Bridge-Dead-Letter-Reason" // why the server would refuse the change
	HeaderOriginalSubject  = "Bridge-Original-Subject"   // the subject the route gave it
	HeaderPayloadBytes     = "Bridge-Payload-Bytes"      // set when the payload was left out for size
)

// msgLimit is the largest message the server and the stream accept (0 when
// unknown) and which limit that is.
func (s *Sink) msgLimit(nc *nats.Conn) (int, string) {
	limit, what := int(nc.MaxPayload()), "the server's max_payload"
	s.mu.Lock()
	if m := s.maxMsgSize; m > 0 && (limit <= 0 || m < limit) {
		limit, what = m, fmt.Sprintf("stream %q's max_msg_size", s.cfg.Stream)
	}
	s.mu.Unlock()
	return limit, what
}

// deadLetter turns msg into its dead letter: same id and headers (those
// of the publish included), the reason, the dead-letter subject, and the
// payload only when the whole message fits limit (0: unknown).
func (s *Sink) deadLetter(c *cdc.Change, msg *nats.Msg, limit int, reason error) *nats.Msg {
	h := msg.Header
	h.Set(HeaderDeadLetterReason, strings.NewReplacer("\r", " ", "\n", " ").Replace(reason.Error()))
	h.Set(HeaderOriginalSubject, strings.NewReplacer("\r", " ", "\n", " ").Replace(c.Subject))
	data := msg.Data
	if limit > 0 && len(data)+natsconn.HeaderSize(h) > limit {
		h.Set(HeaderPayloadBytes, strconv.Itoa(len(data)))
		data = nil
	}
	return &nats.Msg{Subject: s.cfg.DeadLetterSubject, Header: h, Data: data}
}
