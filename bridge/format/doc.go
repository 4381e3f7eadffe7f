// Package format encodes changes for the wire: the native encoding
// (AppendNative), the Debezium PostgreSQL connector's change event envelope
// (AppendDebezium) and CloudEvents 1.0 in structured JSON mode
// (AppendCloudEvent). Each is one JSON object per change, written
// append-style without reflection so that encoding a row costs no
// allocations beyond growing the destination.
// Lookup finds an encoder by a route's format name. Encoders keep nothing
// of the change or the buffer; docs/formats.md documents each format.
package format
