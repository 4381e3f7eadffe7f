package format

import (
	"slices"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// Encoder appends the encoding of c to dst and returns the extended slice.
// It must not keep dst or c.
type Encoder func(dst []byte, c *cdc.Change) []byte

// Lookup returns the encoder of a route's format name (native, debezium,
// cloudevents).
func Lookup(name string) (Encoder, bool) {
	switch name {
	case "native":
		return AppendNative, true
	case "debezium":
		return AppendDebezium, true
	case "cloudevents":
		return AppendCloudEvent, true
	}
	return nil, false
}

// Names returns the format names Lookup knows, sorted.
func Names() []string {
	n := []string{"native", "debezium", "cloudevents"}
	slices.Sort(n)
	return n
}
