// Package buildinfo tells which version of the bridge is running.
package buildinfo

import "runtime/debug"

// Version is set at build time:
//
//	go build -ldflags "-X github.com/bridgecdc/bridge/internal/buildinfo.Version=v1.2.3" ./cmd/bridge
//
// The linker writes it; nothing else does.
var Version = ""

// String returns Version, else the module version recorded in the binary
// (go install ...@v1.2.3), else "dev".
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
