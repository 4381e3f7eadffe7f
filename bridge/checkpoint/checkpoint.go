// Package checkpoint keeps the bridge's LSN checkpoint in a JetStream
// key-value bucket, written with compare-and-set so that a second bridge
// instance on the same source is fenced off (DESIGN.md §4.3).
//
// The pipeline Loads the key once at start, keeps the revision, and passes it
// to every Save; each successful Save returns the next revision to use. A
// Save that finds another revision in the bucket fails with ErrFenced: some
// other instance wrote the key, and this one must stop publishing at once.
package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/kvkey"
	"github.com/bridgecdc/bridge/internal/natsconn"
)

// ErrFenced is returned (wrapped) by Save when the key holds a revision
// other than the one given: another bridge instance owns this source.
var ErrFenced = errors.New("checkpoint: fenced: another bridge instance owns this source")

// History is the number of revisions the bucket keeps per key.
const History = 5

// State is what a checkpoint records for one source.
type State struct {
	// Epoch is the producer epoch (DESIGN.md §3): replaced only when
	// continuity is deliberately broken.
	Epoch string
	// LSN is the commit end LSN up to which every change is in every sink.
	LSN cdc.LSN
	// Cursors are the sinks' resume cursors (sinks.Resumer), by sink name.
	Cursors map[string]string
	// UpdatedAt is when the state was saved; Save fills it when zero.
	UpdatedAt time.Time
	// Run identifies the bridge process that wrote the state.
	Run string
	// SystemID is the Postgres system_identifier of the source, Timeline
	// the timeline the source's server was on when the run that saved the
	// state opened it, and Standby whether that server was in recovery
	// (sources.Lineage): a failover is checked against them. Empty in
	// checkpoints of older versions.
	SystemID string
	Timeline uint32
	Standby  bool
	// ConfigRev is the revision of the configuration (config.Revision) in
	// effect when the state was saved: the routes that published what
	// the checkpoint covers last. Empty in checkpoints of older versions.
	ConfigRev string
	// Paused is true when the run that saved the state stopped at a
	// transaction boundary because the operator paused the source
	// (ControlKey); the next run that opens the slot saves it false.
	Paused bool
}

// stateJSON is State's stored form; the LSN is kept in Postgres' "X/Y" form
// so that the value is readable with `nats kv get`.
type stateJSON struct {
	Epoch     string            `json:"epoch"`
	LSN       string            `json:"lsn"`
	Cursors   map[string]string `json:"cursors,omitempty"`
	UpdatedAt time.Time         `json:"updated_at"`
	Run       string            `json:"run,omitempty"`
	SystemID  string            `json:"system_id,omitempty"`
	Timeline  uint32            `json:"timeline,omitempty"`
	Standby   bool              `json:"standby,omitempty"`
	ConfigRev string            `json:"config_rev,omitempty"`
	Paused    bool              `json:"paused,omitempty"`
}

// MarshalJSON encodes s with the LSN in Postgres form, e.g. "0/16B37A0".
func (s State) MarshalJSON() ([]byte, error) {
	return json.Marshal(stateJSON{
		Epoch: s.Epoch, LSN: s.LSN.String(), Cursors: s.Cursors,
		UpdatedAt: s.UpdatedAt, Run: s.Run, SystemID: s.SystemID, Timeline: s.Timeline, Standby: s.Standby,
		ConfigRev: s.ConfigRev, Paused: s.Paused,
	})
}

// UnmarshalJSON decodes what MarshalJSON wrote.
func (s *State) UnmarshalJSON(b []byte) error {
	var j stateJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var lsn cdc.LSN
	if j.LSN != "" {
		var err error
		if lsn, err = cdc.ParseLSN(j.LSN); err != nil {
			return err
		}
	}
	*s = State{Epoch: j.Epoch, LSN: lsn, Cursors: j.Cursors, UpdatedAt: j.UpdatedAt, Run: j.Run, SystemID: j.SystemID,
		Timeline: j.Timeline, Standby: j.Standby, ConfigRev: j.ConfigRev, Paused: j.Paused}
	return nil
}

// Store reads and writes checkpoints in one bucket. It is safe for
// concurrent use, but each key should have one writer: that is what Save's
// compare-and-set enforces.
type Store struct {
	kv     jetstream.KeyValue
	nc     *nats.Conn
	bucket string
	log    *slog.Logger

	checking atomic.Bool // checkAlive is under way
}

