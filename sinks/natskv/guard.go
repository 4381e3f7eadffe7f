package natskv

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sinks"
)

// The guard. Every value the sink writes carries its change's producer and
// position (Bridge-Producer, Bridge-Commit-Lsn, Bridge-Seq). Before writing
// a key, Write reads what the key holds (one batched direct get for the
// keys of a Write it does not know yet, remembered afterwards) and skips
// the change when the key holds a value of the same producer at the
// change's position or a later one; otherwise it writes with
// Nats-Expected-Last-Subject-Sequence set to the sequence it read, so the
// server refuses the write if anything was stored under the key since.
// A refusal makes Write read the key again and decide again. So a value
// is only ever replaced by a later change of its producer (or by any
// change of another producer: a new epoch after a resync, or a value the
// bridge did not write), whatever a crash, a replay from an older
// checkpoint or a retried Write sends again.

// held is what the bucket holds under a key, as far as the guard needs it.
type held struct {
	seq      uint64 // stream sequence of the key's last message; 0: none
	producer string // producer of the change that wrote it; "" when not the bridge's
	pos      cdc.Pos
	done     bool // a table's key: the truncate's purge is complete
}

// covers reports whether h is a value of producer at p or later: a change
// of producer at p must not replace it.
func (h held) covers(producer string, p cdc.Pos) bool {
	return h.seq != 0 && h.producer != "" && h.producer == producer && !h.pos.Less(p)
}

// heldOf reads the guard's headers of the message at seq.
func heldOf(seq uint64, h nats.Header) held {
	out := held{seq: seq}
	prod := h.Get(HeaderProducer)
	lsn, err := cdc.ParseLSN(h.Get(HeaderCommitLSN))
	sq, serr := strconv.ParseUint(h.Get(HeaderSeq), 10, 32)
	if prod == "" || err != nil || serr != nil {
		return out // not the bridge's: any change replaces it
	}
	out.producer, out.pos = prod, cdc.Pos{LSN: lsn, Seq: uint32(sq)}
	out.done = h.Get(HeaderTruncate) == truncateDone
	return out
}

// maxCachedRows bounds the rows the guard remembers; past it, it forgets
// them all and reads them again as Writes need them.
const maxCachedRows = 1 << 16

// cache is what Write knows the bucket holds.
type cache struct {
	rows  map[string]map[string]held // table key → row key → held
	n     int                        // rows remembered
	marks map[string]held            // table key → what its own key holds
}

func (c *cache) clear() {
	c.rows, c.marks, c.n = nil, nil, 0
}

func (c *cache) row(table, key string) (held, bool) {
	h, ok := c.rows[table][key]
	return h, ok
}

func (c *cache) setRow(table, key string, h held) {
	if c.n >= maxCachedRows {
		c.rows, c.n = nil, 0
	}
	if c.rows == nil {
		c.rows = map[string]map[string]held{}
	}
	m := c.rows[table]
	if m == nil {
		m = map[string]held{}
		c.rows[table] = m
	}
	if _, ok := m[key]; !ok {
		c.n++
	}
	m[key] = h
}

func (c *cache) forgetRow(table, key string) {
	if m := c.rows[table]; m != nil {
		if _, ok := m[key]; ok {
			delete(m, key)
			c.n--
		}
	}
}

// forgetTable forgets the rows of table and its own key.
func (c *cache) forgetTable(table string) {
	c.n -= len(c.rows[table])
	delete(c.rows, table)
	delete(c.marks, table)
}

func (c *cache) setMark(table string, h held) {
	if c.marks == nil {
		c.marks = map[string]held{}
	}
	c.marks[table] = h
}

// maxMulti is the most subjects one direct get asks for (the server
// answers at most 1024 messages).
const maxMulti = 1000

// lookup returns what the bucket holds under each of keys (held{} for
// none), in as few direct gets as the server's limits allow.
func (s *Sink) lookup(ctx context.Context, nc *nats.Conn, keys []string) (map[string]held, error) {
	out := make(map[string]held, len(keys))
	pending := keys
	for len(pending) > 0 {
		chunk := pending[:min(len(pending), maxMulti)]
		complete, err := s.multiLast(ctx, nc, chunk, out)
		if err != nil {
			return nil, err
		}
		var rest []string
		for _, k := range chunk {
			if _, ok := out[k]; ok {
				continue
			}
			if complete {
				out[k] = held{}
			} else {
				rest = append(rest, k)
			}
		}
		if len(rest) == len(chunk) {
			return nil, fmt.Errorf("reading the current values of %d keys of bucket %q: the server answered none", len(chunk), s.cfg.Bucket)
		}
		pending = append(rest, pending[len(chunk):]...)
	}
	return out, nil
}

// multiLast asks the bucket's stream for the last message of each key (a
// batched direct get, nats-server 2.11 or later) and records what each key
// that has one holds in out. complete is false when the server stopped
// short (its byte limit per answer): the keys not in out may have values.
func (s *Sink) multiLast(ctx context.Context, nc *nats.Conn, keys []string, out map[string]held) (complete bool, err error) {
	what := fmt.Sprintf("reading the current values of %d keys of bucket %q", len(keys), s.cfg.Bucket)
	subjects := make([]string, len(keys))
	for i, k := range keys {
		subjects[i] = s.cfg.subject(k)
	}
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return false, s.connErr(nc, what, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+s.cfg.stream(), inbox, req); err != nil {
		return false, s.connErr(nc, what, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	prefix := "$KV." + s.cfg.Bucket + "."
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return false, s.connErr(nc, what, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
			key, ok := strings.CutPrefix(m.Header.Get("Nats-Subject"), prefix)
			seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			if !ok || err != nil {
				return false, fmt.Errorf("%s: an answer without a subject of the bucket or a sequence (subject %q, sequence %q)",
					what, m.Header.Get("Nats-Subject"), m.Header.Get("Nats-Sequence"))
			}
			out[key] = heldOf(seq, m.Header)
		case "204": // end of the batch
			np := m.Header.Get("Nats-Num-Pending")
			return np == "" || np == "0", nil
		case "404": // none of the keys has a value
			return true, nil
		case "503":
			return false, fmt.Errorf("%s: %w: no responders for the direct get of stream %s (the bucket's stream does not allow direct gets, or is gone)",
				what, sinks.ErrNotConnected, s.cfg.stream())
		case "408":
			return false, sinks.Permanent(fmt.Errorf("%s: the server refused the batched direct get (%s): nats_kv needs nats-server 2.11 or later", what, m.Header.Get("Description")))
		default:
			return false, fmt.Errorf("%s: the server answered %s %s", what, status, m.Header.Get("Description"))
		}
	}
}

// connErr wraps err, marking a lost connection so the pipeline reconnects.
func (s *Sink) connErr(nc *nats.Conn, doing string, err error) error {
	if !nc.IsConnected() || isConnErr(err) {
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// at is c's position without its destination (cdc.Change.Dest): the
// guard's headers carry none, and a key's value is one route's.
func at(c *cdc.Change) cdc.Pos { return cdc.Pos{LSN: c.CommitLSN, Seq: c.Seq} }
