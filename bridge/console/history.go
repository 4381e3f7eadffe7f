package console

import (
	"sync"
	"time"
)

// The in-memory history behind the sparklines: a ring of fixed size per
// source, one slot per sample, every series sampled at the same instants.

// Series are the per-source series the history keeps, in the order of
// sample.values.
var Series = []string{"rate", "lag_bytes", "lag_seconds", "checkpoint_age", "retained_wal"}

// sample is one instant of one source; NaN-free: a value that was not
// known at that instant is -1.
type sample struct {
	at     time.Time
	values [5]float64
}

// ring keeps the last len(buf) samples of one source. Its memory is fixed
// at creation: len(buf) × 64 bytes (a time.Time and five float64s).
type ring struct {
	buf  []sample
	next int // where the next sample goes
	n    int // samples held, ≤ len(buf)
}

func newRing(size int) *ring { return &ring{buf: make([]sample, size)} }

func (r *ring) add(s sample) {
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	if r.n < len(r.buf) {
		r.n++
	}
}

// samples returns the samples held, oldest first.
func (r *ring) samples() []sample {
	out := make([]sample, 0, r.n)
	start := (r.next - r.n + len(r.buf)) % len(r.buf)
	for i := range r.n {
		out = append(out, r.buf[(start+i)%len(r.buf)])
	}
	return out
}

// history is the rings of every source, and what the rate is computed
// from: each source's delivered count at its previous sample.
type history struct {
	mu    sync.Mutex
	size  int
	rings map[string]*ring
	prev  map[string]prevCount
}

type prevCount struct {
	at        time.Time
	delivered uint64
}

func newHistory(size int) *history {
	return &history{size: size, rings: map[string]*ring{}, prev: map[string]prevCount{}}
}

// record adds a sample of source: its delivered count (the rate is the
// increase since the previous sample over the time between them; a count
// that went down, after a restart of the source's pipeline, starts over)
// and the other series' values in Series order after rate.
func (h *history) record(source string, at time.Time, delivered uint64, rest [4]float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[source]
	if r == nil {
		r = newRing(h.size)
		h.rings[source] = r
	}
	rate := -1.0
	if p, ok := h.prev[source]; ok && delivered >= p.delivered && at.After(p.at) {
		rate = float64(delivered-p.delivered) / at.Sub(p.at).Seconds()
	}
	h.prev[source] = prevCount{at: at, delivered: delivered}
	r.add(sample{at: at, values: [5]float64{rate, rest[0], rest[1], rest[2], rest[3]}})
}

// forget drops the sources not in keep (removed by a reload).
func (h *history) forget(keep map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.rings {
		if !keep[s] {
			delete(h.rings, s)
			delete(h.prev, s)
		}
	}
}

// Points is a source's history as the page receives it: the sample times
// (Unix milliseconds) and, per series name, the values (-1: unknown).
type Points struct {
	At     []int64              `json:"at"`
	Series map[string][]float64 `json:"series"`
}

func (h *history) points(source string) Points {
	h.mu.Lock()
	var ss []sample
	if r := h.rings[source]; r != nil {
		ss = r.samples()
	}
	h.mu.Unlock()
	p := Points{At: make([]int64, len(ss)), Series: make(map[string][]float64, len(Series))}
	for i, name := range Series {
		vs := make([]float64, len(ss))
		for j, s := range ss {
			vs[j] = s.values[i]
		}
		p.Series[name] = vs
	}
	for j, s := range ss {
		p.At[j] = s.at.UnixMilli()
	}
	return p
}
