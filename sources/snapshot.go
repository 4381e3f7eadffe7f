package sources

import (
	"context"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Snapshot modes (Debezium's names). The source's config holds the mode; the
// runtime acts on it (docs/snapshots.md).
const (
	// SnapshotInitial snapshots every table at the first start (no
	// checkpoint yet), then streams.
	SnapshotInitial = "initial"
	// SnapshotNever never snapshots by itself; `bridge snapshot` still works.
	SnapshotNever = "never"
	// SnapshotInitialOnly snapshots at the first start, then stops the
	// pipeline once the snapshot is checkpointed.
	SnapshotInitialOnly = "initial_only"
	// SnapshotWhenNeeded snapshots at the first start and again whenever
	// the producer epoch changes (continuity was broken: slot recreated,
	// operator resync).
	SnapshotWhenNeeded = "when_needed"
)

// SnapshotPrefix is the logical decoding message prefix of the snapshot
// watermarks. The runtime asks sources to emit it (Env.MessagePrefixes) and
// removes these messages from the stream.
const SnapshotPrefix = "bridge.snapshot"

// SnapshotOptions are a source's snapshot settings, as its config block
// sets them.
type SnapshotOptions struct {
	// Mode is one of the Snapshot* modes.
	Mode string
	// ChunkSize is the number of rows read per chunk.
	ChunkSize int
	// ProgressInterval is how often progress is logged while a snapshot runs.
	ProgressInterval time.Duration
	// Poll is how often the runtime looks for `bridge snapshot` requests.
	Poll time.Duration
}

// SnapshotTable is a table a snapshot reads, in key order.
type SnapshotTable struct {
	Schema, Table string
	// Key are the columns the chunks are ordered and paged by: the primary
	// key, or the replica identity index.
	Key []string
	// Estimate is the planner's row estimate (pg_class.reltuples); 0 when
	// unknown.
	Estimate int64
	// Where limits the rows read to those matching every condition; only
	// a WhereChecker is given one.
	Where []Cond
	// Until, when set, bounds a chunk: no row whose key is after Until (text
	// values of Key, in the table's key order) is read. The runtime sets it
	// when it reads again the rows an earlier run put into the stream (up to
	// State's Sent), so that it knows when it has passed them.
	Until []string
}

// Name returns "schema.table".
func (t SnapshotTable) Name() string { return t.Schema + "." + t.Table }

// Chunk is one bounded read of a table between two watermarks.
type Chunk struct {
	// Rel describes the rows' columns; Key flags mark the chunk key.
	Rel *cdc.Relation
	// Rows are the rows in key order, values decoded as the stream decodes
	// them.
	Rows [][]any
	// Last is the text form of the last row's key columns, the After of the
	// next chunk; nil when Rows is empty.
	Last []string
	// Partial is true when the chunk ended before limit rows because its
	// rows reached the byte bound; more rows may follow.
	Partial bool
}

// Snapshotter is implemented by sources that can read their tables in
// chunks between watermarks (the DBLog algorithm). The runtime calls it from
// one goroutine while Read runs on another; it opens its own connection.
type Snapshotter interface {
	// SnapshotOptions returns the configured settings.
	SnapshotOptions() SnapshotOptions
	// SnapshotTables resolves names ("schema.table"; empty: every table the
	// source streams) to tables with their chunk keys. A table the source
	// does not stream, or without a primary key or replica identity index,
	// is an error naming it and the fix.
	SnapshotTables(ctx context.Context, names []string) ([]SnapshotTable, error)
	// ReadChunk emits a low watermark, reads up to limit rows of t whose key
	// is after after (text values; nil: from the start) and not after
	// t.Until (when set) in key order, then
	// emits a high watermark. Watermarks are transactional logical messages
	// (each in a transaction of its own, whose commit flushes the WAL so the
	// stream sees it at once) with SnapshotPrefix whose content is
	// WatermarkContent(kind, id).
	ReadChunk(ctx context.Context, t SnapshotTable, after []string, limit int, id string) (*Chunk, error)
}

// WatermarkContent is the content of a watermark message: kind is "low" or
// "high".
func WatermarkContent(kind, id string) string { return kind + ":" + id }
