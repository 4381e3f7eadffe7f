package pluginv1

import (
	"context"
	"math"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// The handshake. ProtocolVersion is this contract's major version: the
// bridge offers every major it speaks (go-plugin's PLUGIN_PROTOCOL_VERSIONS)
// and the plugin answers with the one it serves, on its first stdout line
// ("1|<major>|tcp|127.0.0.1:1234|grpc" or "...|unix|/path|grpc"). A plugin
// refuses to start without the magic cookie in its environment: it is run
// by the bridge, not by hand.
const (
	// ProtocolVersion is the major version of the contract in this package.
	ProtocolVersion = 1
	// ContractMinor is the minor version of sink.proto in this package; a
	// plugin reports the one it was built against in
	// DescribeResponse.contract_minor.
	ContractMinor = 1
	// MagicCookieKey and MagicCookieValue are the environment variable the
	// bridge sets for its plugins and its value.
	MagicCookieKey   = "BRIDGE_PLUGIN_MAGIC_COOKIE"
	MagicCookieValue = "bridge-sink-plugin-7c5f1e2a"
	// PluginName is the name of the sink in go-plugin's plugin set.
	PluginName = "sink"
)

// Handshake is go-plugin's handshake configuration for bridge plugins.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   MagicCookieKey,
	MagicCookieValue: MagicCookieValue,
}

// GRPCPlugin binds the contract to go-plugin: a plugin serves Sink (and
// Conformance, when set) with it; the bridge dispenses *Clients from it.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	// Sink and Conformance are the plugin's servers; nil on the bridge's
	// side. Conformance is optional.
	Sink        SinkServer
	Conformance ConformanceServer
}

// Clients is what the bridge's side of GRPCPlugin dispenses.
type Clients struct {
	Sink        SinkClient
	Conformance ConformanceClient
}

// GRPCServer registers the plugin's servers.
func (p *GRPCPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	RegisterSinkServer(s, p.Sink)
	if p.Conformance != nil {
		RegisterConformanceServer(s, p.Conformance)
	}
	return nil
}

// GRPCClient returns the bridge's clients of the plugin's servers.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Clients{Sink: NewSinkClient(c), Conformance: NewConformanceClient(c)}, nil
}

// Serve runs a sink plugin written in Go: call it from main. It performs
// the handshake on stdout and serves until the bridge stops the process.
// conformance may be nil.
func Serve(sink SinkServer, conformance ConformanceServer) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			ProtocolVersion: {PluginName: &GRPCPlugin{Sink: sink, Conformance: conformance}},
		},
		GRPCServer: server,
	})
}

// server is go-plugin's gRPC server without gRPC's default 4 MiB limit on
// what it receives: the bridge sends whole batches, and a change may be
// large.
func server(opts []grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(math.MaxInt32))...)
}

// ServeVersion is Serve for a given protocol major, for tests of the
// handshake (a plugin built against another major).
func ServeVersion(major int, sink SinkServer, conformance ConformanceServer) {
	hs := Handshake
	hs.ProtocolVersion = uint(major)
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: hs,
		VersionedPlugins: map[int]goplugin.PluginSet{
			major: {PluginName: &GRPCPlugin{Sink: sink, Conformance: conformance}},
		},
		GRPCServer: server,
	})
}
