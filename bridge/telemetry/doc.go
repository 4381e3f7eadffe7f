// Package telemetry observes pipelines: traces and Prometheus metrics
// (DESIGN.md §6). It never changes what is delivered, only the trace context
// in the changes' headers.
//
// Traces: a span per transaction, a child span per change, the change
// span's context in the change's headers so the NATS message carries it,
// and the writer's own trace context taken from a logical message in the
// transaction. Span lifetimes: the transaction span and its change spans
// start when the pipeline's reader routes the transaction (Pipe.Routed). A
// change span ends when the writer has written the batch holding the change
// to every sink (Pipe.Delivered); the transaction span ends when its last
// change is delivered. Spans of changes a run did not deliver end with an
// error status when the run ends (Pipe.RunEnded); the next run replays
// those changes under new spans.
//
// Metrics: every Metrics has its own Prometheus registry; nothing is
// registered globally. A Pipe is one pipeline's observer and the figures
// that /metrics and /readyz read of it.
package telemetry
