// Package natskv is the "nats_kv" sink: it mirrors rows into a JetStream
// KV bucket, each row under
//
//	[<key_prefix>.]<schema>.<table>.<key value>[.<key value>...]
//
// (key.go: one token per key column, escaped by internal/kvkey), holding
// the payload of the row's latest change as the route's format rendered
// it, with the change's headers and the bridge's (Bridge-Id, -Producer,
// -Commit-Lsn, -Seq, -Tx-Size, -Xid, -Table, -Op). Consumers Get one row
// or Watch a table ("public.orders.>").
//
// Inserts, updates and snapshot reads put the row's value; an update that
// changes the key also deletes the old key. Deletes write a KV delete
// marker, or a purge marker with delete: purge; the marker carries the
// delete's payload. A TRUNCATE purges the table's keys with one
// subject-filtered purge and records itself under the table's own key
// (truncate.go). Logical decoding messages and control messages are not
// rows and are not written.
//
// Exactly once in effect: a Write folds each run of changes between
// TRUNCATEs into one write per key, of the key's last change, and guards
// every write (guard.go): the value in the bucket carries its change's
// producer and position, a change is skipped where the key holds the same
// position of its producer or a later one, and otherwise written with
// Nats-Expected-Last-Subject-Sequence set to the sequence read, so the
// server refuses it if the key changed since. Commit order wins whatever
// a crash, a restart from an older checkpoint, a retried Write or a
// concurrent instance sends again, without a sinks.Resumer: the pipeline
// replays into the sink from its checkpoint and the guard drops what the
// bucket holds already.
//
// Example (bridge.yaml):
//
//	sinks:
//	  rows:
//	    type: nats_kv
//	    config:
//	      bucket: shop_rows     # required
//	      history: 1            # values kept per key (1-64)
//	      delete: delete        # or purge
//	routes:
//	  - match: { tables: ["public.*"] }
//	    sinks: [rows]           # the route's subject is not used by nats_kv
package natskv
