package checkpoint

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// Gone reports whether the store's bucket no longer exists (deleted under
// the bridge), as opposed to being unreachable for now. ctx bounds the
// round trip; an unanswered one reports false.
func (s *Store) Gone(ctx context.Context) bool {
	_, err := s.kv.Status(ctx)
	return errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// Bucket returns the bucket's name.
func (s *Store) Bucket() string { return s.bucket }
