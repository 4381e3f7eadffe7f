package feeds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Headers the natsjs sink sets (sinks/natsjs); repeated here because the
// library never imports a sink. The commit LSN and the ordinal are in the
// message id.
const (
	headerMsgID  = "Nats-Msg-Id"
	headerTxSize = "Bridge-Tx-Size" // absent while the transaction's size is not known
	headerTable  = "Bridge-Table"
	// headerDeadLetter is set on a change set aside on a dead-letter subject
	// (route.HeaderDeadLetterReason, natsjs.HeaderDeadLetterReason).
	headerDeadLetter = "Bridge-Dead-Letter-Reason"
	// headerPayloadObject names the object ("<bucket>/<object>") holding
	// the payload of a change too large for one message, which then has
	// none (natsjs.HeaderPayloadObject).
	headerPayloadObject = "Bridge-Payload-Object"
	headerOp            = "Bridge-Op"
)

// row is a decoded JSON object of column values, in the order of the
// payload. vals are normalised (see normalize); raws are the value bytes
// as the payload had them, reused when serialising.
type row struct {
	names []string
	vals  []any
	raws  []json.RawMessage
}

func (r *row) get(col string) (any, bool) {
	if r == nil {
		return nil, false
	}
	for i, n := range r.names {
		// Length and first byte inline, before the call comparing bytes:
		// names of one length mostly differ at once.
		if len(n) == len(col) && (len(n) == 0 || n[0] == col[0]) && n == col {
			return r.vals[i], true
		}
	}
	return nil, false
}

// change is one message of the stream, decoded once.
type change struct {
	seq      uint64 // stream sequence
	id       string // Nats-Msg-Id
	producer string
	lsn      cdc.LSN
	ord, n   uint32 // ordinal in the transaction, transaction size (0: not known on this change)
	snap     bool   // a snapshot read (producer "<producer>.snap-<run>")
	op       cdc.Op
	table    string // "schema.table"
	commit   string // commit LSN, Postgres form

	key, before, after *row
	// old is the old row as far as it is known: before, else the key (an
	// update without a before image did not change its key).
	old     *row
	control *cdc.Control // for op control
	size    int          // bytes held, roughly
	recv    time.Time    // when the consumer read it

	mu       sync.Mutex
	ser      []serialised
	serBytes int64 // the bytes ser holds, with serialisedOverhead each
	inWindow bool  // in the window: serBytes is counted in Feeds.encBytes
}

type serialised struct {
	proj uint64
	kind kind
	b    []byte
}

// serialisedOverhead is what one encoding costs besides its bytes: its
// entry in change.ser and the slice's header.
const serialisedOverhead = 48

// bridgeMsg reports whether the message carries the bridge's headers.
func bridgeMsg(h nats.Header) bool { return h.Get(headerOp) != "" && h.Get(headerMsgID) != "" }

// decode is the package's decode for fs: with Config.Route set, a message
// of another route (or of none) becomes a single-message transaction that
// matches nothing, as a message that is not the bridge's does.
func (fs *Feeds) decode(seq uint64, h nats.Header, data []byte, nm *names) (*change, error) {
	if fs.cfg.Route != "" && bridgeMsg(h) {
		if _, pos, err := cdc.ParseID(h.Get(headerMsgID)); err == nil && pos.Dest != fs.cfg.Route {
			return &change{seq: seq, n: 1, size: 200 + len(data)*2}, nil
		}
	}
	return decode(seq, h, data, nm)
}

// isSnapshot reports whether producer is a snapshot run's,
// "<bridge>.<source>.<epoch>.snap-<run>" (bridge/snapshot).
func isSnapshot(producer string) bool { return strings.Contains(producer, ".snap-") }

