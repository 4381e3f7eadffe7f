package pgtypes

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

func builtin(t *testing.T, oid uint32) *Type {
	t.Helper()
	typ := builtins[oid]
	require.NotNil(t, typ, "builtin OID %d", oid)
	return typ
}

func TestDecodeText(t *testing.T) {
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	tests := []struct {
		name string
		oid  uint32
		in   string
		want any
	}{
		{"bool t", 16, "t", true},
		{"bool f", 16, "f", false},
		{"int2", 21, "-32768", int64(-32768)},
		{"int8 min", 20, "-9223372036854775808", int64(math.MinInt64)},
		{"int8 max", 20, "9223372036854775807", int64(math.MaxInt64)},
		{"oid", 26, "4294967295", int64(4294967295)},
		{"float8", 701, "0.1", 0.1},
		{"float8 exponent", 701, "1e+100", 1e100},
		{"float8 small", 701, "5e-324", 5e-324},
		{"float4 shortest", 700, "1.1", 1.1},
		{"float8 inf", 701, "Infinity", math.Inf(1)},
		{"float8 -inf", 701, "-Infinity", math.Inf(-1)},
		{"numeric", 1700, "-12.500", cdc.Numeric("-12.500")},
		{"numeric 40 digits", 1700, "1234567890123456789012345678901234567890", cdc.Numeric("1234567890123456789012345678901234567890")},
		{"numeric NaN", 1700, "NaN", cdc.Numeric("NaN")},
		{"numeric -Infinity", 1700, "-Infinity", cdc.Numeric("-Infinity")},
		{"text", 25, `héllo "x" \ y`, `héllo "x" \ y`},
		{"bytea hex", 17, `\x00ff10`, []byte{0, 0xff, 0x10}},
		{"bytea hex upper", 17, `\xDEADbeef`, []byte{0xde, 0xad, 0xbe, 0xef}},
		{"bytea empty", 17, `\x`, []byte{}},
		{"bytea escape", 17, `a\\b\000\377c`, []byte{'a', '\\', 'b', 0, 0xff, 'c'}},
		{"json", 114, ` {"a": [1, 2.50]} `, cdc.RawJSON(` {"a": [1, 2.50]} `)},
		{"jsonb scalar", 3802, `"x"`, cdc.RawJSON(`"x"`)},
		{"timestamptz", 1184, "2024-02-29 12:34:56.789012+00", utc(2024, 2, 29, 12, 34, 56, 789012000)},
		{"timestamptz offset", 1184, "2024-02-29 12:34:56+05:30", utc(2024, 2, 29, 7, 4, 56, 0)},
		{"timestamptz lmt offset", 1184, "1900-01-01 00:00:00-00:01:15", utc(1900, 1, 1, 0, 1, 15, 0)},
		{"timestamptz BC", 1184, "0044-03-15 12:00:00.5+00 BC", utc(-43, 3, 15, 12, 0, 0, 500000000)},
		{"timestamptz 5-digit year", 1184, "10000-01-01 00:00:00+00", utc(10000, 1, 1, 0, 0, 0, 0)},
		{"timestamptz infinity", 1184, "infinity", cdc.Infinity(1)},
		{"timestamp", 1114, "2024-02-29 12:34:56.1", cdc.Timestamp{Time: utc(2024, 2, 29, 12, 34, 56, 100000000)}},
		{"timestamp BC", 1114, "4713-01-01 00:00:00 BC", cdc.Timestamp{Time: utc(-4712, 1, 1, 0, 0, 0, 0)}},
		{"timestamp max", 1114, "294276-12-31 23:59:59.999999", cdc.Timestamp{Time: utc(294276, 12, 31, 23, 59, 59, 999999000)}},
		{"timestamp -infinity", 1114, "-infinity", cdc.Infinity(-1)},
		{"date", 1082, "2024-02-29", cdc.Date{Time: utc(2024, 2, 29, 0, 0, 0, 0)}},
		{"date BC", 1082, "0001-01-01 BC", cdc.Date{Time: utc(0, 1, 1, 0, 0, 0, 0)}},
		{"date max", 1082, "5874897-12-31", cdc.Date{Time: utc(5874897, 12, 31, 0, 0, 0, 0)}},
		{"date infinity", 1082, "infinity", cdc.Infinity(1)},
		{"interval", 1186, "1 day 02:00:00", "1 day 02:00:00"},
		{"time", 1083, "12:00:00.5", "12:00:00.5"},
		{"int4[]", 1007, "{1,NULL,-3}", []any{int64(1), nil, int64(-3)}},
		{"int4[] bounds", 1007, "[0:1][1:2]={{1,2},{3,4}}", []any{[]any{int64(1), int64(2)}, []any{int64(3), int64(4)}}},
		{"text[]", 1009, `{"a,b",NULL,"NULL","","\\"}`, []any{"a,b", nil, "NULL", "", `\`}},
		{"bytea[]", 1001, `{"\\x00ff",NULL}`, []any{[]byte{0, 0xff}, nil}},
		{"jsonb[]", 3807, `{"{\"a\": 1}",null}`, []any{cdc.RawJSON(`{"a": 1}`), nil}},
		{"box[]", 1020, `{(1,1),(0,0);(2,2),(1,1)}`, []any{"(1,1),(0,0)", "(2,2),(1,1)"}},
		{"date[]", 1182, `{2024-01-01,infinity}`, []any{cdc.Date{Time: utc(2024, 1, 1, 0, 0, 0, 0)}, cdc.Infinity(1)}},
		{"timestamptz[]", 1185, `{"2024-01-01 00:00:00+00","0044-03-15 00:00:00+00 BC"}`, []any{utc(2024, 1, 1, 0, 0, 0, 0), utc(-43, 3, 15, 0, 0, 0, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := builtin(t, tt.oid).DecodeText([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			if tm, ok := got.(time.Time); ok {
				assert.Equal(t, time.UTC, tm.Location())
			}
		})
	}
}

func TestDecodeTextNaN(t *testing.T) {
	for _, oid := range []uint32{700, 701} {
		got, err := builtin(t, oid).DecodeText([]byte("NaN"))
		require.NoError(t, err)
		assert.True(t, math.IsNaN(got.(float64)))
	}
}

func TestDecodeTextDoesNotAlias(t *testing.T) {
	for _, oid := range []uint32{25, 17, 114, 1700, 1009, 3807} {
		in := []byte(`{"a"}`)
		switch oid {
		case 17:
			in = []byte(`\x00`)
		case 1700:
			in = []byte(`12`)
		case 114:
			in = []byte(`["a"]`)
		case 3807:
			in = []byte(`{"[\"a\"]"}`)
		}
		typ := builtin(t, oid)
		got, err := typ.DecodeText(in)
		require.NoError(t, err, typ.Name)
		want, _ := typ.DecodeText(append([]byte(nil), in...))
		for i := range in {
			in[i] = 'X'
		}
		assert.Equal(t, want, got, typ.Name)
	}
}

func TestDecodeTextErrors(t *testing.T) {
	tests := []struct {
		oid uint32
		in  string
	}{
		{16, "yes"}, {23, ""}, {23, "1.5"}, {23, "-"}, {20, "9223372036854775808"}, {20, "-9223372036854775809"},
		{20, "99999999999999999999"}, {701, "abc"}, {701, "inf"}, {701, ""}, {1700, "1e5"}, {1700, "1."}, {1700, ".5"}, {1700, "--1"},
		{17, `\x0`}, {17, `\xzz`}, {17, `a\b`}, {17, `\400`}, {114, `{"a":}`}, {3802, ``},
		{1184, "2024-02-29 12:34:56"}, {1184, "2024-02-29"}, {1184, "2024-13-01 00:00:00+00"}, {1114, "2024-02-29 12:34"},
		{1114, "24-02-29 12:34:56"}, {1082, "2024-02-29 junk"}, {1082, "02/29/2024"}, {1082, "Infinity"},
		{1007, "{1,x}"}, {1007, "1,2"}, {1182, "{2024-01-01,nope}"},
	}
	for _, tt := range tests {
		typ := builtin(t, tt.oid)
		t.Run(typ.Name+" "+tt.in, func(t *testing.T) {
			_, err := typ.DecodeText([]byte(tt.in))
			require.Error(t, err)
			assert.Contains(t, err.Error(), typ.Name)
		})
	}
}

func TestDecodeTextErrorShortensValue(t *testing.T) {
	long := strings.Repeat("é", 200)
	_, err := builtin(t, 23).DecodeText([]byte(long))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "int4")
	assert.Contains(t, err.Error(), "…")
	assert.Less(t, len(err.Error()), 150)
}

func TestKindString(t *testing.T) {
	assert.Equal(t, "timestamptz", TimestampTZ.String())
	assert.Equal(t, "text", Kind(0).String())
	assert.Equal(t, "kind(99)", Kind(99).String())
}

// FuzzDecodeText checks that no decoder panics and that JSON values it
// accepts are valid JSON.
func FuzzDecodeText(f *testing.F) {
	oids := []uint32{16, 17, 20, 25, 114, 700, 1007, 1009, 1020, 1082, 1114, 1182, 1184, 1185, 1700, 3807}
	for i, s := range []string{"t", `\x00ff`, "-12", "x", `{"a":1}`, "NaN", "{1,NULL}", `{"a\"",b}`, "{(1,1),(0,0)}",
		"0044-03-15 BC", "2024-01-01 00:00:00.5", "{infinity}", "2024-01-01 00:00:00+05:30:15 BC", `{"2024-01-01 00:00:00+00"}`, "1.5", `{"{}"}`} {
		f.Add(s, uint8(i))
	}
	f.Fuzz(func(t *testing.T, s string, k uint8) {
		typ := builtins[oids[int(k)%len(oids)]]
		v, err := typ.DecodeText([]byte(s))
		if err != nil {
			return
		}
		var check func(v any)
		check = func(v any) {
			switch v := v.(type) {
			case cdc.RawJSON:
				if !json.Valid(v) {
					t.Fatalf("%s accepted invalid JSON %q", typ.Name, v)
				}
			case []any:
				for _, e := range v {
					check(e)
				}
			}
		}
		check(v)
	})
}