// SetLogger makes s log what it finds of its connection (checkAlive);
// call it before using s. Default: nothing is logged.
func (s *Store) SetLogger(log *slog.Logger) { s.log = log }

// checkAlive, after a round trip of s timed out, checks in the background
// that s's connection still answers a ping, and reconnects it when it does
// not (natsconn.Alive): a connection whose link went silent is replaced
// at its first timeout, before its pings declare it stale, so that runs do
// not fail one after the other on it. One check at a time.
func (s *Store) checkAlive() {
	if s.nc == nil || !s.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.checking.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		window := s.nc.Opts.PingInterval * time.Duration(s.nc.Opts.MaxPingsOut)
		_ = natsconn.Alive(ctx, s.nc, min(5*time.Second, max(window, time.Second)), s.log)
	}()
}

// untilReconnect returns ctx, canceled with cause nats.ErrDisconnected when
// s's connection starts reconnecting or closes (a round trip under way
// then is never answered), and stop, which releases it and returns the
// error of the round trip, marked as nats.ErrDisconnected when the
// connection was lost; a round trip that timed out starts checkAlive.
func (s *Store) untilReconnect(ctx context.Context) (context.Context, func(context.Context, error) error) {
	if s.nc == nil {
		return ctx, func(_ context.Context, err error) error { return err }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	ch := s.nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	go func() {
		select {
		case _, ok := <-ch:
			if ok {
				cancel(nats.ErrDisconnected)
			}
		case <-ctx.Done():
		}
	}()
	return ctx, func(ctx context.Context, err error) error {
		switch lost := errors.Is(context.Cause(ctx), nats.ErrDisconnected); {
		case err != nil && lost && !errors.Is(err, nats.ErrDisconnected):
			err = fmt.Errorf("%w (%w)", err, nats.ErrDisconnected)
		case errors.Is(err, context.DeadlineExceeded) && !lost:
			s.checkAlive()
		}
		cancel(nil)
		s.nc.RemoveStatusListener(ch)
		return err
	}
}

// denied returns, for err, the failure of a round trip on nc that got no
// answer because the server refused a permission, the error naming the
// subject and the permission to grant (natsconn.PermissionDenied); else err.
func denied(nc *nats.Conn, err error) error {
	if d := natsconn.PermissionDenied(nc, err); d != nil {
		return d
	}
	return err
}

// Open returns the store for bucket, creating the bucket (file storage,
// History revisions per key, the given replicas) when it does not exist.
// An existing bucket is used as it is. ctx bounds the round trips.
func Open(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*Store, error) {
	if replicas <= 0 {
		replicas = 1
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "Postgres → NATS bridge checkpoints",
			History:     History,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // created concurrently, with other settings
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint bucket %q: %w", bucket, denied(js.Conn(), err))
	}
	return &Store{kv: kv, nc: js.Conn(), bucket: bucket, log: slog.New(slog.DiscardHandler)}, nil
}

// Load returns the state under key and its revision; a missing (or
// deleted) key gives the zero State and revision 0, which Save then
// creates. ctx bounds the round trip; a lost connection ends it at once
// with nats.ErrDisconnected (as for Save).
func (s *Store) Load(ctx context.Context, key string) (_ State, _ uint64, err error) {
	ctx, stop := s.untilReconnect(ctx)
	defer func() { err = stop(ctx, err) }()
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return State{}, 0, nil
	}
	if err != nil {
		return State{}, 0, fmt.Errorf("loading checkpoint %q from bucket %q: %w", key, s.bucket, denied(s.nc, err))
	}
	var st State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return State{}, 0, fmt.Errorf("decoding checkpoint %q from bucket %q (revision %d): %w", key, s.bucket, e.Revision(), err)
	}
	return st, e.Revision(), nil
}

