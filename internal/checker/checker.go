// Package checker compares the changes a test committed in Postgres with
// what a stream holds, and reports every change that is missing, duplicated,
// out of order, unexpected, or part of an incomplete transaction
// (shared/research/reliability.md §5). The fault tests feed it the rows the
// database holds at the end (the ground truth, which also resolves commits
// whose outcome a writer could not know) and the stream read back in order.
package checker

import (
	"fmt"
	"sort"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Want is one committed change: a row that must appear in the stream once.
type Want struct {
	// Key identifies the row, e.g. "w3/17/2" (writer, writer sequence, part).
	Key string
	// Writer and Seq place the row in its writer's commit order: a writer
	// commits one transaction at a time, so its rows must appear with Seq
	// never decreasing.
	Writer int
	Seq    int64
}

// Got is one message of the stream, in stream order.
type Got struct {
	// StreamSeq is the message's stream sequence, for reports.
	StreamSeq uint64
	// Key is the row's key as in Want; empty for a control message.
	Key    string
	Writer int
	Seq    int64
	// Producer and Pos come from the message id (cdc.ParseID).
	Producer string
	Pos      cdc.Pos
	// TxSize is the transaction's size (the Bridge-Tx-Size header).
	TxSize uint32
	// Control marks a control message; ControlProducer is the producer a
	// resync message announces.
	Control         bool
	ControlProducer string
}

// Report lists what Compare found; each entry is a readable sample.
type Report struct {
	Missing    []string // committed, not in the stream
	Unexpected []string // in the stream, never committed
	Duplicates []string // in the stream more than once (by key or by message id)
	OutOfOrder []string // positions going backwards, a writer's commits reordered, an unannounced epoch
	Incomplete []string // transactions whose ordinals are not exactly 0..size-1
	Wanted     int      // number of committed changes
	Messages   int      // number of stream messages
}

// OK reports whether nothing was found.
func (r *Report) OK() bool {
	return len(r.Missing)+len(r.Unexpected)+len(r.Duplicates)+len(r.OutOfOrder)+len(r.Incomplete) == 0
}

// String summarises the report with up to five samples per finding.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d committed changes, %d messages", r.Wanted, r.Messages)
	for _, f := range []struct {
		name string
		s    []string
	}{{"missing", r.Missing}, {"unexpected", r.Unexpected}, {"duplicate", r.Duplicates}, {"out of order", r.OutOfOrder}, {"incomplete transactions", r.Incomplete}} {
		if len(f.s) == 0 {
			continue
		}
		fmt.Fprintf(&b, "; %s: %d (e.g. %s)", f.name, len(f.s), strings.Join(head(f.s, 5), ", "))
	}
	return b.String()
}

func head(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

type txKey struct {
	producer string
	lsn      cdc.LSN
}

// Compare checks got (the stream, in stream order) against want (every
// committed change).
//
// Rules: every wanted key appears exactly once; nothing else appears except
// control messages; message ids are unique; within a producer positions
// (commit LSN, ordinal) strictly increase; a writer's rows appear with Seq
// never decreasing; a producer other than the first appears only after a
// control message announcing it; and every transaction present holds
// ordinals 0..TxSize-1 exactly.
func Compare(want []Want, got []Got) *Report {
	r := &Report{Wanted: len(want), Messages: len(got)}
	wanted := make(map[string]bool, len(want))
	for _, w := range want {
		wanted[w.Key] = true
	}
	seen := make(map[string]uint64, len(got))
	ids := make(map[string]uint64, len(got))
	lastPos := map[string]cdc.Pos{}
	lastSeq := map[int]Got{}
	announced := map[string]bool{}
	first := ""
	type txn struct {
		size uint32
		ords map[uint32]int
		at   uint64
	}
	txns := map[txKey]*txn{}
	var order []txKey
	for _, g := range got {
		id := fmt.Sprintf("%s:%s:%d", g.Producer, g.Pos.LSN.Hex(), g.Pos.Seq)
		if prev, dup := ids[id]; dup {
			r.Duplicates = append(r.Duplicates, fmt.Sprintf("id %s at stream seq %d and %d", id, prev, g.StreamSeq))
		}
		ids[id] = g.StreamSeq
		if g.Control {
			if g.ControlProducer != "" {
				announced[g.ControlProducer] = true
			}
			continue
		}
		// Epochs: the first producer is free, later ones must be announced.
		switch {
		case first == "":
			first = g.Producer
		case g.Producer != first && !announced[g.Producer]:
			r.OutOfOrder = append(r.OutOfOrder, fmt.Sprintf("stream seq %d: producer %s appears without a resync message", g.StreamSeq, g.Producer))
			announced[g.Producer] = true // report once
		}
		if l, ok := lastPos[g.Producer]; ok && !l.Less(g.Pos) && l != g.Pos {
			r.OutOfOrder = append(r.OutOfOrder, fmt.Sprintf("stream seq %d: %s:%d after %s:%d", g.StreamSeq, g.Pos.LSN, g.Pos.Seq, l.LSN, l.Seq))
		}
		if l, ok := lastPos[g.Producer]; !ok || l.Less(g.Pos) {
			lastPos[g.Producer] = g.Pos
		}
		if g.Key == "" {
			continue
		}
		if prev, dup := seen[g.Key]; dup {
			r.Duplicates = append(r.Duplicates, fmt.Sprintf("row %s at stream seq %d and %d", g.Key, prev, g.StreamSeq))
		} else {
			seen[g.Key] = g.StreamSeq
		}
		if !wanted[g.Key] {
			r.Unexpected = append(r.Unexpected, fmt.Sprintf("row %s at stream seq %d", g.Key, g.StreamSeq))
		}
		if l, ok := lastSeq[g.Writer]; ok && g.Seq < l.Seq {
			r.OutOfOrder = append(r.OutOfOrder, fmt.Sprintf("stream seq %d: writer %d commit %d after its commit %d (stream seq %d)", g.StreamSeq, g.Writer, g.Seq, l.Seq, l.StreamSeq))
		} else {
			lastSeq[g.Writer] = g
		}
		k := txKey{g.Producer, g.Pos.LSN}
		t := txns[k]
		if t == nil {
			t = &txn{size: g.TxSize, ords: map[uint32]int{}, at: g.StreamSeq}
			txns[k] = t
			order = append(order, k)
		}
		// A transaction published before its commit arrived carries its
		// size on its last change only.
		t.size = max(t.size, g.TxSize)
		t.ords[g.Pos.Seq]++
	}
	for _, w := range want {
		if _, ok := seen[w.Key]; !ok {
			r.Missing = append(r.Missing, w.Key)
		}
	}
	sort.Strings(r.Missing)
	for _, k := range order {
		t := txns[k]
		ok := uint32(len(t.ords)) == t.size
		for o := range t.ords {
			if o >= t.size {
				ok = false
			}
		}
		if !ok {
			var have []int
			for o := range t.ords {
				have = append(have, int(o))
			}
			sort.Ints(have)
			r.Incomplete = append(r.Incomplete, fmt.Sprintf("%s at %s (from stream seq %d): size %d, ordinals %v", k.producer, k.lsn, t.at, t.size, have))
		}
	}
	return r
}
