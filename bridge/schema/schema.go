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
	// Declared is the type with its modifier as Postgres prints it
	// (format_type): "character varying(20)", "numeric(10,2)"; absent when
	// the type has none.
	Declared string `json:"declared,omitempty"`
	// NotNull: the column is NOT NULL.
	NotNull bool `json:"not_null,omitempty"`
	Key     bool `json:"key,omitempty"` // part of the replica identity
}

// TypeName returns the column's type as declared (Declared), else its
// type's name.
func (c Column) TypeName() string {
	if c.Declared != "" {
		return c.Declared
	}
	return c.Type
}

// Since is the position of the first change under a version.
type Since struct {
	Producer  string `json:"producer"` // "<bridge>.<source>.<epoch>"
	CommitLSN string `json:"commit_lsn"`
	Seq       uint32 `json:"seq"`
	// Snapshot is the id of the snapshot whose read first had the shape
	// (the read at CommitLSN, Seq); "" for a change from the WAL. A chunk
	// read again after a crash is put into the stream at another
	// position: the snapshot and the table find the version again.
	Snapshot string `json:"snapshot,omitempty"`

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
	// Inferred lists what of the shape the source read from the catalog
	// when it decoded the change rather than from the WAL, which may be
	// newer than the change: "not_null" (pgoutput), "key" (pgoutput with
	// REPLICA IDENTITY FULL, wal2json with an identity index),
	// "replica_identity" (wal2json) (docs/schemas.md#what-the-wal-says).
	Inferred []string `json:"inferred,omitempty"`
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

// Covers reports whether c is at or after s: in s's producer at or after
// its position, or in another producer (s is of an earlier epoch).
func (s *Since) Covers(c *cdc.Change) bool {
	if s.Producer != c.Producer {
		return true
	}
	l, q := s.pos()
	return c.CommitLSN > l || c.CommitLSN == l && c.Seq >= q
}

// At reports whether s is c's position.
func (s *Since) At(c *cdc.Change) bool {
	l, q := s.pos()
	return s.Producer == c.Producer && l == c.CommitLSN && q == c.Seq
}

// NotAfter reports whether s is at or before o: in the same producer, at
// or before its position; in another one, an earlier epoch (the one of a
// version registered before).
func (s *Since) NotAfter(o *Since) bool {
	if s.Producer != o.Producer {
		return true
	}
	l, q := s.pos()
	m, r := o.pos()
	return l < m || l == m && q <= r
}

// SinceOf returns c's position.
func SinceOf(c *cdc.Change) Since {
	return Since{Producer: c.Producer, CommitLSN: c.CommitLSN.String(), Seq: c.Seq, lsn: c.CommitLSN}
}

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

// after reports whether the version begins after c in c's producer.
func (v *Version) after(c *cdc.Change) bool { return !v.before(c) && !v.at(c) }

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

// The names of cdc.Inferred parts in Version.Inferred.
var inferredNames = []struct {
	bit  cdc.Inferred
	name string
}{
	{cdc.InferredNotNull, "not_null"},
	{cdc.InferredKey, "key"},
	{cdc.InferredIdentity, "replica_identity"},
}

func inferredList(in cdc.Inferred) []string {
	var out []string
	for _, n := range inferredNames {
		if in&n.bit != 0 {
			out = append(out, n.name)
		}
	}
	return out
}

// inferredMask returns v.Inferred as bits.
func (v *Version) inferredMask() cdc.Inferred {
	var m cdc.Inferred
	for _, s := range v.Inferred {
		for _, n := range inferredNames {
			if s == n.name {
				m |= n.bit
			}
		}
	}
	return m
}

// nullInferred reports whether NOT NULL of v's columns came from the
// catalog (which may be newer than the rows).
func (v *Version) nullInferred() bool {
	return v.inferredMask()&cdc.InferredNotNull != 0
}

// FromRelation returns the shape of rel (Version's Columns, Key,
// ReplicaIdentity, Inferred and Fingerprint; the rest left zero).
func FromRelation(rel *cdc.Relation) Version {
	v := Version{Schema: rel.Schema, Table: rel.Table, ReplicaIdentity: identity(rel.ReplicaIdentity),
		Columns: make([]Column, len(rel.Columns)), Key: []string{}, Inferred: inferredList(rel.Inferred &^ cdc.InferredColumns)}
	for i, c := range rel.Columns {
		v.Columns[i] = Column{Name: c.Name, Type: c.Type, OID: c.OID, Declared: c.Declared, NotNull: c.NotNull, Key: c.Key}
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
		fmt.Fprintf(h, "%q %q %q %t %t\n", c.Name, c.Type, c.Declared, c.NotNull, c.Key)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// differs reports whether a and b differ in a part of the shape that m
// (what either side inferred from the catalog) leaves to the WAL: the
// columns (names, order, types, modifiers) unless m has InferredColumns,
// NOT NULL, the key and the replica identity unless m has their bit.
func differs(a, b *Version, m cdc.Inferred) bool { return difference(a, b, m) != "" }

// difference names the first part in which a and b differ (differs), ""
// when they do not.
func difference(a, b *Version, m cdc.Inferred) string {
	if m&cdc.InferredColumns != 0 {
		return ""
	}
	if len(a.Columns) != len(b.Columns) {
		return fmt.Sprintf("%d columns, not %d", len(b.Columns), len(a.Columns))
	}
	for i := range a.Columns {
		x, y := a.Columns[i], b.Columns[i]
		switch {
		case x.Name != y.Name:
			return fmt.Sprintf("column %d is %s, not %s", i+1, y.Name, x.Name)
		case x.Type != y.Type || x.Declared != y.Declared:
			return fmt.Sprintf("column %s is %s, not %s", x.Name, y.TypeName(), x.TypeName())
		case m&cdc.InferredNotNull == 0 && x.NotNull != y.NotNull:
			return fmt.Sprintf("column %s has not_null %t, not %t", x.Name, y.NotNull, x.NotNull)
		case m&cdc.InferredKey == 0 && x.Key != y.Key:
			return fmt.Sprintf("column %s has key %t, not %t", x.Name, y.Key, x.Key)
		}
	}
	if m&cdc.InferredIdentity == 0 && a.ReplicaIdentity != b.ReplicaIdentity {
		return fmt.Sprintf("replica identity %s, not %s", b.ReplicaIdentity, a.ReplicaIdentity)
	}
	return ""
}

// Retype is a column whose type changed.
type Retype struct {
	Name string `json:"name"`
	From string `json:"from"`
	To   string `json:"to"`
}

// Changed is a column that kept its type but whose modifier or
// nullability changed.
type Changed struct {
	Name string `json:"name"`
	// What changed: "modifier" (From and To are the declared types, "" for
	// none: varchar → character varying(20)) or "not_null" (From and To are
	// "null" or "not null").
	What string `json:"what"`
	From string `json:"from"`
	To   string `json:"to"`
	// Breaking: values a consumer of the previous version may not accept
	// can come now: NOT NULL dropped, or a modifier that widens (a longer
	// varchar, more digits or a larger scale of a numeric, a finer
	// precision, a modifier removed or changed in another way).
	Breaking bool `json:"breaking"`
}

// Diff is what changed from one version to the next. A renamed column
// shows as dropped and added: Postgres' decoding does not say.
type Diff struct {
	Added   []Column `json:"added"`
	Dropped []Column `json:"dropped"`
	Retyped []Retype `json:"retyped"`
	// Changed: columns whose modifier or NOT NULL changed, one entry for
	// each.
	Changed []Changed `json:"changed"`
	// KeyChanged: the key columns differ (KeyBefore, KeyAfter).
	KeyChanged bool     `json:"key_changed"`
	KeyBefore  []string `json:"key_before"`
	KeyAfter   []string `json:"key_after"`
	// ReplicaIdentityChanged: REPLICA IDENTITY was altered.
	ReplicaIdentityChanged bool `json:"replica_identity_changed"`
	// Breaking: a column dropped or retyped, the key changed, or a change
	// of a column that is (Changed.Breaking): a change a consumer may not
	// survive.
	Breaking bool `json:"breaking"`
}

// Compare returns the difference from prev (nil: a table seen for the
// first time, every column added) to next.
func Compare(prev, next *Version) Diff {
	d := Diff{Added: []Column{}, Dropped: []Column{}, Retyped: []Retype{}, Changed: []Changed{}, KeyAfter: next.Key, KeyBefore: []string{}}
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
		default:
			if o.Declared != c.Declared {
				d.Changed = append(d.Changed, Changed{Name: c.Name, What: "modifier", From: o.Declared, To: c.Declared,
					Breaking: widens(o.Declared, c.Declared)})
			}
			if o.NotNull != c.NotNull {
				d.Changed = append(d.Changed, Changed{Name: c.Name, What: "not_null", From: nullness(o.NotNull), To: nullness(c.NotNull),
					Breaking: o.NotNull})
			}
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
	for _, c := range d.Changed {
		d.Breaking = d.Breaking || c.Breaking
	}
	return d
}

func nullness(notNull bool) string {
	if notNull {
		return "not null"
	}
	return "null"
}

// modArgs splits a declared type into its text with the numbers of its
// modifiers taken out and those numbers: "numeric(10,2)" is "numeric(#,#)"
// and [10 2], "timestamp(3) with time zone" "timestamp(#) with time zone"
// and [3].
func modArgs(decl string) (string, []int) {
	var b strings.Builder
	var nums []int
	depth := 0
	for i := 0; i < len(decl); i++ {
		c := decl[i]
		switch {
		case c == '(':
			depth++
		case c == ')':
			depth--
		case depth > 0 && (c >= '0' && c <= '9' || c == '-'):
			j := i + 1
			for j < len(decl) && decl[j] >= '0' && decl[j] <= '9' {
				j++
			}
			if n, err := strconv.Atoi(decl[i:j]); err == nil {
				nums = append(nums, n)
				b.WriteByte('#')
				i = j - 1
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String(), nums
}

// widens reports whether a column declared to (a type's modifier) may
// hold values one declared from may not: no modifier where there was one,
// a larger number in the same modifier (length, precision, scale), or a
// modifier of another form.
func widens(from, to string) bool {
	switch {
	case from == to:
		return false
	case to == "":
		return true // the bound is gone
	case from == "":
		return false // bounded now
	}
	ft, fn := modArgs(from)
	tt, tn := modArgs(to)
	if ft != tt || len(fn) != len(tn) {
		return true
	}
	for i := range fn {
		if tn[i] > fn[i] {
			return true
		}
	}
	return false
}

// MaxLength returns the length n of a column declared character
// varying(n) or character(n) (arrays of them too); 0 otherwise.
func (c Column) MaxLength() int {
	switch strings.TrimPrefix(c.Type, "_") {
	case "varchar", "bpchar":
	default:
		return 0
	}
	if _, n := modArgs(c.Declared); len(n) == 1 && n[0] > 0 {
		return n[0]
	}
	return 0
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
	// Announce is "accepted" when the event announces again, on a route's
	// subject, a version whose changes the route held on its dead-letter
	// subject until the operator accepted it (on_schema_change:
	// dead_letter): commit_lsn and seq are then those of the first change
	// the route publishes on its subject again. Absent otherwise.
	Announce string `json:"announce,omitempty"`
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
