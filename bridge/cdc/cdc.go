// Package cdc holds the leaf types every part of the bridge shares: the change
// model, log sequence numbers and operations. It imports nothing of ours.
package cdc

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// LSN is a PostgreSQL write-ahead log position.
type LSN uint64

// String returns the Postgres form, for example "16/B374D848".
func (l LSN) String() string {
	var b [17]byte
	return string(l.Append(b[:0]))
}

// Append appends the Postgres form of l to dst.
func (l LSN) Append(dst []byte) []byte {
	dst = appendHexUpper(dst, uint64(l)>>32)
	dst = append(dst, '/')
	return appendHexUpper(dst, uint64(uint32(l)))
}

// appendHexUpper appends v in upper-case hex without leading zeros.
func appendHexUpper(dst []byte, v uint64) []byte {
	const digits = "0123456789ABCDEF"
	var b [16]byte
	i := len(b)
	for {
		i--
		b[i] = digits[v&0xF]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}

// Hex returns the 16-digit upper-case hex form used in message identities.
func (l LSN) Hex() string {
	const digits = "0123456789ABCDEF"
	var b [16]byte
	v := uint64(l)
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&0xF]
		v >>= 4
	}
	return string(b[:])
}

// ParseLSN parses the Postgres form "X/Y" or the 16-digit hex form.
func ParseLSN(s string) (LSN, error) {
	if hi, lo, ok := strings.Cut(s, "/"); ok {
		h, err := strconv.ParseUint(hi, 16, 32)
		if err != nil {
			return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
		}
		l, err := strconv.ParseUint(lo, 16, 32)
		if err != nil {
			return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
		}
		return LSN(h<<32 | l), nil
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing LSN %q: %w", s, err)
	}
	return LSN(v), nil
}

// Op is the kind of a change.
type Op string

// The operations a change can carry.
const (
	OpInsert   Op = "insert"
	OpUpdate   Op = "update"
	OpDelete   Op = "delete"
	OpTruncate Op = "truncate"
	OpMessage  Op = "message"
	OpRead     Op = "read" // a row read by a snapshot
	// OpControl marks a control message from the bridge itself, not from
	// the database: Schema is ControlSchema, Table the kind (ControlResync),
	// Content the JSON of a Control. Sinks publish it with the headers of
	// any change (Bridge-Op "control", Bridge-Table "_control.<kind>") and
	// its payload is the Control JSON whatever the route's format.
	OpControl Op = "control"
	// OpSchema marks a schema change event: the table's shape changed (or
	// the table is seen for the first time) at the change after it, which
	// it precedes at the same position. Content is its JSON, whatever the
	// route's format (bridge/schema).
	OpSchema Op = "schema"
	// OpDDL marks a DDL event: a DDL command's text, as the event trigger
	// of `bridge setup ddl` wrote it into the WAL (a logical message with
	// the bridge's DDL prefix), published at its own position in its
	// transaction. Content is its JSON, whatever the route's format but
	// debezium (bridge/schema).
	OpDDL Op = "ddl"
)

// DDLPrefix is the logical message prefix (pg_logical_emit_message) of
// the DDL commands the event trigger of `bridge setup ddl` writes into the
// WAL. Sources always decode it (so a transaction's ordinals never depend
// on the configuration); the pipeline turns each such message into a DDL
// event (OpDDL) or drops it, and never publishes it as a message.
const DDLPrefix = "bridge.ddl"

// Control messages.
const (
	// ControlSchema is the Schema of every OpControl change.
	ControlSchema = "_control"
	// ControlResync tells consumers that continuity is broken (the slot was
	// recreated, an operator asked for it): changes before it may be
	// missing from the stream, so state built from it must be re-read.
	// Changes after it carry the new producer (epoch).
	ControlResync = "resync"
)

// Control is the body of a control message (Content of an OpControl change).
type Control struct {
	Kind        string    `json:"kind"`                   // ControlResync
	Reason      string    `json:"reason"`                 // e.g. "slot_recreated", "operator"
	Source      string    `json:"source"`                 // the configured source name
	OldProducer string    `json:"old_producer,omitempty"` // producer (epoch) before the break
	Producer    string    `json:"producer"`               // producer the stream continues with
	LSN         string    `json:"lsn,omitempty"`          // where the new epoch starts, Postgres form
	Time        time.Time `json:"time"`
}

// Change returns the control message ctl as a change of producer: a
// one-change transaction at position (0, 0) whose Content and Payload are
// ctl as JSON, whatever the route's format.
func (ctl Control) Change(producer, source, database string) (Change, error) {
	body, err := json.Marshal(ctl)
	if err != nil {
		return Change{}, fmt.Errorf("encoding %s control message: %w", ctl.Kind, err)
	}
	return Change{
		Producer: producer, Source: source, Database: database,
		Op: OpControl, Schema: ControlSchema, Table: ctl.Kind,
		TxSize: 1, CommitTime: ctl.Time, Content: body, Payload: body,
	}, nil
}

