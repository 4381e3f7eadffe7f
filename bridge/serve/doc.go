// Package serve is the feeds HTTP server of `bridge serve`: long-poll and
// server-sent events on GET /v1/feed over one bridge/feeds reader of the
// stream, GET /v1/position, /livez, /readyz and its own /metrics.
// docs/feeds.md documents the wire.
//
// Contract: a request's filter is ANDed with Config.Where and limited to
// Config.Tables; admission limits answer 503 (server) and 429 (client)
// with Retry-After; a client that falls MaxLag behind, or does not take an
// event within WriteTimeout, is disconnected and resumes with its token.
// The server holds no state a restart would lose: tokens are stream
// positions.
package serve
