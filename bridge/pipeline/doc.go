// Package pipeline streams one source into its sinks, exactly once and in
// commit order (DESIGN.md §4):
//
//	source.Read → route → batches → sink.Write → marks → checkpoint.Save → source.Ack
//
// Run loops over runs (runOnce in pipeline.go); each run:
//
//  1. loads the checkpoint (a new epoch on first start), connects the
//     sinks and asks each what it already holds past the checkpoint
//     (sinks.Resumer), so nothing is sent twice, even past JetStream's
//     duplicate window;
//  2. opens the source at the checkpoint (takeover.go: a slot held by a
//     stale former owner's walsender, as a fleet's lease or the owner's
//     heartbeat tells, is taken over at once); a reader goroutine routes whole
//     transactions (route.go) and hands them to the writer in parts of at
//     most about 1,000 changes, bounded by a semaphore on changes;
//  3. the writer (write.go) cuts batches by max_changes/max_wait, writes
//     each to its sinks in order and publishes a mark once a whole
//     transaction is written everywhere;
//  4. a checkpointer saves the latest mark every checkpoint.interval with
//     compare-and-set (a refusal means another instance took over: stop),
//     and only then acks the position to Postgres (confirm.go).
//
// A transient failure ends the run; the next run starts from the checkpoint
// after a backoff (bridge/retry). A fatal one (a fenced checkpoint, a
// permanent sink error, a setup error, a deleted bucket) stops the pipeline
// with the error; a change the router cannot route stops it at its
// transaction, after the writer wrote what was routed before. control.go
// handles the breaks of continuity (a lost slot, an operator's resync) with
// a resync control message under a new epoch.
//
// ops.go holds the operator's controls, each taking effect at a
// transaction boundary (the reader stops between two transactions, the
// writer writes what it was handed, the last checkpoint covers it): Pause
// and Resume (the order kept in the checkpoint bucket, which every
// instance follows), Drain (Run returns: a reload rebuilds the pipeline,
// or another process takes the source over from the checkpoint left),
// ResyncOnline, and SetRouter, which the reader takes before the next
// transaction. Status reports the state (streaming, paused, standby...),
// the last error and the configuration revision, which each checkpoint
// records.
//
// The pipeline knows nothing of OpenTelemetry or Prometheus: an Observer
// (bridge/telemetry's Pipe) is told what it routes, delivers and writes.
package pipeline