// Column describes one column of a relation.
type Column struct {
	Name string
	Type string // type name as Postgres spells it, e.g. "int4", "_text", "public.mood"
	OID  uint32
	// Declared is the column's type with its modifier, as Postgres prints
	// it (format_type): "character varying(20)", "numeric(10,2)",
	// "timestamp(3) with time zone"; "" when the type has none (or the
	// source cannot tell).
	Declared string
	// NotNull: the column is NOT NULL (Relation.Inferred says whether the
	// source read that from the catalog rather than from the WAL).
	NotNull bool
	Key     bool // part of the replica identity
}

// Inferred marks parts of a Relation the source did not take from the WAL
// but read from the catalog when it decoded the change: the catalog may
// already be newer than the change (a later ALTER TABLE).
type Inferred uint8

// The parts of a relation a source can infer.
const (
	// InferredNotNull: Column.NotNull (pgoutput's Relation message does not
	// carry it).
	InferredNotNull Inferred = 1 << iota
	// InferredKey: Column.Key (pgoutput with REPLICA IDENTITY FULL reads the
	// primary key; wal2json reads a replica identity index).
	InferredKey
	// InferredIdentity: Relation.ReplicaIdentity (wal2json does not say).
	InferredIdentity
	// InferredColumns: the columns themselves, their types and all the
	// above: the change did not carry the whole row (a wal2json delete
	// decoded with the catalog's description).
	InferredColumns
)

// Relation describes a table as the source last saw it. Changes share the
// pointer; a relation is never modified once a change refers to it.
type Relation struct {
	ID      uint32
	Schema  string
	Table   string
	Columns []Column
	// ReplicaIdentity is 'd' (default: primary key), 'f' (full), 'i' (index) or 'n' (nothing).
	ReplicaIdentity byte
	// Inferred: what of the description the source read from the catalog
	// rather than from the WAL; 0 when all of it is the change's own.
	Inferred Inferred
}

// Change is one committed row change, truncate or logical message. Sources emit
// only committed transactions; (CommitLSN, Seq) orders and identifies a
// change within a producer.
type Change struct {
	// Producer is "<bridge name>.<source name>.<epoch>" (DESIGN.md §3), set by the pipeline.
	Producer string
	// Source is the configured source name.
	Source string
	// Database is the Postgres database the change comes from.
	Database string
	// CommitLSN identifies the transaction in the producer's order: the END
	// of its commit record, or, for a transaction of more than 1000 changes
	// (handed over before its commit arrives), the START of its commit
	// record + 1. Both order transactions by commit and never collide
	// (sources/internal/pgrepl/live.go).
	CommitLSN LSN
	// LSN is the change's own WAL position; diagnostic only, not an identity.
	LSN LSN
	// Seq is the 0-based position of the change inside its transaction.
	Seq uint32
	// TxSize is the number of changes in the transaction; 0 when not known
	// yet: a transaction of more than 1000 changes is handed over while it
	// arrives, and only its last change carries the size.
	TxSize uint32
	// Xid is the Postgres transaction id.
	Xid        uint32
	CommitTime time.Time

	Schema, Table string
	Op            Op
	// Rel describes the columns of Before and After, in table column order.
	Rel *Relation
	// Before is the old row (update, delete) when the replica identity
	// provides it; with the default identity only key columns are set and the
	// others are Absent. Nil when no old row was sent.
	Before []any
	// After is the new row (insert, update, read). Unchanged TOAST columns
	// hold Unchanged, never nil.
	After []any

	// Truncate options.
	Cascade, RestartIdentity bool

	// Logical decoding message (op message).
	Prefix        string
	Content       []byte
	Transactional bool

	// Subject and Payload are set by the router: the destination subject and
	// the change encoded in the route's format. Sinks publish them verbatim.
	Subject string
	Payload []byte
	// Headers are extra headers (trace context etc.); sinks copy them verbatim.
	Headers map[string]string
	// MsgID, when set, is the change's identity instead of the positional
	// one: snapshot reads (op read) carry an id made from the snapshot and
	// the row's key, so a chunk read again yields the same ids and is
	// deduplicated. It has ID's form, so ParseID reads it.
	MsgID string
	// DeadLetter, when set, says why the change's table is held by a
	// breaking schema change no operator accepted yet (schemas,
	// on_schema_change: dead_letter): a route with that policy publishes
	// it to its dead-letter subject, with this as the
	// Bridge-Dead-Letter-Reason header. Set by the pipeline before routing.
	DeadLetter string
	// Dest names the destination when the change is published by a named
	// route (config routes[].name): ID ends with "@<Dest>", so the messages
	// one change yields for several routes, in one stream too, are told
	// apart by JetStream's dedupe and by a sink's resume scan. "" for an
	// unnamed route: the id has no suffix.
	Dest string
}