// decode turns a stream message into a change. Messages that are not the
// bridge's (no Bridge-Op header) become single-message transactions that
// match nothing; a change whose payload is not the native JSON format
// counts in its transaction and matches nothing.
func decode(seq uint64, h nats.Header, data []byte, nm *names) (*change, error) {
	c := &change{seq: seq, n: 1, size: 200 + len(data)*2}
	if !bridgeMsg(h) {
		return c, nil
	}
	c.id = h.Get(headerMsgID)
	prod, pos, err := cdc.ParseID(c.id)
	if err != nil {
		return c, err
	}
	c.producer, c.lsn, c.ord = prod, pos.LSN, pos.Seq
	c.n = 0 // a change published before its transaction's end: the last one tells the size
	if isSnapshot(prod) {
		// A snapshot read: its id's position is a hash of the row's table
		// and key (docs/snapshots.md), not a commit LSN and an ordinal, so
		// it cannot be grouped with the rest of its chunk. Reads are
		// upserts of the current rows, consistent each on its own: each is
		// a transaction of its own for the feeds.
		c.snap, c.ord, c.n = true, 0, 1
	} else if v := h.Get(headerTxSize); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return c, fmt.Errorf("message %d (%s): bad %s %q", seq, c.id, headerTxSize, v)
		}
		c.n = uint32(n)
	}
	if h.Get(headerDeadLetter) != "" {
		// Set aside on a dead-letter subject, by its route (a held table,
		// on_schema_change: dead_letter) or its sink (a message the server
		// would refuse): not what the route's consumers see. It counts in
		// its transaction, and matches no feed.
		return c, nil
	}
	c.op = cdc.Op(h.Get(headerOp))
	c.table = h.Get(headerTable)
	c.commit = c.lsn.String()
	if c.snap {
		// A read's id holds no LSN: the payload's commit_lsn is the
		// snapshot's consistent point.
		var p struct {
			CommitLSN string `json:"commit_lsn"`
		}
		if err := json.Unmarshal(data, &p); err == nil {
			c.commit = p.CommitLSN
		}
	}
	switch c.op {
	case cdc.OpControl:
		var ctl cdc.Control
		if err := json.Unmarshal(data, &ctl); err != nil {
			return c, fmt.Errorf("message %d (%s): decoding control payload: %w", seq, c.id, err)
		}
		c.control = &ctl
		return c, nil
	case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead:
	default:
		return c, nil
	}
	key, before, after, err := rowFields(data)
	if err == nil {
		// The after image first: the before image then takes the values
		// of its unchanged columns from it, parsed once and shared, so
		// that reading both images of an update reads those only once.
		if c.key, err = parseRow(key, nm, 0, nil); err == nil {
			if c.after, err = parseRow(after, nm, 1, nil); err == nil {
				c.before, err = parseRow(before, nm, 1, c.after)
			}
		}
	}
	if err != nil {
		// It counts in its transaction and matches no feed.
		c.op, c.table, c.key, c.before, c.after = "", "", nil, nil, nil
		return c, fmt.Errorf("message %d (%s): decoding payload as native JSON: %w", seq, c.id, err)
	}
	c.old = c.before
	if c.old == nil {
		c.old = c.key
	}
	return c, nil
}

// rowFields returns the raw values of the payload's top-level "key",
// "before" and "after" members, skipping the others without decoding them.
func rowFields(b []byte) (key, before, after []byte, err error) {
	b = trimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil, nil, nil, errors.New("payload is not an object")
	}
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return nil, nil, nil, nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return nil, nil, nil, fmt.Errorf("want a member name at byte %d", i)
		}
		j, err := skipString(b, i)
		if err != nil {
			return nil, nil, nil, err
		}
		name := b[i+1 : j-1]
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return nil, nil, nil, fmt.Errorf("want ':' at byte %d", i)
		}
		i = skipSpace(b, i+1)
		j, err = skipValue(b, i)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("member %q: %w", name, err)
		}
		switch string(name) {
		case "key":
			key = b[i:j]
		case "before":
			before = b[i:j]
		case "after":
			after = b[i:j]
		}
		i = skipSpace(b, j)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' && skipSpace(b, i+1) == len(b) {
			return key, before, after, nil
		}
		return nil, nil, nil, fmt.Errorf("want ',' or '}' at byte %d", i)
	}
	return nil, nil, nil, errors.New("unterminated object")
}

// rowMem is a row with room for eight columns in the same allocation;
// wider rows grow their slices elsewhere.
type rowMem struct {
	row
	vals [8]any
	raws [8]json.RawMessage
}

// names interns column names for the consumer, which decodes the same few
// names in every message, and shares one names slice between consecutive
// keys, and between consecutive images (before, after), with the same
// columns, so that a row costs no names allocation and the index can
// remember where a column is (colIndex). nil interns nothing. Not safe for
// concurrent use.
type names struct {
	m    map[string]string
	last [2][]string // the names of the last key, and of the last image
}

func newNames() *names { return &names{m: map[string]string{}} }

// name unquotes the JSON string b, interned.
func (nm *names) name(b []byte) (string, error) {
	s := b[1 : len(b)-1]
	if nm != nil {
		if n, ok := nm.m[string(s)]; ok {
			return n, nil
		}
	}
	n, err := unquote(b)
	if err == nil && nm != nil && len(nm.m) < 4096 && n == string(s) {
		nm.m[n] = n
	}
	return n, err
}

// rowNames builds a row's names slice: while they are the last row's,
// nothing is allocated and the last row's slice is returned.
type rowNames struct {
	last []string
	own  []string
	n    int
}

func (rn *rowNames) add(name string) {
	if rn.own == nil && rn.n < len(rn.last) && rn.last[rn.n] == name {
		rn.n++
		return
	}
	if rn.own == nil {
		rn.own = make([]string, rn.n, max(8, rn.n+1))
		copy(rn.own, rn.last[:rn.n])
	}
	rn.own = append(rn.own, name)
	rn.n++
}

func (rn *rowNames) done() []string {
	if rn.own == nil && rn.n == len(rn.last) {
		return rn.last
	}
	if rn.own == nil {
		rn.own = append([]string(nil), rn.last[:rn.n]...)
	}
	return rn.own
}

