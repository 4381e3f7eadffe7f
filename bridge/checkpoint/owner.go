package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Owner is the heartbeat of the run that holds a source's slot, kept in the
// checkpoint bucket under OwnerKey when checkpoint.owner_timeout is set: the
// run rewrites it every owner_timeout/4 while it holds the slot, and deletes
// it when it lets the slot go. A standby that finds the slot held by the
// reader Owner names, and sees the key keep one revision for owner_timeout
// on its own clock, takes the owner for stalled and may end its reader
// (docs/operations.md, "Failover and standbys"). Field names are stable
// (`nats kv get`).
type Owner struct {
	// Run is the run id of the instance holding the slot.
	Run string `json:"run"`
	// PID and Started name the slot's reader, the walsender (its process
	// id and backend_start; Started is zero when the role may not see it).
	PID     int       `json:"pid"`
	Started time.Time `json:"started,omitzero"`
	// At is when the heartbeat was written, on the owner's clock: for
	// people; staleness is judged by revisions, never by comparing clocks.
	At time.Time `json:"at"`
	// Revision is the KV revision it was read at (0: the key does not
	// exist, or was deleted); not stored.
	Revision uint64 `json:"-"`
}

// OwnerKey returns the KV key of a source's Owner heartbeat, beside its
// checkpoint: "<bridge>.<source>.owner".
func OwnerKey(bridge, source string) string { return Key(bridge, source) + ".owner" }

// LoadOwner returns the Owner under key; a missing or deleted key is the
// zero Owner (Revision 0). ctx bounds the round trip.
func (s *Store) LoadOwner(ctx context.Context, key string) (Owner, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Owner{}, nil
	}
	if err != nil {
		return Owner{}, fmt.Errorf("loading %q from bucket %q: %w", key, s.bucket, denied(s.nc, err))
	}
	if e.Operation() != jetstream.KeyValuePut || len(e.Value()) == 0 {
		return Owner{}, nil
	}
	var o Owner
	if err := json.Unmarshal(e.Value(), &o); err != nil {
		return Owner{Revision: e.Revision()}, fmt.Errorf("decoding %q from bucket %q (revision %d): %w", key, s.bucket, e.Revision(), err)
	}
	o.Revision = e.Revision()
	return o, nil
}

// SetOwner writes o under key (the last writer wins: only the slot's
// holder writes it) and returns the revision written. At is set to now
// when zero. ctx bounds the round trip.
func (s *Store) SetOwner(ctx context.Context, key string, o Owner) (uint64, error) {
	if o.At.IsZero() {
		o.At = time.Now().UTC()
	}
	b, err := json.Marshal(o)
	if err != nil {
		return 0, fmt.Errorf("encoding %q: %w", key, err)
	}
	rev, err := s.kv.Put(ctx, key, b)
	if err != nil {
		return 0, fmt.Errorf("writing %q to bucket %q: %w", key, s.bucket, denied(s.nc, err))
	}
	return rev, nil
}

// DeleteOwner deletes the Owner under key if the key is still at revision
// rev, the writer's last: a successor's heartbeat written since stays.
// ctx bounds the round trip.
func (s *Store) DeleteOwner(ctx context.Context, key string, rev uint64) error {
	if err := s.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) &&
		!errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("deleting %q from bucket %q at revision %d: %w", key, s.bucket, rev, denied(s.nc, err))
	}
	return nil
}
