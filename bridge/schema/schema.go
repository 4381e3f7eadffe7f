package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// HeaderVersion is the header naming the version of its table's shape a
// change was written under, decimal.
const HeaderVersion = "Bridge-Schema-Version"

// Dest is the destination suffix of a schema change event's message id:
// "<producer>:<commit LSN>:<ordinal>@~schema" for the change that first has
// the new shape ("<route>~schema" for a named route). Route names cannot
// hold '~', so it never collides with a change's id.
const Dest = "~schema"

// Column is one column of a version.
type Column struct {
	Name string `json:"name"`
	Type string `json:"type"` // as the source names it: "int4", "_text", "public.mood"
	OID  uint32 `json:"oid"`
	Key  bool   `json:"key,omitempty"` // part of the replica identity
}

// Since is the position of the first change under a version.
type Since struct {
	Producer  string `json:"producer"` // "<bridge>.<source>.<epoch>"
	CommitLSN string `json:"commit_lsn"`
	Seq       uint32 `json:"seq"`

	lsn cdc.LSN
}

// Version is one shape of a table, as the registry stores it.
type Version struct {
	Source  string `json:"source"`
	Schema  string `json:"schema"`
	Table   string `json:"table"`
	Version int    `json:"version"`
	// Previous is the version before it, 0 for the first.
	Previous        int      `json:"previous"`
	Columns         []Column `json:"columns"`
	Key             []string `json:"key"`
	ReplicaIdentity string   `json:"replica_identity"` // default, full, index, nothing
	// Fingerprint is a hash of the shape (columns and replica identity).
	Fingerprint string `json:"fingerprint"`
	Since       Since  `json:"since"`
	// JSONSchema is a JSON Schema (2020-12) of the row (after, before) as
	// each format renders it, keyed by format name.
	JSONSchema map[string]json.RawMessage `json:"json_schema"`

	hdr map[string]string // Headers, built once
}

// Headers returns the headers a change under v carries
// (HeaderVersion); shared, never to be written.
func (v *Version) Headers() map[string]string {
	if v.hdr == nil {
		v.hdr = map[string]string{HeaderVersion: strconv.Itoa(v.Version)}
	}
	return v.hdr
}

// Ref returns "schema.table version n" for errors.
func (v *Version) Ref() string { return fmt.Sprintf("%s.%s version %d", v.Schema, v.Table, v.Version) }

func (s *Since) pos() (cdc.LSN, uint32) {
	if s.lsn == 0 && s.CommitLSN != "" {
		s.lsn, _ = cdc.ParseLSN(s.CommitLSN)
	}
	return s.lsn, s.Seq
}

// at reports whether the version begins at c's position in c's producer.
func (v *Version) at(c *cdc.Change) bool {
	l, s := v.Since.pos()
	return v.Since.Producer == c.Producer && l == c.CommitLSN && s == c.Seq
}

// before reports whether the version begins before c: earlier in c's
// producer, or in another producer (an earlier epoch).
func (v *Version) before(c *cdc.Change) bool {
	if v.Since.Producer != c.Producer {
		return true
	}
	l, s := v.Since.pos()
	return l < c.CommitLSN || (l == c.CommitLSN && s < c.Seq)
}

// identity names a replica identity byte.
func identity(b byte) string {
	switch b {
	case 'd':
		return "default"
	case 'f':
		return "full"
	case 'i':
		return "index"
	case 'n':
		return "nothing"
	}
	return "unknown"
}

// FromRelation returns the shape of rel (Version's Columns, Key,
// ReplicaIdentity and Fingerprint; the rest left zero).
func FromRelation(rel *cdc.Relation) Version {
	v := Version{Schema: rel.Schema, Table: rel.Table, ReplicaIdentity: identity(rel.ReplicaIdentity),
		Columns: make([]Column, len(rel.Columns)), Key: []string{}}
	for i, c := range rel.Columns {
		v.Columns[i] = Column{Name: c.Name, Type: c.Type, OID: c.OID, Key: c.Key}
		if c.Key {
			v.Key = append(v.Key, c.Name)
		}
	}
	v.Fingerprint = fingerprint(v.Columns, v.ReplicaIdentity)
	return v
}

