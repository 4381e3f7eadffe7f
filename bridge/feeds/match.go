package feeds

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// kind is how a matched change is delivered to a feed.
type kind uint8

const (
	kindAsIs kind = iota // the change as it happened
	kindIn               // an update moving the row into the filter: an insert
	kindOut              // an update moving the row out of the filter: a delete
)

// opMask is a set of row operations.
type opMask uint8

const (
	maskInsert opMask = 1 << iota
	maskUpdate
	maskDelete
	maskRead
	maskAll = maskInsert | maskUpdate | maskDelete | maskRead
)

func opBit(op cdc.Op) opMask {
	switch op {
	case cdc.OpInsert:
		return maskInsert
	case cdc.OpUpdate:
		return maskUpdate
	case cdc.OpDelete:
		return maskDelete
	case cdc.OpRead:
		return maskRead
	}
	return 0
}

// projection is a column set, shared by every feed that asks for it.
// Feeds count its users (refs) and drop it when it has been idle for
// ProjectionIdle (projections.go).
type projection struct {
	id   uint64              // unique in the Feeds' life: encodings name it
	key  string              // projKey
	cols map[string]struct{} // nil: all columns
	refs int                 // feeds registered with it, under fs.mu
	idle time.Time           // when refs fell to 0, under fs.mu
}

// compiled is a validated Filter.
type compiled struct {
	tables []string // nil: every table
	ops    opMask
	where  *Cond
	prog   *node // where compiled; shared with the feed's group once registered
	proj   *projection
}

// compile validates f and normalises a copy of it.
func compile(f Filter) (*compiled, error) {
	c := &compiled{ops: 0}
	for _, op := range f.Ops {
		b := opBit(op)
		if b == 0 {
			return nil, fmt.Errorf("filter.ops: %q is not a row operation (insert, update, delete, read)", op)
		}
		c.ops |= b
	}
	if c.ops == 0 {
		c.ops = maskAll
	}
	if len(f.Tables) > 0 {
		for _, t := range f.Tables {
			if !strings.Contains(t, ".") {
				return nil, fmt.Errorf("filter.tables: %q is not schema.table (e.g. public.%s)", t, t)
			}
			if !c.hasTable(t) || c.tables == nil {
				c.tables = append(c.tables, t)
			}
		}
	}
	if f.Where != nil {
		w := f.Where.clone()
		if err := w.validate("filter.where"); err != nil {
			return nil, err
		}
		c.where = &w
		n := compileCond(&w, nil)
		c.prog = &n
	}
	return c, nil
}

// projKey is the canonical name of a column set: sorted, each once,
// comma-joined.
func projKey(cols []string) string {
	if len(cols) == 0 {
		return ""
	}
	s := append([]string(nil), cols...)
	sort.Strings(s)
	return strings.Join(slices.Compact(s), ",")
}

func (f *compiled) hasTable(t string) bool {
	if f.tables == nil {
		return true
	}
	for _, x := range f.tables {
		if x == t {
			return true
		}
	}
	return false
}

// match decides whether c reaches a feed with filter f, and how. Inserts
// and reads match on the new row, deletes on the old one (the before image,
// or the key when the replica identity sends only that). An update matches
// as an update when the new row matches (or it cannot be told and the old
// row matched), as an insert (kindIn) when the old row is known not to
// match and the new row does, and as a delete (kindOut) when the old row
// matched and the new one does not. A condition over a column the image
// does not carry is unknown and never matches: with the default replica
// identity, leaving a filter over non-key columns is not seen.
func (f *compiled) match(c *change) (kind, bool) {
	if f.ops&opBit(c.op) == 0 || !f.hasTable(c.table) {
		return 0, false
	}
	if f.where == nil {
		return kindAsIs, true
	}
	switch c.op {
	case cdc.OpInsert, cdc.OpRead:
		return kindAsIs, f.prog.eval(c.after) == yes
	case cdc.OpDelete:
		return kindAsIs, f.prog.eval(c.old) == yes
	case cdc.OpUpdate:
		a := f.prog.eval(c.after)
		b := f.prog.eval(c.old)
		switch {
		case a == yes && b == no:
			return kindIn, true
		case a == yes, a == unknown && b == yes:
			return kindAsIs, true
		case a == no && b == yes:
			return kindOut, true
		}
	}
	return 0, false
}

// serialise returns the JSON of c for projection p delivered as k, made
// once and shared by every feed asking for the same (p, k). The second
// result reports whether this call made it. The bytes an encoding holds
// are added to window while c is in the window (countLocked).
func (c *change) serialise(p *projection, k kind, window *atomic.Int64) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.ser {
		if s.proj == p.id && s.kind == k {
			return s.b, false
		}
	}
	b := c.appendJSON(nil, p, k)
	c.ser = append(c.ser, serialised{proj: p.id, kind: k, b: b})
	n := int64(len(b) + serialisedOverhead)
	c.serBytes += n
	if c.inWindow {
		window.Add(n)
	}
	return b, true
}

// appendJSON writes the change as a feed sees it:
//
//	{"seq":12,"id":"<Nats-Msg-Id>","op":"update","table":"public.orders",
//	 "commit_lsn":"0/16B37A0","key":{...},"before":{...},"after":{...}}
//
// An update moving the row into the filter is written as op "insert" with
// "moved":"in" and no before; one moving it out as op "delete" with
// "moved":"out", the old key and no after (the new row belongs to someone
// else's filter). Before and after are projected; the key never is.
func (c *change) appendJSON(dst []byte, p *projection, k kind) []byte {
	op := string(c.op)
	before, after, key := c.before, c.after, c.key
	switch k {
	case kindIn:
		op, before = "insert", nil
	case kindOut:
		op, after = "delete", nil
		if before != nil {
			key = oldKey(c.key, before)
		}
	}
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, c.seq, 10)
	dst = append(dst, `,"id":`...)
	dst = appendJSONString(dst, c.id)
	dst = append(dst, `,"op":"`...)
	dst = append(dst, op...)
	dst = append(dst, `","table":`...)
	dst = appendJSONString(dst, c.table)
	dst = append(dst, `,"commit_lsn":`...)
	dst = appendJSONString(dst, c.commit)
	switch k {
	case kindIn:
		dst = append(dst, `,"moved":"in"`...)
	case kindOut:
		dst = append(dst, `,"moved":"out"`...)
	}
	dst = append(dst, `,"key":`...)
	dst = appendRow(dst, key, nil)
	if before != nil {
		dst = append(dst, `,"before":`...)
		dst = appendRow(dst, before, p.cols)
	}
	if after != nil {
		dst = append(dst, `,"after":`...)
		dst = appendRow(dst, after, p.cols)
	}
	return append(dst, '}')
}

// oldKey takes the key's column names and the before image's values.
func oldKey(key, before *row) *row {
	if key == nil {
		return nil
	}
	out := &row{}
	for i, n := range key.names {
		raw, v := key.raws[i], key.vals[i]
		for j, bn := range before.names {
			if bn == n {
				raw, v = before.raws[j], before.vals[j]
				break
			}
		}
		out.names = append(out.names, n)
		out.raws = append(out.raws, raw)
		out.vals = append(out.vals, v)
	}
	return out
}

func appendRow(dst []byte, r *row, cols map[string]struct{}) []byte {
	if r == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '{')
	n := 0
	for i, name := range r.names {
		if cols != nil {
			if _, ok := cols[name]; !ok {
				continue
			}
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = appendJSONString(dst, name)
		dst = append(dst, ':')
		dst = append(dst, r.raws[i]...)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
