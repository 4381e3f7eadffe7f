// Package route decides where each change goes: the first route of
// bridge.yaml whose match takes the change (sources, tables, ops) gives it
// a subject (a text/template over subject-safe tokens), a payload (the
// route's format) and its sinks. Routes compile once (New), and every
// mistake a config can hold is reported then, each naming its YAML path
// (routes[2].subject: ...).
//
// Contract: Route sets c.Subject and c.Payload and returns the indexes of
// c's sinks (indexes into the sinkIndex given to New); ok is false when no
// route takes c and unrouted is drop. A trace context message is consumed
// (ok false) unless its route lists the message op. Router is safe for
// concurrent use. ControlDests says where a source's control messages go.
package route