func fingerprint(cols []Column, ident string) string {
	h := sha256.New()
	fmt.Fprintf(h, "identity=%s\n", ident)
	for _, c := range cols {
		// OIDs of user types differ between servers: the name decides.
		fmt.Fprintf(h, "%q %q %t\n", c.Name, c.Type, c.Key)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Retype is a column whose type changed.
type Retype struct {
	Name string `json:"name"`
	From string `json:"from"`
	To   string `json:"to"`
}

// Diff is what changed from one version to the next. A renamed column
// shows as dropped and added: Postgres' decoding does not say.
type Diff struct {
	Added   []Column `json:"added"`
	Dropped []Column `json:"dropped"`
	Retyped []Retype `json:"retyped"`
	// KeyChanged: the key columns differ (KeyBefore, KeyAfter).
	KeyChanged bool     `json:"key_changed"`
	KeyBefore  []string `json:"key_before"`
	KeyAfter   []string `json:"key_after"`
	// ReplicaIdentityChanged: REPLICA IDENTITY was altered.
	ReplicaIdentityChanged bool `json:"replica_identity_changed"`
	// Breaking: a column dropped or retyped, or the key changed: a change
	// a consumer may not survive.
	Breaking bool `json:"breaking"`
}

// Compare returns the difference from prev (nil: a table seen for the
// first time, every column added) to next.
func Compare(prev, next *Version) Diff {
	d := Diff{Added: []Column{}, Dropped: []Column{}, Retyped: []Retype{}, KeyAfter: next.Key, KeyBefore: []string{}}
	old := map[string]Column{}
	if prev != nil {
		d.KeyBefore = prev.Key
		for _, c := range prev.Columns {
			old[c.Name] = c
		}
	}
	seen := map[string]bool{}
	for _, c := range next.Columns {
		seen[c.Name] = true
		o, ok := old[c.Name]
		switch {
		case !ok:
			d.Added = append(d.Added, c)
		case o.Type != c.Type:
			d.Retyped = append(d.Retyped, Retype{Name: c.Name, From: o.Type, To: c.Type})
		}
	}
	if prev != nil {
		for _, c := range prev.Columns {
			if !seen[c.Name] {
				d.Dropped = append(d.Dropped, c)
			}
		}
		d.KeyChanged = !slices.Equal(prev.Key, next.Key)
		d.ReplicaIdentityChanged = prev.ReplicaIdentity != next.ReplicaIdentity
	}
	d.Breaking = len(d.Dropped) > 0 || len(d.Retyped) > 0 || d.KeyChanged
	return d
}

// Shape is a version's columns and key, as an event names the previous one.
type Shape struct {
	Version         int      `json:"version"`
	Columns         []Column `json:"columns"`
	Key             []string `json:"key"`
	ReplicaIdentity string   `json:"replica_identity"`
}

// Event is the payload of a schema change event (op "schema"), whatever
// the route's format.
type Event struct {
	Op          string    `json:"op"` // "schema"
	Source      string    `json:"source"`
	Schema      string    `json:"schema"`
	Table       string    `json:"table"`
	Version     int       `json:"version"`
	RegistryKey string    `json:"registry_key"` // the version's key in the registry bucket
	CommitLSN   string    `json:"commit_lsn"`   // of the first change under the version
	Seq         uint32    `json:"seq"`
	Xid         uint32    `json:"xid"`
	CommitTime  time.Time `json:"commit_time"`
	Columns     []Column  `json:"columns"`
	Key         []string  `json:"key"`
	// ReplicaIdentity: default, full, index or nothing.
	ReplicaIdentity string `json:"replica_identity"`
	// Previous is the version before; null for a table's first version.
	Previous *Shape `json:"previous"`
	Diff     Diff   `json:"diff"`
}

// NewEvent returns the event announcing v (prev: the version before, nil
// for the first) before change c.
func NewEvent(v, prev *Version, c *cdc.Change) Event {
	e := Event{Op: string(cdc.OpSchema), Source: v.Source, Schema: v.Schema, Table: v.Table, Version: v.Version,
		RegistryKey: VersionKey(v.Source, v.Schema, v.Table, v.Version),
		CommitLSN:   c.CommitLSN.String(), Seq: c.Seq, Xid: c.Xid, CommitTime: c.CommitTime.UTC(),
		Columns: v.Columns, Key: v.Key, ReplicaIdentity: v.ReplicaIdentity, Diff: Compare(prev, v)}
	if prev != nil {
		e.Previous = &Shape{Version: prev.Version, Columns: prev.Columns, Key: prev.Key, ReplicaIdentity: prev.ReplicaIdentity}
	}
	return e
}

// keyToken escapes s for a KV key token: letters, digits, '_' and '-' stay,
// every other byte becomes "=XX" (its hex), so the key is reversible.
func keyToken(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "=%02X", c)
	}
	if b.Len() == 0 {
		return "="
	}
	return b.String()
}

// unToken reverses keyToken.
func unToken(s string) (string, error) {
	if s == "=" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("key token %q: truncated escape", s)
		}
		x, err := hex.DecodeString(s[i+1 : i+3])
		if err != nil {
			return "", fmt.Errorf("key token %q: %w", s, err)
		}
		b.Write(x)
		i += 2
	}
	return b.String(), nil
}

// TablePrefix returns "<source>.<schema>.<table>", each part escaped.
func TablePrefix(source, schema, table string) string {
	return keyToken(source) + "." + keyToken(schema) + "." + keyToken(table)
}

// VersionKey returns the registry key of a version.
func VersionKey(source, schema, table string, version int) string {
	return fmt.Sprintf("%s.%d", TablePrefix(source, schema, table), version)
}

// LatestKey returns the key of a table's latest pointer.
func LatestKey(source, schema, table string) string {
	return TablePrefix(source, schema, table) + ".latest"
}

// ParseKey splits a registry key into its parts; last is the version
// number or "latest".
func ParseKey(key string) (source, schema, table, last string, err error) {
	parts := strings.Split(key, ".")
	if len(parts) != 4 {
		return "", "", "", "", fmt.Errorf("registry key %q: want <source>.<schema>.<table>.<version>", key)
	}
	var dec [3]string
	for i := range dec {
		if dec[i], err = unToken(parts[i]); err != nil {
			return "", "", "", "", err
		}
	}
	return dec[0], dec[1], dec[2], parts[3], nil
}