// ID returns the dedupe key "<producer>:<commit lsn, 16 hex>:<seq>", used
// as Nats-Msg-Id, followed by "@<Dest>" when Dest is set. A replay of the
// same WAL within an epoch yields the same ID.
func (c *Change) ID() string {
	id := c.MsgID
	if id == "" {
		id = c.Producer + ":" + c.CommitLSN.Hex() + ":" + strconv.FormatUint(uint64(c.Seq), 10)
	}
	if c.Dest != "" {
		id += DestSep + c.Dest
	}
	return id
}

// DestSep separates a message id from the destination it names
// (Change.Dest). Route names cannot hold it.
const DestSep = "@"

// TombstoneDest ends the destination (Change.Dest) of a Debezium tombstone:
// the copy of a delete, with an empty payload, that a route with
// debezium.tombstones_on_delete publishes after it; "<route>~tombstone"
// ("~tombstone" for an unnamed route). Route names cannot hold "~".
const TombstoneDest = "~tombstone"

// Tombstone reports whether c is a Debezium tombstone (TombstoneDest).
func (c *Change) Tombstone() bool { return strings.HasSuffix(c.Dest, TombstoneDest) }

// Pos returns the change's position in the producer's order, with its
// destination.
func (c *Change) Pos() Pos { return Pos{LSN: c.CommitLSN, Seq: c.Seq, Dest: c.Dest} }

// Last reports whether the change is the last of its transaction.
// Not known (false) on a change handed over before its transaction's end.
func (c *Change) Last() bool { return c.TxSize > 0 && c.Seq+1 >= c.TxSize }

// Pos is a position in a producer's order: a commit LSN and an ordinal.
type Pos struct {
	LSN LSN
	Seq uint32
	// Dest is the destination of a change published to several (see
	// Change.Dest); "" for one. Positions of one change for two
	// destinations are distinct map keys, and neither is Less than the other.
	Dest string
}

// Less orders positions by commit LSN and ordinal; Dest does not count.
func (p Pos) Less(q Pos) bool { return p.LSN < q.LSN || (p.LSN == q.LSN && p.Seq < q.Seq) }

// ParseID splits a message id made by Change.ID into producer and position
// (its destination included).
func ParseID(id string) (producer string, pos Pos, err error) {
	var dest string
	if k := strings.LastIndex(id, DestSep); k >= 0 && k > strings.LastIndexByte(id, ':') {
		id, dest = id[:k], id[k+len(DestSep):]
		if dest == "" {
			return "", Pos{}, fmt.Errorf("parsing message id %q: empty destination after %q", id+DestSep, DestSep)
		}
	}
	i := strings.LastIndexByte(id, ':')
	if i < 0 {
		return "", Pos{}, fmt.Errorf("parsing message id %q: no sequence", id)
	}
	j := strings.LastIndexByte(id[:i], ':')
	if j < 0 {
		return "", Pos{}, fmt.Errorf("parsing message id %q: no commit LSN", id)
	}
	l, err := strconv.ParseUint(id[j+1:i], 16, 64)
	if err != nil {
		return "", Pos{}, fmt.Errorf("parsing message id %q: %w", id, err)
	}
	s, err := strconv.ParseUint(id[i+1:], 10, 32)
	if err != nil {
		return "", Pos{}, fmt.Errorf("parsing message id %q: %w", id, err)
	}
	return id[:j], Pos{LSN: LSN(l), Seq: uint32(s), Dest: dest}, nil
}

// Value types. Column values in Before and After are one of: nil (SQL NULL),
// bool, int64, float64, Numeric, string, []byte (bytea), RawJSON (json, jsonb),
// time.Time (timestamptz, in UTC), Timestamp (timestamp without time zone),
// Date, Infinity (±infinity of a date or timestamp), []any (arrays, nested for
// more dimensions), Record (composite types), Geometry (PostGIS geometry and
// geography), Unchanged and Absent. Types without a better Go form (interval,
// inet, money, enums, ranges, multiranges, built-in geometric types, types of
// extensions the bridge does not know, such as pgvector's vector) keep
// Postgres' text.

// Numeric is an exact decimal in Postgres' text form, or "NaN", "Infinity",
// "-Infinity".
type Numeric string

// RawJSON is a json or jsonb value, embedded as is.
type RawJSON []byte

