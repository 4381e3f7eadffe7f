// Package plugins blank-imports every compiled-in source and sink, so that a
// binary gets the standard set with one import. A custom binary imports this
// package plus its own plugin packages (docs/custom-sinks.md).
package plugins

import (
	_ "github.com/bridgecdc/bridge/plugins/webhook"  // webhook
	_ "github.com/bridgecdc/bridge/sinks/natscore"   // nats_core
	_ "github.com/bridgecdc/bridge/sinks/natsjs"     // nats_jetstream
	_ "github.com/bridgecdc/bridge/sinks/natskv"     // nats_kv
	_ "github.com/bridgecdc/bridge/sinks/pluginsink" // plugin (out-of-process sinks)
	_ "github.com/bridgecdc/bridge/sources/pgoutput" // pgoutput
	_ "github.com/bridgecdc/bridge/sources/wal2json" // wal2json
)
