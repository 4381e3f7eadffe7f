package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrConflict marks a registry that disagrees with the WAL: a version
// written with another shape or at another position than the one the
// bridge finds. A retry cannot fix it.
var ErrConflict = errors.New("schema registry conflict")

// Registry is the schema registry in a JetStream KV bucket.
type Registry struct {
	kv     jetstream.KeyValue
	bucket string
}

// Open opens the registry bucket, creating it (with replicas) when missing.
func Open(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*Registry, error) {
	if replicas <= 0 {
		replicas = 1
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: bucket, Description: "Postgres → NATS bridge schema registry",
			Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("opening schema registry bucket %q: %w", bucket, err)
	}
	return &Registry{kv: kv, bucket: bucket}, nil
}

// OpenExisting opens the registry bucket without creating it (for the CLI).
func OpenExisting(ctx context.Context, js jetstream.JetStream, bucket string) (*Registry, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("opening schema registry bucket %q: %w", bucket, err)
	}
	return &Registry{kv: kv, bucket: bucket}, nil
}

// Bucket returns the bucket's name.
func (r *Registry) Bucket() string { return r.bucket }

// Latest returns the number of a table's latest version and the pointer's
// revision; 0 when the table has none.
func (r *Registry) Latest(ctx context.Context, source, schema, table string) (int, uint64, error) {
	key := LatestKey(source, schema, table)
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("reading %q from schema registry %q: %w", key, r.bucket, err)
	}
	n, err := strconv.Atoi(string(e.Value()))
	if err != nil {
		return 0, 0, fmt.Errorf("schema registry %q key %q holds %q, not a version number", r.bucket, key, e.Value())
	}
	return n, e.Revision(), nil
}

// Get returns one version; nil when it is missing.
func (r *Registry) Get(ctx context.Context, source, schema, table string, n int) (*Version, error) {
	key := VersionKey(source, schema, table, n)
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %q from schema registry %q: %w", key, r.bucket, err)
	}
	var v Version
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return nil, fmt.Errorf("schema registry %q key %q: %w", r.bucket, key, err)
	}
	return &v, nil
}

// Put stores v under its key, then moves the table's latest pointer to it
// unless it points to a later version. A key that exists already must hold
// the same version (the same shape, first seen at the same position): a
// replay writes it again; anything else is an error naming the table.
func (r *Registry) Put(ctx context.Context, v *Version) error {
	if v.JSONSchema == nil {
		fill(v)
	}
	key := VersionKey(v.Source, v.Schema, v.Table, v.Version)
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", v.Ref(), err)
	}
	if _, err := r.kv.Create(ctx, key, b); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("writing %s to schema registry %q key %q: %w", v.Ref(), r.bucket, key, err)
		}
		old, gerr := r.Get(ctx, v.Source, v.Schema, v.Table, v.Version)
		if gerr != nil {
			return gerr
		}
		samePos := old != nil && old.Since.Producer == v.Since.Producer && old.Since.CommitLSN == v.Since.CommitLSN && old.Since.Seq == v.Since.Seq
		if samePos && old.Fingerprint != v.Fingerprint {
			return fmt.Errorf("%w: schema registry %q key %q already holds %s, first seen at the same change (%s:%d of %s) with another shape (fingerprint %s, not %s); is another bridge writing source %q?",
				ErrConflict, r.bucket, key, v.Ref(), v.Since.CommitLSN, v.Since.Seq, v.Since.Producer, old.Fingerprint, v.Fingerprint, v.Source)
		}
		if !samePos {
			return fmt.Errorf("%w: schema registry %q key %q already holds another %s (first seen at %s:%d of %s, not at %s:%d of %s); is another bridge writing source %q?",
				ErrConflict, r.bucket, key, v.Ref(), since(old).CommitLSN, since(old).Seq, since(old).Producer, v.Since.CommitLSN, v.Since.Seq, v.Since.Producer, v.Source)
		}
	}
	return r.moveLatest(ctx, v.Source, v.Schema, v.Table, v.Version)
}

