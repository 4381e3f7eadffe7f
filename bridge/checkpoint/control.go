package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Control is the operator's standing order for a source, kept in the
// checkpoint bucket under ControlKey, so that every instance of the bridge
// (a restarted one, a standby) honours it. Field names are stable (`nats kv
// get`).
type Control struct {
	// Paused stops the source at a transaction boundary: no run opens its
	// slot until it is false again. The slot is kept, so Postgres retains
	// the WAL written meanwhile.
	Paused bool `json:"paused"`
	// Reason is the operator's note, if any.
	Reason string `json:"reason,omitempty"`
	// By names who set it: a bridge instance ("run <id>") or a command.
	By string `json:"by,omitempty"`
	// At is when it was set.
	At time.Time `json:"at"`
	// Schema, on a pause for a breaking schema change (on_schema_change:
	// pause), is the held version: its table ("schema.table"), its number
	// and its registry key.
	Schema *HeldSchema `json:"schema,omitempty"`
	// Revision is the KV revision it was read at (0: the key does not
	// exist); not stored.
	Revision uint64 `json:"-"`
}

// HeldSchema is the version of a table a pause holds.
type HeldSchema struct {
	Table       string `json:"table"`
	Version     int    `json:"version"`
	RegistryKey string `json:"registry_key"`
}

// ControlKey returns the KV key of a source's Control, beside its
// checkpoint: "<bridge>.<source>.control".
func ControlKey(bridge, source string) string { return Key(bridge, source) + ".control" }

// LoadControl returns the Control under key; a missing key is the zero
// Control (not paused) at Revision 0. ctx bounds the round trip; a lost
// connection ends it at once with nats.ErrDisconnected (as for Save).
func (s *Store) LoadControl(ctx context.Context, key string) (_ Control, err error) {
	ctx, stop := s.untilReconnect(ctx)
	defer func() { err = stop(ctx, err) }()
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Control{}, nil
	}
	if err != nil {
		return Control{}, fmt.Errorf("loading %q from bucket %q: %w", key, s.bucket, err)
	}
	return decodeControl(key, e)
}

func decodeControl(key string, e jetstream.KeyValueEntry) (Control, error) {
	if e.Operation() != jetstream.KeyValuePut || len(e.Value()) == 0 {
		return Control{Revision: e.Revision()}, nil // deleted or purged: no order
	}
	var c Control
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		return Control{Revision: e.Revision()}, fmt.Errorf("decoding %q (revision %d): %w (fix it with `nats kv put` or delete it)", key, e.Revision(), err)
	}
	c.Revision = e.Revision()
	return c, nil
}

// SetControl writes c under key (the last writer wins: it is an order,
// not a position). At is set to now when zero.
func (s *Store) SetControl(ctx context.Context, key string, c Control) error {
	if c.At.IsZero() {
		c.At = time.Now().UTC()
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("writing %q to bucket %q: %w", key, s.bucket, err)
	}
	return nil
}

// WatchControl sends the Control under key on the returned channel: its
// value now (the zero Control when there is none), then each change, until
// ctx ends or the watch fails (the channel is then closed). The channel
// holds the latest value only. A value that does not decode is sent as the
// zero Control (not paused), its error given to onErr (nil: ignored).
func (s *Store) WatchControl(ctx context.Context, key string, onErr func(error)) (<-chan Control, error) {
	w, err := s.kv.Watch(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("watching %q in bucket %q: %w", key, s.bucket, err)
	}
	out := make(chan Control, 1)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		seen := false
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				var c Control
				if e == nil {
					// The end of the initial values: sent only when there was none.
					if seen {
						continue
					}
				} else {
					var err error
					if c, err = decodeControl(key, e); err != nil && onErr != nil {
						onErr(err)
					}
				}
				seen = true
				// Keep only the latest: a slow reader must see the last order.
				select {
				case <-out:
				default:
				}
				out <- c
			}
		}
	}()
	return out, nil
}
