// Transactions: the assembler groups the stream's messages into whole
// transactions per producer and notices resyncs, epoch changes and
// truncations, which make feeds refetch.

package feeds

import (
	"strconv"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// txn is one whole transaction of one producer.
type txn struct {
	first, last uint64
	changes     []*change
	brk         string   // ReasonResync or ReasonEpoch: every feed must refetch
	truncs      []string // tables truncated: their feeds must refetch
	frag        bool     // began before the reader did: never delivered
	stableAt    uint64   // a transaction boundary right after this transaction, or 0
	size        int
}

// breaks reports whether t forces f to refetch, and why.
func (t *txn) breaks(f *compiled) *RefetchError {
	if t.brk != "" {
		return &RefetchError{Reason: t.brk, Seq: t.first, Detail: "at stream sequence " + strconv.FormatUint(t.first, 10)}
	}
	for _, tb := range t.truncs {
		if f.hasTable(tb) {
			return &RefetchError{Reason: ReasonTruncate, Seq: t.first, Detail: tb + " truncated at stream sequence " + strconv.FormatUint(t.first, 10)}
		}
	}
	return nil
}

type txKey struct {
	producer string
	lsn      cdc.LSN
}

// assembler groups messages into transactions (consecutive per producer,
// ordinals 0..size-1, possibly interleaved with other producers') and
// notices epoch changes.
type assembler struct {
	open      map[txKey]*txn
	producers map[string]string // "<bridge>.<source>" → producer
}

func newAssembler() *assembler {
	return &assembler{open: map[txKey]*txn{}, producers: map[string]string{}}
}

func sourceOf(producer string) string {
	if i := strings.LastIndexByte(producer, '.'); i > 0 {
		return producer[:i]
	}
	return producer
}

// seed records c's producer as its source's current one, without c.
func (a *assembler) seed(c *change) {
	if c.producer != "" && !c.snap {
		a.producers[sourceOf(c.producer)] = c.producer
	}
}

// add adds c; it returns the transaction c completes, or nil.
func (a *assembler) add(c *change) *txn {
	if c.producer == "" { // not the bridge's: a transaction of its own
		return &txn{first: c.seq, last: c.seq, size: c.size}
	}
	if c.snap {
		// A snapshot read, a transaction of its own (see decode). Its
		// producer is the run's, not the source's: a later run is no new
		// epoch of the source.
		return &txn{first: c.seq, last: c.seq, size: c.size, changes: []*change{c}}
	}
	k := txKey{c.producer, c.lsn}
	t := a.open[k]
	if t == nil {
		t = &txn{first: c.seq, frag: c.ord != 0}
		a.open[k] = t
	}
	t.changes = append(t.changes, c)
	t.last = c.seq
	t.size += c.size
	src := sourceOf(c.producer)
	if prev, ok := a.producers[src]; ok && prev != c.producer && t.brk == "" {
		t.brk = ReasonEpoch
	}
	a.producers[src] = c.producer
	switch {
	case c.op == cdc.OpControl && c.control != nil && c.control.Kind == cdc.ControlResync:
		t.brk = ReasonResync
	case c.op == cdc.OpTruncate && c.table != "":
		t.truncs = append(t.truncs, c.table)
	}
	if c.n > 0 && c.ord+1 >= c.n { // the size is known on a transaction's last change at least
		delete(a.open, k)
		return t
	}
	return nil
}
