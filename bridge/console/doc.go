// Package console is the bridge's web console, served on the HTTP
// listener (http.listen) under /console/ when http.console is on: one
// page (plain HTML, CSS and JavaScript embedded in the binary, no build
// step) showing each source's state as the control plane reports it, its
// slot, lag, checkpoint age and throughput with sparklines of the last
// hour, each sink's deliveries, errors and publish latency, snapshots in
// progress, a live tail of the published changes over the feeds API, and
// the control plane's pause, resume and snapshot buttons.
//
// The console reads the bridge through the control plane's status model
// (control.StatusReply) and its metrics registry; it imports nothing of
// the data path. Its history is a ring of fixed size per source, sampled
// by Run.
package console