// Timestamp is a timestamp without time zone; the wall clock in UTC fields.
type Timestamp struct{ time.Time }

// Date is a calendar date; the day at 00:00 UTC.
type Date struct{ time.Time }

// Infinity is +infinity (1) or -infinity (-1) of a date or timestamp.
type Infinity int8

// String returns "infinity" or "-infinity", as Postgres prints them.
func (i Infinity) String() string {
	if i < 0 {
		return "-infinity"
	}
	return "infinity"
}

// UnchangedToast marks a TOASTed column whose value did not change and was
// not sent by Postgres. It is never turned into null.
type UnchangedToast struct{}

// Unchanged is the value of an unchanged TOAST column.
var Unchanged = UnchangedToast{}

// Record is a value of a composite type: its fields, in the type's order,
// decoded like columns (a field may itself be a Record or an array).
type Record struct {
	// Names are the fields' names; shared between values of one type, so
	// they must not be modified.
	Names []string
	// Values are the fields' values, one per name.
	Values []any
	// Text is the value as Postgres prints it, e.g. (1,"a b").
	Text string
}

// String returns the value as Postgres prints it.
func (r Record) String() string { return r.Text }

// Geometry is a value of PostGIS' geometry or geography type, in the
// extended well-known binary form (EWKB) that Postgres' text form spells in
// hex.
type Geometry struct {
	EWKB      []byte
	Geography bool // the geography type; geometry otherwise
}

// String returns the EWKB in upper-case hex, as Postgres prints the value.
func (g Geometry) String() string { return strings.ToUpper(hex.EncodeToString(g.EWKB)) }

// SRID returns the spatial reference id the EWKB carries, and whether it
// carries one.
func (g Geometry) SRID() (int32, bool) {
	b := g.EWKB
	if len(b) < 9 || b[0] > 1 {
		return 0, false
	}
	var order binary.ByteOrder = binary.BigEndian
	if b[0] == 1 {
		order = binary.LittleEndian
	}
	if order.Uint32(b[1:5])&0x20000000 == 0 {
		return 0, false
	}
	return int32(order.Uint32(b[5:9])), true
}

// AbsentValue marks a column the before image does not carry (replica
// identity default or index: only key columns are sent).
type AbsentValue struct{}

// Absent is the value of a column missing from a partial before image.
var Absent = AbsentValue{}

// GobEncode lets spilled rows carry the marker (gob refuses empty structs).
func (UnchangedToast) GobEncode() ([]byte, error) { return []byte{1}, nil }

// GobDecode implements gob.GobDecoder.
func (*UnchangedToast) GobDecode([]byte) error { return nil }

// GobEncode lets spilled rows carry the marker (gob refuses empty structs).
func (AbsentValue) GobEncode() ([]byte, error) { return []byte{1}, nil }

// GobDecode implements gob.GobDecoder.
func (*AbsentValue) GobDecode([]byte) error { return nil }

// Txn is one committed transaction as a source emits it: whole, or, when
// larger than 1000 changes, as soon as that many arrived, the rest following
// through Rest as the source decodes it.
type Txn struct {
	Xid        uint32
	CommitLSN  LSN // the transaction's identity (see Change.CommitLSN)
	CommitTime time.Time
	// Changes are the transaction's changes, or its first ones when Rest is set.
	Changes []Change
	// Rest, when not nil, yields the changes after Changes: a transaction
	// too large to hold in memory, read back from disk in order, or still
	// arriving (Next then waits for the source, and ends with an error if
	// the source stops before the commit). The consumer reads it to the
	// end or closes it.
	Rest ChangeIter
}

// PartIter is a ChangeIter that can also hand over its next changes in a
// slice the caller then owns, without copying them: a transaction still
// arriving, in the parts the source decoded.
type PartIter interface {
	ChangeIter
	// NextPart returns the next changes (at least one, in order) in a
	// slice the caller owns; at the end it returns nil and io.EOF. Next and
	// NextPart may be mixed.
	NextPart() ([]Change, error)
}

// TakePart returns it's next changes in a slice the caller owns: its own
// part when it is a PartIter, else up to n changes read into a new slice.
func TakePart(it ChangeIter, n int) ([]Change, error) {
	if pi, ok := it.(PartIter); ok {
		return pi.NextPart()
	}
	buf := make([]Change, n)
	k, err := it.Next(buf)
	return buf[:k], err
}

// ChangeIter yields changes in order.
type ChangeIter interface {
	// Next fills dst with the next changes and returns how many; at the end
	// it returns 0 and io.EOF.
	Next(dst []Change) (int, error)
	// Close releases the iterator (and its file); safe to call twice, and
	// from another goroutine while Next runs or waits (Next then returns
	// an error).
	Close() error
}
