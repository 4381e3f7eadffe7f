// Package sources holds the Source contract and the registry of source
// plugins. Implementations live in sub-packages and never import the runtime.
package sources

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/registry"
)

// Source streams whole committed transactions from one database.
//
// The pipeline calls Open once, then Read in a loop from one goroutine; Ack
// may be called concurrently with Read from another goroutine. Close is called
// once, after Read has returned for the last time.
type Source interface {
	// Open connects and starts streaming after from: transactions whose commit
	// end LSN is at or below from are not emitted. Zero means the slot's own
	// confirmed position. Open checks the server's setup and reports each
	// problem with its fix.
	Open(ctx context.Context, from cdc.LSN) error
	// Read returns the next whole committed transaction, in commit order. It
	// blocks until one is available or ctx ends. An error ends the run; the
	// pipeline may Open a new Source later.
	Read(ctx context.Context) (*cdc.Txn, error)
	// Ack reports that every transaction with commit end LSN ≤ upTo is
	// checkpointed; only such positions are reported to Postgres as flushed.
	Ack(ctx context.Context, upTo cdc.LSN) error
	// Close stops streaming and returns by ctx's deadline.
	Close(ctx context.Context) error
}

// Idler is implemented by sources that can move the checkpoint forward while
// no published table changes (DESIGN.md §4.5).
type Idler interface {
	// Idle returns a position the pipeline may checkpoint and Ack once every
	// transaction with commit end LSN ≤ after has been acked. ok is false when
	// the source knows of no such position.
	Idle() (safe, after cdc.LSN, ok bool)
}

// Buffered is implemented by sources that can tell how many transactions
// they hold decoded, ready for Read without blocking. The pipeline hands
// such transactions to its writer together, in one hand-off.
type Buffered interface {
	Buffered() int
}

// Checker is implemented by sources that can check their server's setup
// without changing anything, for `bridge validate --connect`.
type Checker interface {
	// Check connects and checks what Open checks and sets up at start
	// (what Open would create is reported as such, not created), and the
	// columns of req. It returns one config.Check per line, in the order
	// they should print; a failure to connect is a failed Check, not an
	// error. ctx bounds the whole check.
	Check(ctx context.Context, req CheckRequest) []config.Check
}

// CheckRequest is what the runtime asks a Checker to check besides the
// source's own setup.
type CheckRequest struct {
	// From is the checkpoint the next run would start after (0: none), so
	// the check judges a missing or lost slot as Open would.
	From cdc.LSN
	// Lineage is the lineage recorded with that checkpoint (zero: none),
	// so that a Lineaged source's check judges a failover as Open would.
	Lineage Lineage
	// Columns lists the columns the routes' subject templates read from
	// this source's tables.
	Columns []ColumnUse
	// Tables, when set, is called with the tables the source streams, as
	// its changes will describe them (columns in order, with their types
	// and key flags as the decoder sets them; columns the stream does not
	// carry left out), and the lines it returns are added to the
	// checklist: the runtime checks the routes' filters, columns, masks and
	// transforms against them.
	Tables func(rels []*cdc.Relation) []config.Check
}

// ColumnUse is the columns one route's subject template reads.
type ColumnUse struct {
	// Route names the route for messages: "routes[0].subject".
	Route string
	// Tables are the route's match.tables: path.Match globs over
	// "schema.table"; empty means every table.
	Tables []string
	// Skip are globs of tables earlier routes take (first match wins), so
	// that they never reach this one.
	Skip []string
	// Col and Key are the columns read as {{.Col.x}} and {{.Key.x}}.
	Col, Key []string
}

// Env is what the runtime gives a source factory.
type Env struct {
	// Name is the source's name in bridge.yaml.
	Name string
	// Logger is scoped to the source.
	Logger *slog.Logger
	// MessagePrefixes are logical message prefixes the runtime needs on top
	// of the configured ones (the trace context prefix, when tracing is on);
	// a source that can emit messages emits these too.
	MessagePrefixes []string
}

// Factory builds a source from its config block. It must not do network I/O.
type Factory func(decode config.Decoder, env Env) (Source, error)

// Plugin is a registered source type.
type Plugin struct {
	// New builds an instance.
	New Factory
	// Config is a zero or default config value; `bridge plugins` lists its keys.
	Config any
	// Doc is one line describing the plugin.
	Doc string
}

// Registry maps source types to plugins.
type Registry = registry.Registry[Plugin]

// NewRegistry returns an empty registry, for tests.
func NewRegistry() *Registry { return registry.New[Plugin]("source") }

// Default is the registry the compiled-in plugins register with from init.
var Default = NewRegistry()

// MustRegister registers p as typ in Default and panics on a duplicate; call
// it from init.
func MustRegister(typ string, p Plugin) {
	if err := Default.Register(typ, p); err != nil {
		panic(err)
	}
}

// SetupError is a problem with the database's setup found by a source, with
// the fix when it is known (SQL to paste, a package to install). The runtime
// stops instead of retrying.
type SetupError struct {
	What string // the problem, naming the object
	Fix  string // SQL or a command; may be empty
}

func (e *SetupError) Error() string {
	if e.Fix == "" {
		return e.What
	}
	return e.What + "; fix: " + e.Fix
}

// IsSetup reports whether err is or wraps a *SetupError.
func IsSetup(err error) bool {
	var se *SetupError
	return errors.As(err, &se)
}

