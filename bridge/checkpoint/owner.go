package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Owner says which run holds a source's slot, kept in the checkpoint
// bucket under OwnerKey: written by a run once it holds the slot (in a
// fleet, or with checkpoint.owner_timeout set), rewritten every
// owner_timeout/4 while it holds it when owner_timeout is set (a
// heartbeat), and deleted when the run lets the slot go. Another instance
// that finds the slot held by the reader Owner names may end that reader
// when it knows the owner is stale: a fleet member holding the source's
// lease at a later epoch of the same fleet, or a standby that saw the
// heartbeat keep one revision for owner_timeout on its own clock
// (docs/operations.md, "Failover and standbys"). Field names are stable
// (`nats kv get`).
type Owner struct {
	// Run is the run id of the instance holding the slot.
	Run string `json:"run"`
	// PID and Started name the slot's reader, the walsender (its process
	// id and backend_start; Started is zero when the role may not see it).
	PID     int       `json:"pid"`
	Started time.Time `json:"started,omitzero"`
	// Fleet and Epoch are the fleet and the lease epoch under which the
	// run holds the slot; empty outside a fleet.
	Fleet string `json:"fleet,omitempty"`
	Epoch uint64 `json:"lease_epoch,omitempty"`
	// TimeoutMS is the owner's checkpoint.owner_timeout in milliseconds:
	// it rewrites the key every quarter of it. Zero: written once, not a
	// heartbeat, never judged stale by its age.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
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
