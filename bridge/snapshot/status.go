package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Status is a source's snapshot state in `bridge status`: the same
// figures as the progress log lines and the bridge_snapshot_* metrics, from
// the checkpointed progress.
type Status struct {
	// Running is true while a snapshot is being read.
	Running bool   `json:"running"`
	ID      string `json:"id,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Tables of the running snapshot, or of the last one when none runs.
	Tables []TableStatus `json:"tables"`
	// Queued is the number of requested snapshots waiting.
	Queued int `json:"queued"`
	// Last is the last finished snapshot's id, end and error.
	LastID       string     `json:"last_id,omitempty"`
	LastFinished *time.Time `json:"last_finished,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	// LastOutcome is how the last snapshot ended: "complete", "failed"
	// (it stopped while reading) or "refused" (its request could not be
	// taken: a table that does not exist, is not streamed or has no key).
	LastOutcome string `json:"last_outcome,omitempty"`
}

// TableStatus is one table's checkpointed snapshot progress.
type TableStatus struct {
	Table    string  `json:"table"`
	Rows     int64   `json:"rows"`
	Estimate int64   `json:"estimate"`
	Done     bool    `json:"done"`
	RowsPerS float64 `json:"rows_per_second"`
	// ETASeconds is null when unknown.
	ETASeconds *float64 `json:"eta_seconds"`
}

// ReadStatus reads source's snapshot state from the checkpoint bucket as a
// Status; nil when the bucket or the state does not exist yet.
func ReadStatus(ctx context.Context, js jetstream.JetStream, bucket, bridgeName, source string) (*Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint bucket %q: %w", bucket, err)
	}
	e, err := kv.Get(ctx, Key(bridgeName, source))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading snapshot state %q: %w", Key(bridgeName, source), err)
	}
	var st State
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return nil, fmt.Errorf("decoding snapshot state %q: %w", Key(bridgeName, source), err)
	}
	out := &Status{Queued: len(st.Queue), Tables: []TableStatus{}}
	run := st.Current
	if run != nil {
		out.Running = true
	} else {
		run = st.Last
	}
	if st.Last != nil {
		out.LastID, out.LastFinished, out.LastError, out.LastOutcome = st.Last.ID, st.Last.Finished, st.Last.Error, st.Last.Outcome()
	}
	if run == nil {
		return out, nil
	}
	out.ID, out.Reason = run.ID, run.Reason
	for _, t := range run.Tables {
		ts := TableStatus{Table: t.Table, Rows: t.Rows, Estimate: t.Estimate, Done: t.Done}
		var eta time.Duration
		ts.RowsPerS, eta = t.Progress(time.Now())
		if eta >= 0 {
			secs := eta.Seconds()
			ts.ETASeconds = &secs
		}
		out.Tables = append(out.Tables, ts)
	}
	return out, nil
}
