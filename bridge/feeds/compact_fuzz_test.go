package feeds

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzCompactJSON checks compactJSON on any bytes: nothing below 0x20 is
// left, and valid JSON stays valid with the same value.
func FuzzCompactJSON(f *testing.F) {
	for _, s := range []string{"{\"a\":\n\n1}", "[1,\r2]", "\"a\\\nb\"", "\"\t\"", "{\"a\" : \"b c\"}", "\x00\n\r"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := compactJSON(b)
		if hasControl(out) {
			t.Fatalf("compactJSON(%q) = %q holds a byte below 0x20", b, out)
		}
		if !json.Valid(b) {
			return
		}
		var x, y any
		if err := json.Unmarshal(out, &y); err != nil {
			t.Fatalf("compactJSON(%q) = %q: not valid JSON: %v", b, out, err)
		}
		_ = json.Unmarshal(b, &x)
		require.Equal(t, x, y)
	})
}
