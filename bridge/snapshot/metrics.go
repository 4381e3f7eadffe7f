package snapshot

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector reports the sources' snapshot progress at scrape time: the
// figures the progress log lines and `bridge snapshot` show. An App
// registers one.
type Collector struct {
	mu   sync.Mutex
	mgrs []*Manager
}

// Add reports m's snapshots.
func (c *Collector) Add(m *Manager) {
	c.mu.Lock()
	c.mgrs = append(c.mgrs, m)
	c.mu.Unlock()
}

// Remove stops reporting m's snapshots (its source was removed or rebuilt).
func (c *Collector) Remove(m *Manager) {
	c.mu.Lock()
	c.mgrs = slices.DeleteFunc(c.mgrs, func(x *Manager) bool { return x == m })
	c.mu.Unlock()
}

var (
	descSnapRunning = prometheus.NewDesc("bridge_snapshot_running",
		"1 while a snapshot of the source is being read, else 0.", []string{"source"}, nil)
	descSnapRemaining = prometheus.NewDesc("bridge_snapshot_tables_remaining",
		"Tables of the current snapshot not read to the end yet.", []string{"source"}, nil)
	descSnapRows = prometheus.NewDesc("bridge_snapshot_rows",
		"Rows of the current (or last) snapshot put into the stream, by table; checkpointed progress plus what this process read since.", []string{"source", "table"}, nil)
	descSnapEstimate = prometheus.NewDesc("bridge_snapshot_rows_estimate",
		"The planner's row estimate of the table (pg_class.reltuples) when its snapshot started.", []string{"source", "table"}, nil)
	descSnapRate = prometheus.NewDesc("bridge_snapshot_rows_per_second",
		"Rows per second read into the stream by this process for the table's snapshot.", []string{"source", "table"}, nil)
	descSnapETA = prometheus.NewDesc("bridge_snapshot_eta_seconds",
		"Estimated seconds until the table's snapshot is read; 0 when done, -1 when unknown.", []string{"source", "table"}, nil)
	descSnapChunks = prometheus.NewDesc("bridge_snapshot_chunk_reads_total",
		"Chunk reads (SELECTs between watermarks) by this process, by table.", []string{"source", "table"}, nil)
)

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSnapRunning, descSnapRemaining, descSnapRows, descSnapEstimate, descSnapRate, descSnapETA, descSnapChunks} {
		ch <- d
	}
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	mgrs := append([]*Manager(nil), c.mgrs...)
	c.mu.Unlock()
	for _, m := range mgrs {
		collectSnap(ch, m)
	}
}

func collectSnap(ch chan<- prometheus.Metric, m *Manager) {
	running, figs := m.figures()
	src := m.source
	r, remaining := 0.0, 0.0
	if running {
		r = 1
		for _, f := range figs {
			if !f.Done {
				remaining++
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descSnapRunning, prometheus.GaugeValue, r, src)
	ch <- prometheus.MustNewConstMetric(descSnapRemaining, prometheus.GaugeValue, remaining, src)
	for _, f := range figs {
		ch <- prometheus.MustNewConstMetric(descSnapRows, prometheus.GaugeValue, float64(f.Rows), src, f.Table)
		ch <- prometheus.MustNewConstMetric(descSnapEstimate, prometheus.GaugeValue, float64(f.Estimate), src, f.Table)
		ch <- prometheus.MustNewConstMetric(descSnapRate, prometheus.GaugeValue, f.PerSecond, src, f.Table)
		eta := f.ETA.Seconds()
		if f.ETA < 0 {
			eta = -1
		}
		ch <- prometheus.MustNewConstMetric(descSnapETA, prometheus.GaugeValue, eta, src, f.Table)
		ch <- prometheus.MustNewConstMetric(descSnapChunks, prometheus.CounterValue, float64(f.ChunkReads), src, f.Table)
	}
}