// Save writes st under key if the key is still at revision rev (0: the key
// must not exist), and returns the new revision. If another revision is
// there, the error wraps ErrFenced and nothing was written. UpdatedAt is set
// to now when zero.
//
// A Save whose reply was lost (timeout, reconnect) may still have been
// written. Retrying it with the same rev then finds a newer revision; if
// that revision holds this very state (same Run, non-empty, and the same
// epoch, LSN, cursors and system id), Save returns it as a success instead
// of ErrFenced; if it holds another state of this same run, st is written
// on top of it (compare-and-set at that revision). ctx bounds the round
// trips; a Save during which the connection is lost (a reset, or a link
// the pings took for dead) fails at once with nats.ErrDisconnected
// instead of waiting for ctx's deadline: its request will never be
// answered.
func (s *Store) Save(ctx context.Context, key string, st State, rev uint64) (_ uint64, err error) {
	if st.UpdatedAt.IsZero() {
		st.UpdatedAt = time.Now().UTC()
	}
	ctx, stop := s.untilReconnect(ctx)
	defer func() { err = stop(ctx, err) }()
	b, err := json.Marshal(st)
	if err != nil {
		return 0, fmt.Errorf("encoding checkpoint %q: %w", key, err)
	}
	var next uint64
	if rev == 0 {
		next, err = s.kv.Create(ctx, key, b)
	} else {
		next, err = s.kv.Update(ctx, key, b, rev)
	}
	if err == nil {
		return next, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("saving checkpoint %q to bucket %q at revision %d: %w", key, s.bucket, rev, denied(s.nc, err))
	}
	cur, curRev, lerr := s.Load(ctx, key)
	if lerr == nil && curRev > rev && sameWrite(cur, st) {
		return curRev, nil
	}
	if lerr == nil && curRev > rev && ownEarlierWrite(cur, st) {
		// An earlier Save of this very run whose reply was lost (the
		// server went away after writing it): nobody else wrote since,
		// so write on top of it, still compare-and-set.
		next, uerr := s.kv.Update(ctx, key, b, curRev)
		if uerr == nil {
			return next, nil
		}
		cur, curRev, lerr = s.Load(ctx, key)
		if lerr == nil && ownEarlierWrite(cur, st) {
			// Still this run's own write on top: the write over it failed
			// for another reason (a full store, NATS flapping), not
			// because anyone else wrote. Not a fence: the caller ends its
			// run and the next one loads the key again.
			return 0, fmt.Errorf("saving checkpoint %q to bucket %q over this run's own revision %d: %w", key, s.bucket, curRev, denied(s.nc, uerr))
		}
	}
	if lerr == nil && curRev <= rev {
		// The server refused revision rev, yet the key reads back at or
		// before it: the read came from a replica behind the leader (a
		// clustered bucket's direct get, after a server restart). Whose
		// write is newer is not known: not a fence.
		lerr = fmt.Errorf("the key reads back at revision %d, not past it (a replica behind the stream's leader)", curRev)
	}
	if lerr != nil {
		// Not known whose write it is (NATS flapping): not a fence, so the
		// caller ends its run, not the pipeline; the next run's Load tells.
		return 0, fmt.Errorf("saving checkpoint %q to bucket %q: revision %d is taken and it cannot be read back: %w", key, s.bucket, rev, lerr)
	}
	who := "another instance"
	if cur.Run != "" {
		who = "run " + cur.Run
	}
	return 0, fmt.Errorf("saving checkpoint %q to bucket %q: expected revision %d, but %s wrote revision %d: %w",
		key, s.bucket, rev, who, curRev, ErrFenced)
}

// ownEarlierWrite reports whether cur was written by the run writing st
// (a run id is random per process), for the same epoch and source. Its
// position may be above st's (an idle position saved, its reply lost):
// writing st then moves the checkpoint back, which is safe, because the
// lost write was never confirmed to Postgres.
func ownEarlierWrite(cur, st State) bool {
	return st.Run != "" && cur.Run == st.Run && cur.Epoch == st.Epoch && cur.SystemID == st.SystemID
}

// sameWrite reports whether cur is st as written by this very run.
func sameWrite(cur, st State) bool {
	return st.Run != "" && cur.Run == st.Run && cur.Epoch == st.Epoch && cur.LSN == st.LSN &&
		cur.SystemID == st.SystemID && cur.Timeline == st.Timeline && cur.Standby == st.Standby && maps.Equal(cur.Cursors, st.Cursors) &&
		cur.ConfigRev == st.ConfigRev && cur.Paused == st.Paused
}

// NewEpoch returns a fresh producer epoch: 8 lowercase base32 characters
// (40 random bits).
func NewEpoch() string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return strings.ToLower(base32.HexEncoding.EncodeToString(b[:]))
}

// Key returns the checkpoint key of a source, "<bridge>.<source>". Bytes
// outside [A-Za-z0-9_-] (including '.') are escaped as "=XX" (hex), so the
// key is always a valid KV key and distinct names never share a key.
func Key(bridge, source string) string {
	return kvkey.Escape(bridge) + "." + kvkey.Escape(source)
}