// moveLatest points the table's latest key at version n unless it points
// to n or a later version already (compare-and-set, retried on a race).
func (r *Registry) moveLatest(ctx context.Context, source, schema, table string, n int) error {
	lkey := LatestKey(source, schema, table)
	for {
		cur, rev, err := r.Latest(ctx, source, schema, table)
		if err != nil {
			return err
		}
		if cur >= n {
			return nil
		}
		val := []byte(strconv.Itoa(n))
		if rev == 0 {
			_, err = r.kv.Create(ctx, lkey, val)
		} else {
			_, err = r.kv.Update(ctx, lkey, val, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSeq(err) {
			return fmt.Errorf("writing %q to schema registry %q: %w", lkey, r.bucket, err)
		}
	}
}

func since(v *Version) Since {
	if v == nil {
		return Since{}
	}
	return v.Since
}

// isWrongSeq reports a compare-and-set refusal.
func isWrongSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// TableRef is a table the registry holds.
type TableRef struct {
	Source, Schema, Table string
	Latest                int
}

// Tables lists the tables the registry holds (their latest pointers).
func (r *Registry) Tables(ctx context.Context) ([]TableRef, error) {
	lister, err := r.kv.ListKeysFiltered(ctx, "*.*.*.latest")
	if err != nil {
		return nil, fmt.Errorf("listing schema registry %q: %w", r.bucket, err)
	}
	var out []TableRef
	for k := range lister.Keys() {
		src, sch, tbl, _, err := ParseKey(k)
		if err != nil {
			return nil, err
		}
		n, _, err := r.Latest(ctx, src, sch, tbl)
		if err != nil {
			return nil, err
		}
		out = append(out, TableRef{Source: src, Schema: sch, Table: tbl, Latest: n})
	}
	return out, nil
}

// HoldKey returns the key recording that a version was held by a route's
// on_schema_change: pause: "<source>.<schema>.<table>.<n>.hold".
func HoldKey(source, schema, table string, version int) string {
	return VersionKey(source, schema, table, version) + ".hold"
}

// Hold records that v was held, once: it returns when it was first held
// (now, when this call records it).
func (r *Registry) Hold(ctx context.Context, v *Version, now time.Time) (time.Time, error) {
	key := HoldKey(v.Source, v.Schema, v.Table, v.Version)
	b, _ := now.UTC().MarshalText()
	if _, err := r.kv.Create(ctx, key, b); err == nil {
		return now.UTC(), nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return time.Time{}, fmt.Errorf("writing %q to schema registry %q: %w", key, r.bucket, err)
	}
	e, err := r.kv.Get(ctx, key)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading %q from schema registry %q: %w", key, r.bucket, err)
	}
	var at time.Time
	if err := at.UnmarshalText(e.Value()); err != nil {
		return time.Time{}, fmt.Errorf("schema registry %q key %q: %w", r.bucket, key, err)
	}
	return at, nil
}

// AcceptKey returns the key recording from where a held version is
// accepted (on_schema_change: dead_letter): "<source>.<schema>.<table>.<n>.accept".
func AcceptKey(source, schema, table string, version int) string {
	return VersionKey(source, schema, table, version) + ".accept"
}

// Acceptance is the value under AcceptKey: the table's changes from Since
// on (that change included) go to the routes' subjects again.
type Acceptance struct {
	Since
	AcceptedAt time.Time `json:"accepted_at"`
	By         string    `json:"by,omitempty"`
}

// HoldState returns when v was first held (zero: never) and from where it
// is accepted (nil: not yet).
func (r *Registry) HoldState(ctx context.Context, v *Version) (heldAt time.Time, accept *Acceptance, err error) {
	key := HoldKey(v.Source, v.Schema, v.Table, v.Version)
	e, err := r.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return time.Time{}, nil, nil
	case err != nil:
		return time.Time{}, nil, fmt.Errorf("reading %q from schema registry %q: %w", key, r.bucket, err)
	}
	if err := heldAt.UnmarshalText(e.Value()); err != nil {
		return time.Time{}, nil, fmt.Errorf("schema registry %q key %q: %w", r.bucket, key, err)
	}
	akey := AcceptKey(v.Source, v.Schema, v.Table, v.Version)
	e, err = r.kv.Get(ctx, akey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return heldAt, nil, nil
	case err != nil:
		return time.Time{}, nil, fmt.Errorf("reading %q from schema registry %q: %w", akey, r.bucket, err)
	}
	var a Acceptance
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		return time.Time{}, nil, fmt.Errorf("schema registry %q key %q: %w", r.bucket, akey, err)
	}
	return heldAt, &a, nil
}

// Accept records, once, that v is accepted from a (the first change to go
// to the routes' subjects again); it returns the acceptance recorded
// first (a's, when this call records it).
func (r *Registry) Accept(ctx context.Context, v *Version, a Acceptance) (Acceptance, error) {
	key := AcceptKey(v.Source, v.Schema, v.Table, v.Version)
	a.AcceptedAt = a.AcceptedAt.UTC()
	b, err := json.Marshal(a)
	if err != nil {
		return Acceptance{}, err
	}
	if _, err := r.kv.Create(ctx, key, b); err == nil {
		return a, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return Acceptance{}, fmt.Errorf("writing %q to schema registry %q: %w", key, r.bucket, err)
	}
	e, err := r.kv.Get(ctx, key)
	if err != nil {
		return Acceptance{}, fmt.Errorf("reading %q from schema registry %q: %w", key, r.bucket, err)
	}
	var old Acceptance
	if err := json.Unmarshal(e.Value(), &old); err != nil {
		return Acceptance{}, fmt.Errorf("schema registry %q key %q: %w", r.bucket, key, err)
	}
	return old, nil
}

// HeldVersion is a table's latest version, held and not accepted.
type HeldVersion struct {
	Version *Version
	HeldAt  time.Time
}

// Held returns source's tables whose latest version was held and is not
// accepted (HoldKey without AcceptKey).
func (r *Registry) Held(ctx context.Context, source string) ([]HeldVersion, error) {
	lister, err := r.kv.ListKeysFiltered(ctx, keyToken(source)+".*.*.*.hold")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing schema registry %q: %w", r.bucket, err)
	}
	var out []HeldVersion
	for k := range lister.Keys() {
		src, sch, tbl, last, err := ParseKey(strings.TrimSuffix(k, ".hold"))
		if err != nil {
			continue
		}
		n, _, err := r.Latest(ctx, src, sch, tbl)
		if err != nil {
			return nil, err
		}
		if strconv.Itoa(n) != last {
			continue // a later version is in effect
		}
		v, err := r.Get(ctx, src, sch, tbl, n)
		if err != nil || v == nil {
			return nil, err
		}
		at, acc, err := r.HoldState(ctx, v)
		if err != nil {
			return nil, err
		}
		if acc == nil && !at.IsZero() {
			out = append(out, HeldVersion{Version: v, HeldAt: at})
		}
	}
	return out, nil
}
