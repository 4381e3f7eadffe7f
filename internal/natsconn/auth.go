package natsconn

import (
	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/sinks"
)

// AuthOptions turns a NATS setting's credentials into connection options.
func AuthOptions(ne sinks.NATSEnv) []nats.Option {
	var o []nats.Option
	if ne.Creds != "" {
		o = append(o, nats.UserCredentials(ne.Creds))
	}
	if ne.User != "" {
		o = append(o, nats.UserInfo(ne.User, ne.Password))
	}
	if ne.Token != "" {
		o = append(o, nats.Token(ne.Token))
	}
	return o
}