// SlotLostError reports that the replication slot a checkpoint depends on is
// gone (dropped) or invalidated (wal_status = lost), and that the source's
// policy is to recreate it (on_slot_lost: recreate). The source has already
// dropped an invalidated slot; its next Open with from = 0 creates a new
// one. The runtime starts a new epoch and publishes a resync control message
// before any change of that epoch. With the fail policy the source returns a
// *SetupError instead.
type SlotLostError struct {
	Slot, Database string
	// Reason is "slot_missing", "slot_invalidated" or "failover" (the
	// server failed over to one whose history lacks part of the stream, or
	// whose slot is missing after a failover).
	Reason string
	// Checkpoint is the position the stream had reached; WALEnd the
	// server's WAL end when the loss was found: the new slot starts at or
	// after it, and the changes in between are not in the stream.
	Checkpoint, WALEnd cdc.LSN
	// Detail says what happened, for the log (a failover: which
	// timelines, where they forked); may be empty.
	Detail string
	// Keep is true when the slot is still there and the new epoch streams
	// from its confirmed position (a failover whose slot survived on the
	// new primary but behind the stream's end); false when Open creates a
	// new slot.
	Keep bool
}

func (e *SlotLostError) Error() string {
	s := "replication slot " + e.Slot + " of database " + e.Database + " is lost (" + e.Reason + ") after checkpoint " +
		e.Checkpoint.String()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Keep {
		return s + "; streaming again from the slot's confirmed position under a new epoch (on_slot_lost: recreate)"
	}
	return s + "; recreating it under a new epoch (on_slot_lost: recreate)"
}

// SlotReader identifies the reader holding a slot: for Postgres, the
// walsender's process id and when that process started (pg_stat_activity's
// backend_start), which together name one process over time where a PID
// alone may be reused. Started is zero when the role may not see it.
type SlotReader struct {
	PID     int
	Started time.Time
}

// Same reports whether r and o name the same process: the same PID, and the
// same start time when both know it.
func (r SlotReader) Same(o SlotReader) bool {
	if r.PID == 0 || r.PID != o.PID {
		return false
	}
	return r.Started.IsZero() || o.Started.IsZero() || r.Started.Equal(o.Started)
}

// SlotBusyError reports that Open found the source's slot held by another
// reader (Postgres: SQLSTATE 55006, "replication slot … is active for PID
// n"): another bridge streams from it, or a walsender that has not noticed
// that its client stopped. The runtime retries; that is how a standby
// waits. It wraps the server's error.
type SlotBusyError struct {
	Slot, Database string
	// Holder is the reader holding the slot; zero when it could not be read
	// (it let the slot go meanwhile).
	Holder SlotReader
	Err    error
}

func (e *SlotBusyError) Error() string { return e.Err.Error() }
func (e *SlotBusyError) Unwrap() error { return e.Err }

// ErrEvictDenied is wrapped by an Evicter's error when the database refused
// to end the reader for lack of a privilege; the error's message names the
// privilege to grant.
var ErrEvictDenied = errors.New("the database refused to end the slot's reader")

// Evicter is implemented by sources whose slot admits one reader at a time
// and that can end the reader holding it, so that a new owner of the
// source need not wait until a stalled one is dropped by the server
// (Postgres: wal_sender_timeout, 60 s by default). The runtime alone
// decides when a holder is stale (a fleet member holding the source's
// lease; a holder whose heartbeat stopped); ending a live owner is safe
// for the data (the checkpoint's compare-and-set and the sinks' fences
// refuse its writes) but costs a restart.
type Evicter interface {
	// Reader returns this source's own reader while it is open (after Open
	// succeeded), as another instance's SlotBusyError would name it; zero
	// before.
	Reader() SlotReader
	// Evict ends the reader holder if it still holds the source's slot,
	// and returns once the slot is no longer held by it, or when ctx ends.
	// It opens a connection of its own, so it may be called on a source
	// whose Open failed with a *SlotBusyError (and which is closed). nil
	// also when holder had let the slot go already. A refusal for lack of
	// privilege wraps ErrEvictDenied.
	Evict(ctx context.Context, holder SlotReader) error
}

// Lineage is the history a stream position belongs to: the database
// system (Postgres: system_identifier) and the timeline of its WAL, which
// a promotion or a point-in-time recovery changes. Standby is true when
// the position was read from a server in recovery (decoding on a
// standby), whose own promotion continues the same history.
type Lineage struct {
	SystemID string
	Timeline uint32
	Standby  bool
}

// Lineaged is implemented by sources whose server may be replaced by
// another that lacks part of the stream: a failover to a standby that
// had not received everything, a restore. The runtime records the
// lineage with every checkpoint, and before each Open tells the source
// the recorded one, so that Open never streams on from a point the
// server's history does not contain: Postgres would skip every commit of
// the new history below it, without a word.
type Lineaged interface {
	// Expect is called before Open with the lineage recorded with the
	// checkpoint (zero: none recorded) and the end of the stream: the
	// highest commit position the sinks hold, at or past the checkpoint.
	// When the server's history left that lineage before end (its
	// timeline forked off earlier, or it is another system), Open fails:
	// with a *SetupError naming the failover under on_slot_lost: fail,
	// with a *SlotLostError (Reason "failover") under recreate.
	Expect(l Lineage, end cdc.LSN)
	// Lineage returns the server's lineage; valid after Open succeeded.
	Lineage() Lineage
}
