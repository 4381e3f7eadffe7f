// Package natsjs is the "nats_jetstream" sink: it publishes every change to
// a JetStream stream, in order, exactly once.
//
// Each message carries the router's subject and payload, the change's own
// headers (W3C traceparent etc., keys as given) and the bridge's, what a
// consumer filters or groups on without parsing the payload: Nats-Msg-Id
// ("<producer>:<commit LSN, 16 hex>:<seq>", stable across restarts, so
// JetStream drops replays inside the duplicate window), Bridge-Op,
// Bridge-Table and Bridge-Tx-Size. Publishes are pipelined (max_pending
// messages in flight) and each is acked; a publish during a disconnect
// fails at once rather than being buffered and sent later behind a gap.
//
// Exactly-once beyond the duplicate window comes from sinks.Resumer: the
// pipeline checkpoints Cursor (the highest acked stream sequence) and, on
// restart, Delivered lists what the stream holds after it, headers only.
// Every publish carries a fence (expect_last_sequence, fence.go): the first
// of a Write Nats-Expected-Last-Sequence, chained from the tail Delivered
// read, the others Nats-Expected-Last-Msg-Id, the message published before
// them, so an instance that is no longer the owner (a zombie, or a killed
// one whose publishes the server is still applying) cannot store anything
// behind the owner's messages, nor anything behind a refused publish.
// With atomic_transactions, each transaction of 2 to 1000 changes is one
// JetStream atomic batch; larger ones go message by message.
// For production, run the stream with R3 and the server with
// `sync_interval: always`: a JetStream ack means written to the OS, fsynced
// every 2 minutes by default.
//
// Example (bridge.yaml):
//
//	sinks:
//	  main:
//	    type: nats_jetstream
//	    config:
//	      url: nats://nats-1:4222,nats://nats-2:4222   # default: the bridge's nats.url
//	      creds: /etc/bridge/bridge.creds               # or user/password, or token
//	      stream: CDC_SHOP                              # required
//	      subjects: ["cdc.shop.>"]                      # default ["cdc.>"]
//	      create_stream: true                           # create or update the stream
//	      duplicate_window: 2m
//	      replicas: 3
//	      max_pending: 4096                             # messages awaiting their ack
//	      ack_timeout: 10s
package natsjs
