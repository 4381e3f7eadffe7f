package snapshot

import (
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"
)

// Live progress figures, for metrics, logs and `bridge status`.

func (m *Manager) setLive(run *Run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if run == nil {
		m.runID = "" // keep the last figures
		return
	}
	m.live = map[string]*snapLive{}
	m.done, m.total = 0, 0
	m.runID, m.total = run.ID, len(run.Tables)
	for _, t := range run.Tables {
		l := &snapLive{rows: t.Rows, estimate: t.Estimate}
		if t.Done {
			m.done++
			l.finished = time.Now()
		}
		m.live[t.Table] = l
	}
}

// chunkRead counts a read of chunk id of table, which starts at the table's
// first row when fromStart. Its debug line names the chunk as "snapshot
// chunk sent" does, never its keys: they are the table's data (a token's
// hash, an email address), which logs must not carry.
func (m *Manager) chunkRead(table string, estimate int64, id string, fromStart bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[table]
	if l == nil {
		l = &snapLive{estimate: estimate}
		m.live[table] = l
	}
	if l.started.IsZero() {
		l.started = time.Now()
	}
	l.chunkReads++
	m.log.Debug("snapshot chunk read", "table", table, "chunk", id, "from_start", fromStart, "reads", l.chunkReads)
}

func (m *Manager) emittedRows(table string, rows int64, done bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[table]
	if l == nil {
		return
	}
	l.rows += rows
	if done && l.finished.IsZero() {
		l.finished = time.Now()
		m.done++
		el := l.finished.Sub(l.started)
		m.log.Info("snapshot table read", "table", table, "rows", l.rows, "took", el.Round(time.Millisecond).String(),
			"rows_per_s", math.Round(rate(l.rows, el)))
	}
}

// rate returns rows per second over d; 0 when d is not positive.
func rate(rows int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(rows) / d.Seconds()
}

// snapFigures is one table's live progress.
type snapFigures struct {
	Table          string
	Rows, Estimate int64
	PerSecond      float64
	ETA            time.Duration // -1 when unknown
	Done           bool
	ChunkReads     int64
}

func (m *Manager) figures() (running bool, out []snapFigures) {
	if m == nil {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, l := range m.live {
		f := snapFigures{Table: name, Rows: l.rows, Estimate: l.estimate, Done: !l.finished.IsZero(), ETA: -1, ChunkReads: l.chunkReads}
		if !l.started.IsZero() {
			end := time.Now()
			if f.Done {
				end = l.finished
			}
			f.PerSecond = rate(l.rows, end.Sub(l.started))
			if f.Done {
				f.ETA = 0
			} else if f.PerSecond > 0 && l.estimate > l.rows {
				f.ETA = time.Duration(float64(l.estimate-l.rows) / f.PerSecond * float64(time.Second))
			}
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b snapFigures) int { return strings.Compare(a.Table, b.Table) })
	return m.runID != "", out
}

func (m *Manager) logProgress(log *slog.Logger) {
	running, figs := m.figures()
	if !running {
		return
	}
	for _, f := range figs {
		if f.Done || f.ChunkReads == 0 {
			continue
		}
		eta := "unknown"
		if f.ETA >= 0 {
			eta = f.ETA.Round(time.Second).String()
		}
		log.Info("snapshot progress", "table", f.Table, "rows", f.Rows, "estimate", f.Estimate,
			"rows_per_s", math.Round(f.PerSecond), "eta", eta)
	}
}
