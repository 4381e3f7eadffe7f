// Command acme-bridge is the bridge with the standard plugins plus Acme's
// own "acme_file" sink: a custom binary is a blank import per plugin
// package and a call to bridge.Main.
package main

import (
	"github.com/bridgecdc/bridge/bridge"
	_ "github.com/bridgecdc/bridge/plugins" // the standard sources and sinks

	_ "example.com/acme-bridge/filesink" // registers "acme_file"
)

func main() { bridge.Main() }
