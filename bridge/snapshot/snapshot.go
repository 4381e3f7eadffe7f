package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/sources"
)

// ErrDone ends a run of a source whose snapshot.mode is
// initial_only once its snapshot is checkpointed; the pipeline then stops
// without error.
var ErrDone = errors.New("snapshot complete; snapshot.mode is initial_only, so the pipeline stops")

// State is what the checkpoint bucket keeps about a source's
// snapshots, under Key. Field names are stable (`nats kv get`).
type State struct {
	// InitialEpoch is the epoch whose automatic snapshot (modes initial,
	// initial_only, when_needed) was scheduled.
	InitialEpoch string `json:"initial_epoch,omitempty"`
	// Current is the snapshot running, if any.
	Current *Run `json:"current,omitempty"`
	// Queue holds requested snapshots waiting for Current to finish.
	Queue []Request `json:"queue,omitempty"`
	// Last is the last snapshot that finished or failed.
	Last *Run `json:"last,omitempty"`
	// Handled are the ids of the last requests taken from the bucket.
	Handled   []string  `json:"handled,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Request asks for a snapshot of tables ("schema.table"; empty:
// every table the source streams). `bridge snapshot` writes it under
// RequestKey.
type Request struct {
	ID     string   `json:"id"`
	Tables []string `json:"tables,omitempty"`
	// Where limits the rows read (sources.ParseWhere's syntax); "" reads
	// every row.
	Where  string    `json:"where,omitempty"`
	Reason string    `json:"reason"` // "initial" or "request"
	At     time.Time `json:"at"`
}

// Run is one snapshot and its durable progress.
type Run struct {
	ID       string     `json:"id"`
	Reason   string     `json:"reason"`
	Epoch    string     `json:"epoch"`
	Request  []string   `json:"request,omitempty"` // the tables asked for
	Where    string     `json:"where,omitempty"`   // the rows asked for (sources.ParseWhere)
	Resolved bool       `json:"resolved"`          // Tables holds the resolved tables
	Tables   []Table    `json:"tables"`
	Started  time.Time  `json:"started"`
	Finished *time.Time `json:"finished,omitempty"`
	Error    string     `json:"error,omitempty"`
	// ScanFrom are sink cursors (by sink name) at or before every stored
	// copy of a read whose key is past its table's After: where a restart
	// looks for the rows the sinks already hold. A sink without an entry
	// (or no ScanFrom at all) is read from its beginning.
	ScanFrom map[string]string `json:"scan_from"`
	// Tracked is true when the run records Table.Sent before each chunk
	// goes into the stream (every run this version resolves). A snapshot
	// without it keeps ScanFrom where it is until it completes.
	Tracked bool `json:"tracked,omitempty"`
}

// Table is one table's durable snapshot progress.
type Table struct {
	Table string   `json:"table"` // schema.table
	Key   []string `json:"key"`
	After []string `json:"after,omitempty"` // key (text) of the last checkpointed row
	// Sent is the key (text) of the last row of the furthest chunk any run
	// put into the stream, written before the chunk goes: no stored read of
	// the table has a key past it. A run that finds Sent past After reads
	// the rows up to Sent again first (sources.SnapshotTable.Until), and
	// keeps ScanFrom where it is until it has counted them.
	Sent     []string   `json:"sent,omitempty"`
	Rows     int64      `json:"rows"` // rows published and checkpointed
	Chunks   int64      `json:"chunks"`
	Estimate int64      `json:"estimate"`
	Done     bool       `json:"done"`
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
}

func (t Table) source() sources.SnapshotTable {
	s, n, _ := strings.Cut(t.Table, ".")
	return sources.SnapshotTable{Schema: s, Table: n, Key: t.Key, Estimate: t.Estimate}
}

// Outcome says how a finished run ended: "complete", "failed" (it stopped
// while reading) or "refused" (its request could not be taken).
func (r *Run) Outcome() string {
	switch {
	case r.Error == "":
		return "complete"
	case !r.Resolved:
		return "refused"
	}
	return "failed"
}

// Progress returns the table's rows per second from its start to now (or
// to its end), 0 before it started, and the time left at that rate: 0 when
// done, -1 when unknown.
func (t Table) Progress(now time.Time) (perSecond float64, eta time.Duration) {
	if t.Started != nil {
		end := now
		if t.Finished != nil {
			end = *t.Finished
		}
		perSecond = rate(t.Rows, end.Sub(*t.Started))
	}
	switch {
	case t.Done:
		return perSecond, 0
	case perSecond > 0 && t.Estimate > t.Rows:
		return perSecond, time.Duration(float64(t.Estimate-t.Rows) / perSecond * float64(time.Second))
	}
	return perSecond, -1
}

// Key returns the KV key of a source's snapshot state.
func Key(bridge, source string) string { return checkpoint.Key(bridge, source) + ".snapshot" }

// RequestKey returns the KV key of a snapshot request.
func RequestKey(bridge, source, id string) string {
	return checkpoint.Key(bridge, source) + ".snapreq." + id
}

// Manager is a pipeline's snapshot runtime; nil when the source cannot
// snapshot. Its methods are nil-safe.
type Manager struct {
	bridge, source string
	kv             jetstream.KeyValue
	opts           sources.SnapshotOptions
	log            *slog.Logger

	// Live figures for metrics and logs.
	mu    sync.Mutex
	live  map[string]*snapLive // by table
	runID string
	done  int // tables done in the current snapshot
	total int
}

// snapLive is what this process has emitted of one table.
type snapLive struct {
	rows, estimate int64
	started        time.Time
	finished       time.Time
	chunkReads     int64
}

func (m *Manager) key() string { return Key(m.bridge, m.source) }

// Load reads source's snapshot state from kv, the checkpoint bucket, and
// its revision (0: none yet). `bridge snapshot` follows a snapshot with it.
func Load(ctx context.Context, kv jetstream.KeyValue, bridge, source string) (State, uint64, error) {
	m := Manager{bridge: bridge, source: source, kv: kv}
	return m.load(ctx)
}

// load reads the state and its revision (0: none yet).
func (m *Manager) load(ctx context.Context) (State, uint64, error) {
	var st State
	e, err := m.kv.Get(ctx, m.key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, 0, nil
	}
	if err != nil {
		return st, 0, fmt.Errorf("loading snapshot state %q: %w", m.key(), err)
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("decoding snapshot state %q (revision %d): %w", m.key(), e.Revision(), err)
	}
	return st, e.Revision(), nil
}

// save writes st with compare-and-set at rev and returns the new revision.
func (m *Manager) save(ctx context.Context, st *State, rev uint64) (uint64, error) {
	st.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(st)
	if err != nil {
		return 0, err
	}
	var n uint64
	if rev == 0 {
		n, err = m.kv.Create(ctx, m.key(), b)
	} else {
		n, err = m.kv.Update(ctx, m.key(), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("saving snapshot state %q at revision %d: %w", m.key(), rev, checkpoint.ErrFenced)
	}
	if err != nil {
		return 0, fmt.Errorf("saving snapshot state %q: %w", m.key(), err)
	}
	return n, nil
}

func newRun(id, reason, epoch string, tables []string) *Run {
	return &Run{ID: id, Reason: reason, Epoch: epoch, Request: tables, Started: time.Now().UTC()}
}

// scheduleInitial records, before the first checkpoint of a new epoch is
// written, that the epoch's initial snapshot is due (modes initial,
// initial_only, when_needed), so a crash between the two cannot lose it.
func (m *Manager) ScheduleInitial(ctx context.Context, epoch string) error {
	if m == nil || m.opts.Mode == sources.SnapshotNever || m.opts.Mode == "" {
		return nil
	}
	st, rev, err := m.load(ctx)
	if err != nil {
		return err
	}
	if st.InitialEpoch == epoch {
		return nil
	}
	m.setInitial(&st, epoch)
	_, err = m.save(ctx, &st, rev)
	return err
}

// setInitial schedules the initial snapshot of epoch in st; a snapshot of
// an older epoch is dropped (its ids belong to the old producer).
func (m *Manager) setInitial(st *State, epoch string) {
	st.InitialEpoch = epoch
	r := newRun("i"+checkpoint.NewEpoch(), "initial", epoch, nil)
	if st.Current != nil && st.Current.Epoch != epoch {
		st.Current = nil
	}
	if st.Current == nil {
		st.Current = r
		return
	}
	st.Queue = append([]Request{{ID: r.ID, Reason: "initial", At: r.Started}}, st.Queue...)
}

// New returns the snapshot runtime of source, keeping its state in kv
// (the checkpoint bucket) under Key(bridge, source). Zero options take
// their defaults: chunks of 10,000 rows, requests polled every second,
// progress logged every 10 s.
func New(bridge, source string, kv jetstream.KeyValue, opts sources.SnapshotOptions, log *slog.Logger) *Manager {
	m := &Manager{bridge: bridge, source: source, kv: kv, opts: opts, log: log, live: map[string]*snapLive{}}
	if m.opts.ChunkSize <= 0 {
		m.opts.ChunkSize = 10000
	}
	if m.opts.Poll <= 0 {
		m.opts.Poll = time.Second
	}
	if m.opts.ProgressInterval <= 0 {
		m.opts.ProgressInterval = 10 * time.Second
	}
	return m
}
