package pgrepl

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TxnBuffer collects one transaction's changes, in memory up to a limit and
// then in a temporary file, so memory does not grow with the transaction.
// Decoders use one per open transaction, from one goroutine.
type TxnBuffer struct {
	dir        string
	maxChanges int
	maxBytes   int64

	mem   []cdc.Change
	bytes int64
	n     uint32

	f    *os.File
	w    *bufio.Writer
	rec  []byte // the record being written (spillcodec.go)
	rels []*cdc.Relation
	relx map[*cdc.Relation]int

	// Streaming (live.go): set by Stream; head and final by Begin.
	streamOn bool
	hooks    liveHooks
	head     *cdc.Txn // the open transaction's Xid and CommitTime
	final    cdc.LSN  // the start of its commit record, 0: not known
	live     *liveWriter
}

// NewTxnBuffer returns a buffer that keeps up to maxChanges changes or
// maxBytes of values in memory and spills the rest into dir ("" = the
// system's temp dir).
func NewTxnBuffer(dir string, maxChanges int, maxBytes int64) *TxnBuffer {
	return &TxnBuffer{dir: dir, maxChanges: maxChanges, maxBytes: maxBytes}
}

// Len returns the number of changes added since the last Finish.
func (b *TxnBuffer) Len() uint32 {
	if b.live != nil {
		return b.live.n
	}
	return b.n
}

// Spilled reports whether the current transaction went to disk.
func (b *TxnBuffer) Spilled() bool { return b.f != nil }

// Add appends c; size is its approximate size in bytes. When the
// transaction becomes one handed over while it arrives (live.go), Add
// returns it, once: the decoder returns it from Decode.
func (b *TxnBuffer) Add(c cdc.Change, size int) (*cdc.Txn, error) {
	if b.live != nil {
		return nil, b.live.add(c)
	}
	if b.streamOn && b.final != 0 && b.n == StreamAfter {
		return b.startLive(c)
	}
	return nil, b.add(c, size)
}

func (b *TxnBuffer) add(c cdc.Change, size int) error {
	b.n++
	if b.f == nil && len(b.mem) < b.maxChanges && b.bytes+int64(size) <= b.maxBytes {
		b.mem = append(b.mem, c)
		b.bytes += int64(size)
		return nil
	}
	if b.f == nil {
		f, err := os.CreateTemp(b.dir, "bridge-txn-*.spill")
		if err != nil {
			return fmt.Errorf("spilling a large transaction to disk: %w", err)
		}
		// Unlinked at once: the file lives as long as the descriptor.
		_ = os.Remove(f.Name())
		b.f, b.w = f, bufio.NewWriterSize(f, spillBuf)
		b.relx = map[*cdc.Relation]int{}
		b.rels = nil
		// The transaction goes to disk from its spillHead-th change on:
		// held in memory, a spilled transaction waiting in the queue would
		// hold up to maxChanges of them.
		if len(b.mem) > spillHead {
			for i := spillHead; i < len(b.mem); i++ {
				if err := b.spill(&b.mem[i], uint32(i+1)); err != nil {
					return err
				}
			}
			head := make([]cdc.Change, spillHead)
			copy(head, b.mem)
			b.mem = head
		}
	}
	return b.spill(&c, b.n)
}

// spill writes c, the transaction's n-th change (from 1), to the file.
func (b *TxnBuffer) spill(c *cdc.Change, n uint32) error {
	ri, ok := b.relx[c.Rel]
	if !ok {
		ri = len(b.rels)
		b.rels = append(b.rels, c.Rel)
		b.relx[c.Rel] = ri
	}
	rec, err := appendChange(b.rec[:0], c, ri)
	if err == nil {
		var l [binary.MaxVarintLen64]byte
		if _, err = b.w.Write(binary.AppendUvarint(l[:0], uint64(len(rec)))); err == nil {
			_, err = b.w.Write(rec)
		}
	}
	if err != nil {
		return fmt.Errorf("spilling change %d of a large transaction: %w", n, err)
	}
	if cap(rec) <= 1<<20 {
		b.rec = rec
	}
	return nil
}

// spillHead is how many of a spilled transaction's first changes stay in
// memory (Txn.Changes): the pipeline looks among them for the writer's
// trace context (a logical message written first in the transaction), and
// a transaction's first changes are routed while the rest is read back.
const spillHead = 64

// Finish ends the transaction: it sets every change's commit fields
// (CommitLSN, Seq, TxSize, Xid, CommitTime) and returns the Txn, with Rest
// reading the spilled part back. The buffer is then empty for the next one.
//
// A transaction already handed over (live.go) ends instead: its last change
// gets the size, its Rest ends, and Finish returns nil.
func (b *TxnBuffer) Finish(t *cdc.Txn) (*cdc.Txn, error) {
	if b.live != nil {
		err := b.live.finish()
		b.reset()
		return nil, err
	}
	n := b.n
	for i := range b.mem {
		c := &b.mem[i]
		c.CommitLSN, c.Seq, c.TxSize, c.Xid, c.CommitTime = t.CommitLSN, uint32(i), n, t.Xid, t.CommitTime
	}
	t.Changes = b.mem
	if b.f != nil {
		if err := b.w.Flush(); err != nil {
			b.f.Close()
			b.reset()
			return nil, fmt.Errorf("spilling a large transaction: %w", err)
		}
		if _, err := b.f.Seek(0, io.SeekStart); err != nil {
			b.f.Close()
			b.reset()
			return nil, fmt.Errorf("reading back a spilled transaction: %w", err)
		}
		t.Rest = &spillIter{f: b.f, rels: b.rels, recs: n - uint32(len(b.mem)),
			next: uint32(len(b.mem)), txSize: n, commit: t.CommitLSN, xid: t.Xid, at: t.CommitTime}
	}
	b.reset()
	return t, nil
}

