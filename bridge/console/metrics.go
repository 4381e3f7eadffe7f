package console

import (
	"math"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// What the console reads of the bridge's own /metrics registry at each
// request and sample: the figures the control plane's status does not
// carry (lag in seconds, checkpoint age, publish latency, errors,
// snapshot progress). Reading the registry, not the pipelines, keeps the
// console and /metrics (and the Grafana dashboard) showing the same
// numbers.

// figures are the metrics of one gather, by source.
type figures struct {
	src   map[string]*srcFigures
	sinks map[[2]string]*Histogram // publish latency by {source, sink}
	// writeErrs and dead are bridge_sink_write_errors_total and
	// bridge_sink_dead_letters_total by {source, sink}.
	writeErrs, dead map[[2]string]float64
	snaps           map[string]*Snapshot
}

type srcFigures struct {
	delivered     uint64
	lagSeconds    *float64
	checkpointAge *float64
	safeWAL       *float64
	errors        map[string]float64 // by kind
}

// Histogram is a sink's publish latency: cumulative counts per upper
// bound in seconds, as Prometheus keeps them, and the sum.
type Histogram struct {
	Buckets []Bucket `json:"buckets"`
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
}

// Bucket is one histogram bucket: the batches that took at most LE
// seconds.
type Bucket struct {
	LE    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// Snapshot is the progress of a source's current (or last) snapshot.
type Snapshot struct {
	Running         bool            `json:"running"`
	TablesRemaining int             `json:"tables_remaining"`
	Tables          []SnapshotTable `json:"tables"`
}

// SnapshotTable is one table of a snapshot: rows put into the stream,
// the planner's estimate when it started (0: none), the ETA in seconds
// (-1: unknown).
type SnapshotTable struct {
	Table      string  `json:"table"`
	Rows       float64 `json:"rows"`
	Estimate   float64 `json:"estimate"`
	RowsPerSec float64 `json:"rows_per_second"`
	ETASeconds float64 `json:"eta_seconds"`
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

// gather reads g; a failed gather returns what it could read.
func gather(g prometheus.Gatherer) figures {
	f := figures{src: map[string]*srcFigures{}, sinks: map[[2]string]*Histogram{}, snaps: map[string]*Snapshot{},
		writeErrs: map[[2]string]float64{}, dead: map[[2]string]float64{}}
	if g == nil {
		return f
	}
	mfs, _ := g.Gather()
	src := func(name string) *srcFigures {
		s := f.src[name]
		if s == nil {
			s = &srcFigures{errors: map[string]float64{}}
			f.src[name] = s
		}
		return s
	}
	snap := func(name string) *Snapshot {
		s := f.snaps[name]
		if s == nil {
			s = &Snapshot{}
			f.snaps[name] = s
		}
		return s
	}
	table := func(s *Snapshot, name string) *SnapshotTable {
		for i := range s.Tables {
			if s.Tables[i].Table == name {
				return &s.Tables[i]
			}
		}
		s.Tables = append(s.Tables, SnapshotTable{Table: name, ETASeconds: -1})
		return &s.Tables[len(s.Tables)-1]
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			source := label(m, "source")
			if source == "" {
				continue
			}
			v := value(m)
			switch mf.GetName() {
			case "bridge_changes_delivered_total":
				src(source).delivered = uint64(v)
			case "bridge_lag_seconds":
				src(source).lagSeconds = &v
			case "bridge_checkpoint_age_seconds":
				src(source).checkpointAge = &v
			case "bridge_slot_safe_wal_bytes":
				src(source).safeWAL = &v
			case "bridge_errors_total":
				src(source).errors[label(m, "kind")] += v
			case "bridge_sink_write_errors_total":
				f.writeErrs[[2]string{source, label(m, "sink")}] = v
			case "bridge_sink_dead_letters_total":
				f.dead[[2]string{source, label(m, "sink")}] = v
			case "bridge_publish_duration_seconds":
				h := m.GetHistogram()
				out := &Histogram{Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
				for _, b := range h.GetBucket() {
					out.Buckets = append(out.Buckets, Bucket{LE: b.GetUpperBound(), Count: b.GetCumulativeCount()})
				}
				f.sinks[[2]string{source, label(m, "sink")}] = out
			case "bridge_snapshot_running":
				snap(source).Running = v == 1
			case "bridge_snapshot_tables_remaining":
				snap(source).TablesRemaining = int(v)
			case "bridge_snapshot_rows":
				table(snap(source), label(m, "table")).Rows = v
			case "bridge_snapshot_rows_estimate":
				table(snap(source), label(m, "table")).Estimate = v
			case "bridge_snapshot_rows_per_second":
				table(snap(source), label(m, "table")).RowsPerSec = v
			case "bridge_snapshot_eta_seconds":
				table(snap(source), label(m, "table")).ETASeconds = v
			}
		}
	}
	for _, s := range f.snaps {
		slices.SortFunc(s.Tables, func(a, b SnapshotTable) int { return strings.Compare(a.Table, b.Table) })
	}
	return f
}
