// Command bridge streams committed PostgreSQL changes into NATS JetStream,
// exactly once and in commit order. See the README.
package main

import (
	"github.com/bridgecdc/bridge/bridge"
	_ "github.com/bridgecdc/bridge/plugins" // the compiled-in sources and sinks
)

func main() { bridge.Main() }
