// Package schema is the schema registry and the schema change events
// (docs/schemas.md).
//
// A table's shape is its columns as the source decodes them (name, Postgres
// type, OID, key flag, in table order) and its replica identity. Every
// shape a table takes is a Version, numbered from 1 per table, stored in a
// JetStream KV bucket under "<source>.<schema>.<table>.<version>" with a
// pointer "<source>.<schema>.<table>.latest". The Tracker sees every row
// change of a source in commit order before it is routed: when a table's
// shape differs from the version in effect it registers the next version
// (KV first) and returns it, so the pipeline publishes a schema change
// event before the change, and every change names the version it was
// written under (the Bridge-Schema-Version header).
//
// Versions are stable across restarts and replays: each records the
// producer (epoch) and the position (commit LSN, ordinal) of the first
// change under it. A replay that reaches that position again finds the
// version there and returns the same event, with the same message id
// (the change's id with the destination "~schema"), which the sinks
// deduplicate. The package imports the change model only, besides NATS.
package schema
