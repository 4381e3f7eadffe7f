// Package route decides where each change goes and what of it is
// published: the first route of bridge.yaml whose match takes the change
// (sources, tables, ops) and whose filter (CEL) accepts it shapes it
// (columns left out, values masked, a transform's payload), its
// WebAssembly filter (bridge/wasm) accepting the shaped change, gives it a
// subject (a text/template over subject-safe tokens), a payload (the
// route's format) and its sinks. Routes compile once (New: templates,
// expressions without the tables), and once per relation they see (the
// expressions and column rules against its columns and types); every
// mistake is reported naming its YAML path (routes[2].subject: ...,
// routes[2].filter:1:14: ...). CheckTables runs the per-relation checks
// against a catalog, for `bridge validate --connect`.
//
// Contract: Route sets c.Subject and c.Payload and returns the indexes of
// c's sinks (indexes into the sinkIndex given to New); ok is false when no
// route takes c and unrouted is drop, or when every route that matched c
// rejected it by its filter. A route that shapes c replaces c.Rel, c.Before
// and c.After with the published relation and new row slices (the
// source's are never written) and may set c.Headers to a map shared by
// the changes of a relation: copy it before adding a header. A trace
// context message is consumed (ok false) unless its route lists the
// message op. Router is safe for concurrent use. ControlDests says where a
// source's control messages go; they are never filtered or shaped.
package route
