// Command go-sink is the example sink plugin in Go: a file of JSON lines,
// once per change id (see package filesink). Build it, pin its sha256 and
// name it in bridge.yaml:
//
//	go build -o go-sink ./examples/plugins/go-sink
//	sha256sum go-sink
//	bridge plugin test ./go-sink --config '{"path": "/tmp/t.jsonl"}'
//
//	sinks:
//	  file:
//	    type: plugin
//	    config:
//	      command: /usr/local/lib/bridge/go-sink
//	      sha256: <the sum>
//	      config: { path: /var/lib/cdc/changes.jsonl }
package main

import (
	"github.com/bridgecdc/bridge/examples/plugins/go-sink/filesink"
	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
)

func main() {
	s := filesink.New()
	pluginv1.Serve(s, s)
}