// parseRow splits a JSON object into names, raw values and values; null
// or empty gives nil. slot is 0 for a key, 1 for an image (see names).
// Columns with the same name, position and JSON text as in twin (the
// after image, for a before image) take twin's value instead of a new one;
// values are never modified, so sharing them is safe.
func parseRow(b []byte, nm *names, slot int, twin *row) (*row, error) {
	b = trimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		return nil, nil
	}
	if b[0] != '{' {
		return nil, errors.New("row is not an object")
	}
	m := &rowMem{} // one allocation, values next to the row
	r := &m.row
	r.vals, r.raws = m.vals[:0], m.raws[:0]
	var rn rowNames
	if nm != nil {
		rn.last = nm.last[slot]
	}
	finish := func() *row {
		r.names = rn.done()
		if nm != nil {
			nm.last[slot] = r.names
		}
		return r
	}
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return finish(), nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return nil, fmt.Errorf("want a column name at byte %d", i)
		}
		j, err := skipString(b, i)
		if err != nil {
			return nil, err
		}
		name, err := nm.name(b[i:j])
		if err != nil {
			return nil, err
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return nil, fmt.Errorf("want ':' at byte %d", i)
		}
		i = skipSpace(b, i+1)
		j, err = skipValue(b, i)
		if err != nil {
			return nil, err
		}
		raw := json.RawMessage(b[i:j])
		if hasControl(raw) {
			raw = compactJSON(raw)
		}
		var v any
		if k := len(r.vals); twin != nil && k < len(twin.names) && twin.names[k] == name && bytes.Equal(twin.raws[k], raw) {
			v = twin.vals[k] // unchanged: the same value, shared
		} else if v, err = parseValue(raw); err != nil {
			return nil, fmt.Errorf("column %q: %w", name, err)
		}
		rn.add(name)
		r.raws = append(r.raws, raw)
		r.vals = append(r.vals, v)
		i = skipSpace(b, j)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			return finish(), nil
		}
		return nil, fmt.Errorf("want ',' or '}' at byte %d", i)
	}
	return nil, errors.New("unterminated object")
}

// hasControl reports whether b holds a byte below 0x20: a line break or
// tab between the tokens of a json column's text (Postgres keeps json as
// written), or a control character a string should have escaped.
func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// compactJSON returns the JSON text b without a byte below 0x20: the
// whitespace between tokens removed, control characters inside strings
// escaped (\u00XX). A change's encoding is then one line, so no reader
// splitting on line breaks (an SSE data line) can cut it.
func compactJSON(b []byte) json.RawMessage {
	const hex = "0123456789abcdef"
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString && escaped:
			escaped = false
			if c < 0x20 { // not an escape JSON has: make it \u00XX
				out = append(out, 'u', '0', '0', hex[c>>4], hex[c&0xF])
				continue
			}
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString && c < 0x20:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			continue
		case inString:
		case c == '"':
			inString = true
		case c < 0x20 || c == ' ':
			continue // between tokens
		}
		out = append(out, c)
	}
	return out
}

// parseValue normalises one JSON value; objects stay their raw text.
func parseValue(raw []byte) (any, error) {
	switch raw[0] {
	case '"':
		return unquote(raw)
	case 'n', 't', 'f':
		switch string(raw) {
		case "null":
			return nil, nil
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
	case '{':
		return string(raw), nil
	case '[':
		a, err := parseArray(raw)
		if err != nil {
			return nil, err
		}
		return a, nil
	default:
		if n, ok := smallInt(raw); ok {
			return n, nil
		}
		if validNumber(raw) {
			return normalize(json.Number(raw)), nil
		}
	}
	return nil, fmt.Errorf("invalid value %.20q", raw)
}

// smallInt parses an integer of up to 18 digits without allocating.
func smallInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// parseArray normalises a JSON array: its elements as parseValue makes
// them.
func parseArray(b []byte) ([]any, error) {
	out := []any{}
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == ']' {
		return out, nil
	}
	for i < len(b) {
		j, err := skipValue(b, i)
		if err != nil {
			return nil, err
		}
		v, err := parseValue(b[i:j])
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		i = skipSpace(b, j)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == ']' {
			return out, nil
		}
		return nil, fmt.Errorf("want ',' or ']' at byte %d", i)
	}
	return nil, errors.New("unterminated array")
}

// validNumber reports whether b is a JSON number.
func validNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	i, ok := digits(b, i)
	if ok && i < len(b) && b[i] == '.' {
		i, ok = digits(b, i+1)
	}
	if ok && i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		i, ok = digits(b, i)
	}
	return ok && i == len(b)
}

// digits skips the decimal digits at b[i:]; ok is false when there are none.
func digits(b []byte, i int) (int, bool) {
	d := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i, i > d
}

func unquote(b []byte) (string, error) {
	s := b[1 : len(b)-1]
	if !strings.ContainsRune(string(s), '\\') {
		return string(s), nil
	}
	var out string
	if err := json.Unmarshal(b, &out); err != nil {
		return "", err
	}
	return out, nil
}

func trimSpace(b []byte) []byte {
	i := skipSpace(b, 0)
	j := len(b)
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errors.New("unterminated string")
}

// skipValue returns the index after the JSON value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errors.New("missing value")
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				k, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = k - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errors.New("unterminated value")
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && !isSpace(b[j]) {
		j++
	}
	if j == i {
		return 0, fmt.Errorf("missing value at byte %d", i)
	}
	return j, nil
}
