// Package natscore is the "nats_core" sink: it publishes every change to
// core NATS, in order, at most once. Use it for live feeds (dashboards,
// cache invalidation) where a lost message is acceptable; use
// nats_jetstream for exactly-once delivery.
//
// Each message carries the router's subject and payload, the change's own
// headers (W3C traceparent etc., keys as given; "Nats-*" ones dropped) and
// the bridge's, the same as nats_jetstream's: Nats-Msg-Id
// ("<producer>:<commit LSN, 16 hex>:<seq>", so a consumer can drop
// duplicates itself), Bridge-Op, Bridge-Table and Bridge-Tx-Size. A Write publishes the
// batch, then flushes once (a round trip to the server): nil means the
// server has received every message, not that any subscriber has.
//
// At most once: the sink implements sinks.AtMostOnce, so the pipeline never
// holds back the checkpoint for it, and a failed batch is logged and
// dropped rather than retried until it succeeds. Core NATS keeps nothing:
// a subscriber that is disconnected, slow or not yet subscribed misses
// messages; a crash, a reconnect or a retry may lose messages or deliver
// them twice (same Nats-Msg-Id). A publish while the connection is down
// fails at once instead of being buffered and sent later behind a gap.
//
// Example (bridge.yaml):
//
//	sinks:
//	  live:
//	    type: nats_core
//	    config:
//	      url: nats://nats-1:4222,nats://nats-2:4222   # default: the bridge's nats.url
//	      creds: /etc/bridge/bridge.creds               # or user/password, or token
//	      flush_timeout: 2s                             # bound on each batch's flush
package natscore