// FinishStreamed ends a transaction that Postgres streamed before its
// commit (pgoutput's streaming of in-progress transactions), whose changes
// hold their subtransaction's id in Xid: the changes of the subtransactions
// in drop (aborted) are left out, the n others get t's commit fields, their
// ordinals in order, and t.Xid. It returns t, with Rest reading the spilled
// part back, or nil when nothing is left. The buffer is then empty.
func (b *TxnBuffer) FinishStreamed(t *cdc.Txn, drop map[uint32]bool, n uint32) (*cdc.Txn, error) {
	defer b.reset()
	if n == 0 {
		if b.f != nil {
			b.f.Close()
		}
		return nil, nil
	}
	held := len(b.mem)
	k := 0
	for i := range b.mem {
		c := b.mem[i]
		if drop[c.Xid] {
			continue
		}
		c.CommitLSN, c.Seq, c.TxSize, c.Xid, c.CommitTime = t.CommitLSN, uint32(k), n, t.Xid, t.CommitTime
		b.mem[k] = c
		k++
	}
	clear(b.mem[k:])
	t.Changes = b.mem[:k]
	if b.f != nil {
		if err := b.w.Flush(); err != nil {
			b.f.Close()
			return nil, fmt.Errorf("spilling a large transaction: %w", err)
		}
		if _, err := b.f.Seek(0, io.SeekStart); err != nil {
			b.f.Close()
			return nil, fmt.Errorf("reading back a spilled transaction: %w", err)
		}
		t.Rest = &spillIter{f: b.f, rels: b.rels, recs: b.n - uint32(held), next: uint32(k), txSize: n,
			drop: drop, commit: t.CommitLSN, xid: t.Xid, at: t.CommitTime}
	}
	return t, nil
}

// Discard drops the current transaction (a decoding error, or a begin
// without the commit of the transaction before). A transaction already
// handed over ends with an error for its reader.
func (b *TxnBuffer) Discard() {
	if b.f != nil {
		b.f.Close()
	}
	if b.live != nil {
		b.live.abort(errTxnCut)
	}
	b.reset()
}

func (b *TxnBuffer) reset() {
	b.mem, b.bytes, b.n = nil, 0, 0
	b.f, b.w, b.rels, b.relx = nil, nil, nil, nil
	b.head, b.final, b.live = nil, 0, nil
}

type spillIter struct {
	mu     sync.Mutex // Close may run beside Next
	f      *os.File
	r      *bufio.Reader // made at the first read: a transaction waiting in the queue holds no buffer
	rec    []byte
	cr     changeReader
	rels   []*cdc.Relation
	recs   uint32          // records left in the file
	next   uint32          // the ordinal of the next change
	txSize uint32          // the transaction's size set on each change (0: not known yet)
	drop   map[uint32]bool // subtransactions whose changes are left out (FinishStreamed)
	commit cdc.LSN
	xid    uint32
	at     time.Time
	done   bool
}

func (it *spillIter) Next(dst []cdc.Change) (int, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.done {
		return 0, io.EOF
	}
	n := 0
	for n < len(dst) && it.recs > 0 {
		c, err := it.read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return n, fmt.Errorf("reading back change %d of the transaction at %s: %w", it.next, it.commit, err)
		}
		it.recs--
		if it.drop[c.Xid] {
			continue
		}
		c.CommitLSN, c.Seq, c.TxSize, c.Xid, c.CommitTime = it.commit, it.next, it.txSize, it.xid, it.at
		dst[n] = c
		n++
		it.next++
	}
	if n == 0 {
		it.close()
		return 0, io.EOF
	}
	return n, nil
}

// read reads the next record.
func (it *spillIter) read() (cdc.Change, error) {
	var c cdc.Change
	if it.r == nil {
		it.r = bufio.NewReaderSize(it.f, spillBuf)
	}
	l, err := binary.ReadUvarint(it.r)
	if err != nil {
		return c, err
	}
	if l > 1<<40 {
		return c, errCorrupt
	}
	if uint64(cap(it.rec)) < l {
		it.rec = make([]byte, l)
	}
	rec := it.rec[:l]
	if _, err := io.ReadFull(it.r, rec); err != nil {
		return c, err
	}
	ri, err := it.cr.change(rec, &c)
	if err != nil {
		return c, err
	}
	if ri >= len(it.rels) {
		return c, errCorrupt
	}
	c.Rel = it.rels[ri]
	return c, nil
}

// Close implements cdc.ChangeIter; it may run beside Next.
func (it *spillIter) Close() error {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.close()
}

func (it *spillIter) close() error {
	if it.done {
		return nil
	}
	it.done = true
	it.r, it.rec = nil, nil
	return it.f.Close()
}

// spillBuf is the buffer of a spill file's writer and of its reader:
// enough for sequential I/O in few syscalls, small beside the changes held
// in memory.
const spillBuf = 256 << 10
