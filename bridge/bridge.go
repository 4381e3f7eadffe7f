// Package bridge is the entry point of bridge binaries: Main runs the
// command line. A custom binary blank-imports its plugins and calls Main:
//
//	import (
//		"github.com/bridgecdc/bridge/bridge"
//		_ "github.com/bridgecdc/bridge/plugins" // the standard sources and sinks
//		_ "example.com/acme/kafkasink"          // registers "acme_kafka" in its init
//	)
//
//	func main() { bridge.Main() }
//
// The runtime lives in the packages below this one; ARCHITECTURE.md at the
// repository root maps them and follows one change through them.
package bridge

import (
	"io"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cli"
)

// Main runs the bridge command line with os.Args and exits with its
// status: 0 on success, 1 on errors (including every validation error), 2
// on usage errors. It first tunes the Go runtime's memory settings
// (cli.TuneRuntime). opts change how the App is built, e.g. app.WithSinks.
func Main(opts ...app.Option) { cli.Main(opts...) }

// Execute runs the command line with args and returns the exit status,
// without tuning the runtime or exiting.
func Execute(args []string, stdout, stderr io.Writer, opts ...app.Option) int {
	return cli.Execute(args, stdout, stderr, opts...)
}
