// Package pluginv1 is version 1 of the contract between the bridge and an
// out-of-process sink plugin (sink type "plugin"): sink.proto, the Go code
// protoc generates from it (scripts/protogen.sh regenerates it and, with
// --check, fails when it is not current), and the go-plugin handshake
// (plugin.go). A sink plugin in Go implements SinkServer (and, to be
// checked by `bridge plugin test`, ConformanceServer) and calls Serve from
// main; examples/plugins/go-sink is one. Plugins in other languages serve
// the same gRPC services and print go-plugin's handshake line
// (docs/plugins.md).
package pluginv1
