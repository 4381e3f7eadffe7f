package format

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// AppendNative appends c in the native JSON encoding: one object whose keys
// come in this order (optional ones only when they apply):
//
//	"op"               "insert", "update", "delete", "truncate", "message" or "read"
//	"source", "schema", "table"
//	"commit_lsn"       commit end LSN in Postgres form, "0/16B37A0"
//	"lsn"              the change's own LSN, same form
//	"seq", "xid"       numbers
//	"tx_size"          a number, or null while the transaction's size is not
//	                   known (c.TxSize 0: a change the source handed over
//	                   before its transaction's end)
//	"commit_time"      RFC 3339 in UTC with microseconds, or null when zero
//	"key"              the key columns (Column.Key) as an object: from After
//	                   for insert, update (the new key) and read, from
//	                   Before for delete; null for truncate and message, when
//	                   the row is nil, or when the relation has no key column.
//	                   An unchanged-TOAST key column in After is taken from
//	                   Before when Before has it, else left out.
//	"before"           Before as an object, Absent and Unchanged columns left out; or null
//	"after"            After as an object, Unchanged columns left out; or null
//	"unchanged_toast"  optional: names of the After columns holding Unchanged
//	"masked"           optional: the columns the route masked, by name, and
//	                   how: {"ssn": "redact", "email": "hash", "notes":
//	                   "truncate"}; from the Bridge-Masked header in
//	                   c.Headers (HeaderMasked)
//	"truncate"         only for truncate: {"cascade": bool, "restart_identity": bool}
//	"message"          only for message: {"prefix", "transactional", and
//	                   "content" (text) or, when Content is not valid UTF-8,
//	                   "content_base64"}
//
// The change's id (c.ID()) is not in the object: every sink carries it
// beside the payload (Nats-Msg-Id, the webhook's envelope, the KV value's
// Bridge-Id header), and a CloudEvent, which embeds this object, has its
// own "id".
//
// Column values are rendered by AppendValue and named by c.Rel.Columns; a
// value without a column in Rel is named by its 1-based position. Column
// names are escaped like any string.
func AppendNative(dst []byte, c *cdc.Change) []byte {
	dst = append(dst, `{"op":`...)
	dst = appendString(dst, string(c.Op))
	dst = append(dst, `,"source":`...)
	dst = appendString(dst, c.Source)
	dst = append(dst, `,"schema":`...)
	dst = appendString(dst, c.Schema)
	dst = append(dst, `,"table":`...)
	dst = appendString(dst, c.Table)
	dst = append(dst, `,"commit_lsn":`...)
	dst = appendLSN(dst, c.CommitLSN)
	dst = append(dst, `,"lsn":`...)
	dst = appendLSN(dst, c.LSN)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, uint64(c.Seq), 10)
	dst = append(dst, `,"tx_size":`...)
	if c.TxSize > 0 {
		dst = strconv.AppendUint(dst, uint64(c.TxSize), 10)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"xid":`...)
	dst = strconv.AppendUint(dst, uint64(c.Xid), 10)
	dst = append(dst, `,"commit_time":`...)
	dst = appendCommitTime(dst, c.CommitTime)

	var cols []cdc.Column
	if c.Rel != nil {
		cols = c.Rel.Columns
	}
	dst = append(dst, `,"key":`...)
	switch c.Op {
	case cdc.OpTruncate, cdc.OpMessage:
		dst = append(dst, "null"...)
	case cdc.OpDelete:
		dst = appendKey(dst, cols, c.Before, nil)
	default:
		dst = appendKey(dst, cols, c.After, c.Before)
	}
	dst = append(dst, `,"before":`...)
	dst = appendRow(dst, cols, c.Before)
	dst = append(dst, `,"after":`...)
	dst = appendRow(dst, cols, c.After)
	dst = appendUnchanged(dst, cols, c.After)
	if m := c.Headers[HeaderMasked]; m != "" {
		dst = append(dst, `,"masked":`...)
		dst = AppendMasked(dst, m)
	}

	switch c.Op {
	case cdc.OpTruncate:
		dst = append(dst, `,"truncate":{"cascade":`...)
		dst = strconv.AppendBool(dst, c.Cascade)
		dst = append(dst, `,"restart_identity":`...)
		dst = strconv.AppendBool(dst, c.RestartIdentity)
		dst = append(dst, '}')
	case cdc.OpMessage:
		dst = append(dst, `,"message":{"prefix":`...)
		dst = appendString(dst, c.Prefix)
		dst = append(dst, `,"transactional":`...)
		dst = strconv.AppendBool(dst, c.Transactional)
		if utf8.Valid(c.Content) {
			dst = append(dst, `,"content":`...)
			dst = appendString(dst, string(c.Content))
		} else {
			dst = append(dst, `,"content_base64":`...)
			dst = appendBase64(dst, c.Content)
		}
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

func appendCommitTime(dst []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(dst, "null"...)
	}
	dst = append(dst, '"')
	dst = appendDateTime(dst, t.UTC())
	return append(dst, `Z"`...)
}

// appendColumn appends the name of column i as a JSON string: its name in
// cols, or its 1-based position when cols has no such column.
func appendColumn(dst []byte, cols []cdc.Column, i int) []byte {
	if i < len(cols) {
		return appendString(dst, cols[i].Name)
	}
	dst = append(dst, '"')
	dst = strconv.AppendInt(dst, int64(i+1), 10)
	return append(dst, '"')
}

// appendName appends the JSON key for column i followed by ':'.
func appendName(dst []byte, cols []cdc.Column, i int) []byte {
	return append(appendColumn(dst, cols, i), ':')
}

// omitted reports whether v is a marker rather than a value.
func omitted(v any) bool {
	switch v.(type) {
	case cdc.UnchangedToast, cdc.AbsentValue:
		return true
	}
	return false
}

// appendKey appends the key columns of row as an object, falling back to
// alt for columns that row holds as Unchanged.
func appendKey(dst []byte, cols []cdc.Column, row, alt []any) []byte {
	if row == nil {
		return append(dst, "null"...)
	}
	n := 0
	for i := range cols {
		if !cols[i].Key || i >= len(row) {
			continue
		}
		v := row[i]
		if omitted(v) {
			if i >= len(alt) || omitted(alt[i]) {
				continue
			}
			v = alt[i]
		}
		if n == 0 {
			dst = append(dst, '{')
		} else {
			dst = append(dst, ',')
		}
		n++
		dst = appendName(dst, cols, i)
		dst = AppendValue(dst, v)
	}
	if n == 0 {
		return append(dst, "null"...)
	}
	return append(dst, '}')
}

func appendRow(dst []byte, cols []cdc.Column, row []any) []byte {
	if row == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '{')
	n := 0
	for i, v := range row {
		if omitted(v) {
			continue
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = appendName(dst, cols, i)
		dst = AppendValue(dst, v)
	}
	return append(dst, '}')
}

func appendUnchanged(dst []byte, cols []cdc.Column, row []any) []byte {
	n := 0
	for i, v := range row {
		if _, ok := v.(cdc.UnchangedToast); !ok {
			continue
		}
		if n == 0 {
			dst = append(dst, `,"unchanged_toast":[`...)
		} else {
			dst = append(dst, ',')
		}
		n++
		dst = appendColumn(dst, cols, i)
	}
	if n > 0 {
		dst = append(dst, ']')
	}
	return dst
}

const upperHex = "0123456789ABCDEF"

// appendLSN appends l in Postgres form, "16/B374D848", quoted.
func appendLSN(dst []byte, l cdc.LSN) []byte {
	dst = append(dst, '"')
	dst = appendUpperHex(dst, uint32(l>>32))
	dst = append(dst, '/')
	dst = appendUpperHex(dst, uint32(l))
	return append(dst, '"')
}

func appendUpperHex(dst []byte, v uint32) []byte {
	var b [8]byte
	i := len(b)
	for {
		i--
		b[i] = upperHex[v&0xF]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}

func appendHex16(dst []byte, v uint64) []byte {
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = upperHex[v&0xF]
		v >>= 4
	}
	return append(dst, b[:]...)
}
