package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Revision returns the configuration's revision: 12 hexadecimal digits of
// a SHA-256 over the decoded configuration (every key, defaults filled in,
// plugin blocks included), so that two texts configuring the same bridge
// (other comments, order or layout, a key set to its default) have the
// same revision and any change of a value gives another. The bridge
// records it with each checkpoint and reports it in `bridge status`; it
// reveals nothing of the values.
func (c *Config) Revision() string {
	b, err := json.Marshal(c)
	if err != nil {
		b = fmt.Appendf(nil, "%#v", *c)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}
