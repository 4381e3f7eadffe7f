package natskv_test

import (
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sinks/natskv"
)

// validKey is what a JetStream KV key may be (nats.go's check).
var validKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

// TestRowKeyProperty: for random schemas, tables and composite keys whose
// values are rich in the bytes that must be escaped, every key is a valid
// KV key, ParseKey gives back exactly what made it, and distinct rows
// never share a key (nor a row a table's own key).
func TestRowKeyProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	alphabet := []string{"", "a", "Z", "0", "_", "-", ".", "=", "=2E", "/", " ", "ü", "日", "\x00", "\xff", "*", ">", "3D"}
	text := func() string {
		var b strings.Builder
		for range r.IntN(5) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	seen := map[string]string{}
	for n := range 30000 {
		prefix := ""
		if n%3 == 0 {
			prefix = "shop.v1"
		}
		schema, table := text(), text()
		vals := make([]string, 1+r.IntN(3))
		for i := range vals {
			vals[i] = text()
		}
		row := strings.Join(append([]string{prefix, schema, table}, vals...), "\x00|")
		key := natskv.RowKey(prefix, schema, table, vals...)
		require.True(t, validKey.MatchString(key), "RowKey(%q) = %q is not a valid KV key", row, key)
		require.False(t, strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") || strings.Contains(key, ".."), "%q", key)
		if prev, ok := seen[key]; ok && prev != row {
			t.Fatalf("%q and %q share the key %q", prev, row, key)
		}
		seen[key] = row
		s, tb, got, err := natskv.ParseKey(key, prefix)
		require.NoError(t, err, key)
		require.Equal(t, []string{schema, table}, []string{s, tb}, key)
		require.Equal(t, vals, got, key)

		tk := natskv.TableKey(prefix, schema, table)
		require.True(t, strings.HasPrefix(key, tk+"."), "%q is not under its table's key %q", key, tk)
		_, _, none, err := natskv.ParseKey(tk, prefix)
		require.NoError(t, err)
		require.Empty(t, none, "a table's key has no values, so it is never a row's")
	}
}

func TestValueText(t *testing.T) {
	at := time.Date(2024, 2, 29, 7, 4, 56, 789000000, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		v    any
		want string
	}{
		{"ada", "ada"},
		{int64(-42), "-42"},
		{true, "true"},
		{cdc.Numeric("42.50"), "42.50"},
		{1.5, "1.5"},
		{1e21, "1e+21"},
		{math.NaN(), "NaN"},
		{math.Inf(-1), "-Infinity"},
		{[]byte{0xde, 0xad}, "3q0="},
		{cdc.RawJSON(`{"a":1}`), `{"a":1}`},
		{at, "2024-02-29T06:04:56.789Z"},
		{cdc.Timestamp{Time: time.Date(2024, 2, 29, 7, 4, 56, 0, time.UTC)}, "2024-02-29T07:04:56"},
		{cdc.Date{Time: time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)}, "2024-02-29"},
		{cdc.Infinity(-1), "-infinity"},
		{[]any{int64(1), "a\"b", nil, []any{true}}, `[1,"a\"b",null,[true]]`},
		{"550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000"},
	} {
		require.Equal(t, tc.want, natskv.ValueText(tc.v), "%#v", tc.v)
	}
}
