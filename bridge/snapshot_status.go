package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SnapshotStatus is a source's snapshot state in `bridge status`: the same
// figures as the progress log lines and the bridge_snapshot_* metrics, from
// the checkpointed progress.
type SnapshotStatus struct {
	// Running is true while a snapshot is being read.
	Running bool   `json:"running"`
	ID      string `json:"id,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Tables of the running snapshot, or of the last one when none runs.
	Tables []SnapshotTableStatus `json:"tables"`
	// Queued is the number of requested snapshots waiting.
	Queued int `json:"queued"`
	// Last is the last finished snapshot's id, end and error.
	LastID       string     `json:"last_id,omitempty"`
	LastFinished *time.Time `json:"last_finished,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
}

// SnapshotTableStatus is one table's checkpointed snapshot progress.
type SnapshotTableStatus struct {
	Table    string  `json:"table"`
	Rows     int64   `json:"rows"`
	Estimate int64   `json:"estimate"`
	Done     bool    `json:"done"`
	RowsPerS float64 `json:"rows_per_second"`
	// ETASeconds is null when unknown.
	ETASeconds *float64 `json:"eta_seconds"`
}

func statusSnapshot(ctx context.Context, js jetstream.JetStream, bucket, bridgeName, source string) (*SnapshotStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint bucket %q: %w", bucket, err)
	}
	e, err := kv.Get(ctx, SnapshotKey(bridgeName, source))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading snapshot state %q: %w", SnapshotKey(bridgeName, source), err)
	}
	var st SnapshotState
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return nil, fmt.Errorf("decoding snapshot state %q: %w", SnapshotKey(bridgeName, source), err)
	}
	out := &SnapshotStatus{Queued: len(st.Queue), Tables: []SnapshotTableStatus{}}
	run := st.Current
	if run != nil {
		out.Running = true
	} else {
		run = st.Last
	}
	if st.Last != nil {
		out.LastID, out.LastFinished, out.LastError = st.Last.ID, st.Last.Finished, st.Last.Error
	}
	if run == nil {
		return out, nil
	}
	out.ID, out.Reason = run.ID, run.Reason
	for _, t := range run.Tables {
		ts := SnapshotTableStatus{Table: t.Table, Rows: t.Rows, Estimate: t.Estimate, Done: t.Done}
		if t.Started != nil {
			end := time.Now()
			if t.Finished != nil {
				end = *t.Finished
			}
			ts.RowsPerS = rate(t.Rows, end.Sub(*t.Started))
		}
		switch {
		case t.Done:
			z := 0.0
			ts.ETASeconds = &z
		case ts.RowsPerS > 0 && t.Estimate > t.Rows:
			eta := float64(t.Estimate-t.Rows) / ts.RowsPerS
			ts.ETASeconds = &eta
		}
		out.Tables = append(out.Tables, ts)
	}
	return out, nil
}

func printSnapshotStatus(w io.Writer, s *SnapshotStatus) {
	if s == nil {
		return
	}
	state := "none running"
	if s.Running {
		state = fmt.Sprintf("%s (%s) running", s.ID, s.Reason)
	} else if s.LastID != "" {
		state = fmt.Sprintf("last %s (%s) finished", s.LastID, s.Reason)
		if s.LastError != "" {
			state += ": " + s.LastError
		}
	}
	if s.Queued > 0 {
		state += fmt.Sprintf(", %d queued", s.Queued)
	}
	fmt.Fprintf(w, "  snapshot    %s\n", state)
	for _, t := range s.Tables {
		eta := "unknown"
		if t.ETASeconds != nil {
			eta = (time.Duration(*t.ETASeconds) * time.Second).String()
		}
		fmt.Fprintf(w, "    %s: %d/%d rows, %.0f rows/s, eta %s, done %t\n", t.Table, t.Rows, t.Estimate, t.RowsPerS, eta, t.Done)
	}
}
