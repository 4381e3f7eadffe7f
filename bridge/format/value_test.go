package format

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

type stringer struct{}

func (stringer) String() string { return `a "stringer"` }

func TestAppendValue(t *testing.T) {
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"null", nil, `null`},
		{"true", true, `true`},
		{"false", false, `false`},
		{"int64", int64(-9223372036854775808), `-9223372036854775808`},
		{"int64 max", int64(math.MaxInt64), `9223372036854775807`},
		{"int", 42, `42`},
		{"uint32", uint32(4294967295), `4294967295`},
		{"float", 0.1, `0.1`},
		{"float whole", 1e6, `1000000`},
		{"float big", 1e21, `1e+21`},
		{"float below 1e20", 1e20, `100000000000000000000`},
		{"float small", 1e-7, `1e-7`},
		{"float tiny", 5e-324, `5e-324`},
		{"float negative zero", math.Copysign(0, -1), `-0`},
		{"float NaN", math.NaN(), `"NaN"`},
		{"float +Inf", math.Inf(1), `"Infinity"`},
		{"float -Inf", math.Inf(-1), `"-Infinity"`},
		{"float32", float32(1.1), `1.1`},
		{"numeric", cdc.Numeric("-12.500"), `-12.500`},
		{"numeric 40 digits", cdc.Numeric("1234567890123456789012345678901234567890"), `1234567890123456789012345678901234567890`},
		{"numeric tiny", cdc.Numeric("0.0000000000000000000000000000000000001234"), `0.0000000000000000000000000000000000001234`},
		{"numeric NaN", cdc.Numeric("NaN"), `"NaN"`},
		{"numeric Infinity", cdc.Numeric("Infinity"), `"Infinity"`},
		{"numeric -Infinity", cdc.Numeric("-Infinity"), `"-Infinity"`},
		{"numeric not a JSON number", cdc.Numeric("01.5"), `"01.5"`},
		{"numeric empty", cdc.Numeric(""), `""`},
		{"string", "héllo 🎉", `"héllo 🎉"`},
		{"string escapes", "q\" b\\ n\n r\r t\t b\b f\f nul\x00 us\x1f del\x7f", `"q\" b\\ n\n r\r t\t b\b f\f nul\u0000 us\u001f del` + "\x7f" + `"`},
		{"string separators", "a\u2028b\u2029c", `"a\u2028b\u2029c"`},
		{"string html kept", "<a>&</a>", `"<a>&</a>"`},
		{"string invalid utf-8", "a\xffb\xc3", `"a\ufffdb\ufffd"`},
		{"string surrogate bytes", "\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`},
		{"bytes", []byte{0, 0xff, 0x10}, `"AP8Q"`},
		{"bytes empty", []byte{}, `""`},
		{"json", cdc.RawJSON(`{"a": [1, 2.50]}`), `{"a": [1, 2.50]}`},
		{"json empty", cdc.RawJSON(nil), `null`},
		{"timestamptz", utc(2024, 2, 29, 7, 4, 56, 789012345), `"2024-02-29T07:04:56.789012Z"`},
		{"timestamptz trims zeros", utc(2024, 2, 29, 7, 4, 56, 500000000), `"2024-02-29T07:04:56.5Z"`},
		{"timestamptz whole second", utc(1970, 1, 1, 0, 0, 0, 999), `"1970-01-01T00:00:00Z"`},
		{"timestamptz other zone", time.Date(2024, 1, 1, 5, 30, 0, 0, time.FixedZone("x", 5*3600+1800)), `"2024-01-01T00:00:00Z"`},
		{"timestamptz BC", utc(-43, 3, 15, 12, 0, 0, 0), `"-0043-03-15T12:00:00Z"`},
		{"timestamptz year 0", utc(0, 1, 1, 0, 0, 0, 0), `"0000-01-01T00:00:00Z"`},
		{"timestamptz 5-digit year", utc(10000, 1, 1, 0, 0, 0, 0), `"10000-01-01T00:00:00Z"`},
		{"timestamp", cdc.Timestamp{Time: utc(2024, 2, 29, 12, 34, 56, 789012000)}, `"2024-02-29T12:34:56.789012"`},
		{"timestamp whole", cdc.Timestamp{Time: utc(2024, 2, 29, 12, 34, 56, 0)}, `"2024-02-29T12:34:56"`},
		{"timestamp max", cdc.Timestamp{Time: utc(294276, 12, 31, 23, 59, 59, 999999000)}, `"294276-12-31T23:59:59.999999"`},
		{"date", cdc.Date{Time: utc(2024, 2, 29, 0, 0, 0, 0)}, `"2024-02-29"`},
		{"date early", cdc.Date{Time: utc(1, 1, 1, 0, 0, 0, 0)}, `"0001-01-01"`},
		{"date BC", cdc.Date{Time: utc(-4712, 1, 1, 0, 0, 0, 0)}, `"-4712-01-01"`},
		{"infinity", cdc.Infinity(1), `"infinity"`},
		{"-infinity", cdc.Infinity(-1), `"-infinity"`},
		{"array", []any{int64(1), nil, "x", []any{true}, []any{}}, `[1,null,"x",[true],[]]`},
		{"array empty", []any{}, `[]`},
		{"array nil", []any(nil), `[]`},
		{"unchanged", cdc.Unchanged, `"unchanged_toast"`},
		{"absent", cdc.Absent, `"absent"`},
		{"fallback stringer", stringer{}, `"a \"stringer\""`},
		{"fallback error", errors.New("bad\nthing"), `"bad\nthing"`},
		{"fallback slice", []string{"a", "b"}, `"[a b]"`},
		{"fallback map", map[string]int{"k": 1}, `"map[k:1]"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendValue([]byte("prefix:"), tt.in)
			require.True(t, strings.HasPrefix(string(got), "prefix:"))
			got = got[len("prefix:"):]
			assert.Equal(t, tt.want, string(got))
			assert.True(t, json.Valid(got), "valid JSON: %s", got)
		})
	}
}

// TestAppendStringMatchesEncodingJSON checks that strings decode to what
// encoding/json would give for the same input.
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "\x00\x01\x1f", "\"\\/", "\u2028\u2029", "a\xffb", "\xc3", "é🎉", "\xf0\x9f\x8e", strings.Repeat("x\n", 100)} {
		checkString(t, s)
	}
}

func checkString(t *testing.T, s string) {
	t.Helper()
	out := AppendValue(nil, s)
	require.True(t, json.Valid(out), "invalid JSON %q for %q", out, s)
	var got string
	require.NoError(t, json.Unmarshal(out, &got))
	// Each invalid byte becomes one U+FFFD, as a []rune conversion does.
	assert.Equal(t, string([]rune(s)), got, "input %q, output %s", s, out)
	std, err := json.Marshal(s)
	require.NoError(t, err)
	var want string
	require.NoError(t, json.Unmarshal(std, &want))
	assert.Equal(t, want, got)
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a", "\"", "\\", "\x00", "\u2028", "\xff", "é", "\xe2\x80", "\U0001F389"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkString(t, s)
		// Also as an array element, a column name and a message.
		c := &cdc.Change{Producer: s, Op: cdc.OpMessage, Schema: s, Prefix: s, Content: []byte(s),
			Rel: &cdc.Relation{Columns: []cdc.Column{{Name: s, Key: true}}}, After: []any{[]any{s, cdc.Numeric(s)}}}
		out := AppendNative(nil, c)
		require.True(t, json.Valid(out), "invalid JSON %q", out)
		c.Op = cdc.OpInsert
		out = AppendNative(nil, c)
		require.True(t, json.Valid(out), "invalid JSON %q", out)
	})
}

func FuzzAppendNumeric(f *testing.F) {
	for _, s := range []string{"0", "-1.5", "1e5", "NaN", "01", "-", "1.", ".5", "1e+"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendValue(nil, cdc.Numeric(s))
		require.True(t, json.Valid(out), "invalid JSON %q for %q", out, s)
	})
}
