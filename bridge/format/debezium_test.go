package format

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// The types below are the payload of a Debezium PostgreSQL connector change
// event value, transcribed from the connector documentation
// (debezium/debezium documentation/modules/ROOT/pages/connectors/postgresql.adoc:
// "Change event values", "truncate events", "message events", "Transaction
// metadata") and the io.debezium.connector.postgresql.Source schema. They
// are written from the documentation, not from our encoder, so decoding with
// DisallowUnknownFields checks we emit no field Debezium does not.
type dbzEnvelope struct {
	Before      map[string]any  `json:"before"`
	After       map[string]any  `json:"after"`
	Source      dbzSource       `json:"source"`
	Op          string          `json:"op"`
	TsMs        *int64          `json:"ts_ms"`
	TsUs        *int64          `json:"ts_us"`
	TsNs        *int64          `json:"ts_ns"`
	Transaction *dbzTransaction `json:"transaction"`
	Message     *dbzMessage     `json:"message"`
}

type dbzSource struct {
	Version   string `json:"version"`
	Connector string `json:"connector"`
	Name      string `json:"name"`
	TsMs      int64  `json:"ts_ms"`
	TsUs      int64  `json:"ts_us"`
	TsNs      int64  `json:"ts_ns"`
	// Snapshot is a string enum in the Source schema ("true", "first",
	// "last", "false", "incremental", ...); the documentation's examples
	// show a JSON boolean, which the JsonConverter never writes.
	Snapshot string `json:"snapshot"`
	DB       string `json:"db"`
	// Sequence is a JSON array in a string: [last committed LSN, LSN],
	// either of which may be null.
	Sequence string `json:"sequence"`
	Schema   string `json:"schema"`
	Table    string `json:"table"`
	TxID     *int64 `json:"txId"`
	LSN      *int64 `json:"lsn"`
	Xmin     *int64 `json:"xmin"`
}

type dbzTransaction struct {
	ID                  string `json:"id"`
	TotalOrder          int64  `json:"total_order"`
	DataCollectionOrder int64  `json:"data_collection_order"`
}

type dbzMessage struct {
	Prefix  string `json:"prefix"`
	Content []byte `json:"content"` // base64 in JSON (binary.handling.mode=bytes)
}

// decodeDebezium decodes b strictly into the documented envelope, and also
// into a map so tests can see which keys are present.
func decodeDebezium(t *testing.T, b []byte) (dbzEnvelope, map[string]any) {
	t.Helper()
	require.True(t, json.Valid(b), "invalid JSON: %s", b)
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	d.UseNumber()
	var env dbzEnvelope
	require.NoError(t, d.Decode(&env), "%s", b)
	return env, decode(t, b)
}

func sequence(t *testing.T, s string) []*string {
	t.Helper()
	var seq []*string
	require.NoError(t, json.Unmarshal([]byte(s), &seq), "sequence %q", s)
	require.Len(t, seq, 2)
	return seq
}

func ptr[T any](v T) *T { return &v }

func dbzChange(op cdc.Op) cdc.Change {
	c := baseChange(op)
	c.Database = "shop"
	return c
}

func TestAppendDebeziumEnvelope(t *testing.T) {
	// The commit time of baseChange, 2024-02-29T07:04:56.789012345Z.
	const ms, us, ns = 1709190296789, 1709190296789012, 1709190296789012345
	require.Equal(t, int64(ms), baseChange("").CommitTime.UnixMilli())

	wantSource := func(op string) dbzSource {
		s := dbzSource{Version: "bridge", Connector: "postgresql", Name: "main", TsMs: ms, TsUs: us, TsNs: ns,
			Snapshot: "false", DB: "shop", Sequence: `["23803808","23803720"]`, Schema: "public", Table: "orders",
			TxID: ptr(int64(750)), LSN: ptr(int64(0x16B3748))}
		if op == "r" {
			s.Snapshot = "true"
		}
		return s
	}
	tx := &dbzTransaction{ID: "750:23803808", TotalOrder: 3, DataCollectionOrder: 3}
	num := func(s string) json.Number { return json.Number(s) }

	tests := []struct {
		name          string
		change        func() cdc.Change
		op            string
		before, after map[string]any
		key           string
	}{
		{"insert", func() cdc.Change {
			c := dbzChange(cdc.OpInsert)
			c.After = []any{int64(1), "eu", nil, cdc.RawJSON(`{"a": [1, 2.50]}`)}
			return c
		}, "c", nil, map[string]any{"id": num("1"), "region": "eu", "note": nil, "doc": `{"a": [1, 2.50]}`},
			`{"id":1,"region":"eu"}`},
		{"read", func() cdc.Change {
			c := dbzChange(cdc.OpRead)
			c.After = []any{int64(1), "eu", "n", cdc.RawJSON(`null`)}
			return c
		}, "r", nil, map[string]any{"id": num("1"), "region": "eu", "note": "n", "doc": "null"},
			`{"id":1,"region":"eu"}`},
		{"update with key change and unchanged toast", func() cdc.Change {
			c := dbzChange(cdc.OpUpdate)
			c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
			c.After = []any{int64(2), "eu", cdc.Unchanged, cdc.Unchanged}
			return c
		}, "u",
			map[string]any{"id": num("1"), "region": "eu", "note": nil, "doc": nil},
			map[string]any{"id": num("2"), "region": "eu", "note": DebeziumUnavailable, "doc": DebeziumUnavailable},
			`{"id":2,"region":"eu"}`},
		{"update without old row", func() cdc.Change {
			c := dbzChange(cdc.OpUpdate)
			c.After = []any{int64(1), "eu", "new", cdc.RawJSON(`[]`)}
			return c
		}, "u", nil, map[string]any{"id": num("1"), "region": "eu", "note": "new", "doc": "[]"},
			`{"id":1,"region":"eu"}`},
		{"update with full identity fills unchanged toast from before", func() cdc.Change {
			c := dbzChange(cdc.OpUpdate)
			c.Before = []any{int64(1), "a very long region", "old", cdc.RawJSON(`{"big":1}`)}
			c.After = []any{int64(1), cdc.Unchanged, "new", cdc.Unchanged}
			return c
		}, "u",
			map[string]any{"id": num("1"), "region": "a very long region", "note": "old", "doc": `{"big":1}`},
			map[string]any{"id": num("1"), "region": "a very long region", "note": "new", "doc": `{"big":1}`},
			`{"id":1,"region":"a very long region"}`},
		{"delete", func() cdc.Change {
			c := dbzChange(cdc.OpDelete)
			c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
			return c
		}, "d", map[string]any{"id": num("1"), "region": "eu", "note": nil, "doc": nil}, nil,
			`{"id":1,"region":"eu"}`},
		{"delete with full identity", func() cdc.Change {
			c := dbzChange(cdc.OpDelete)
			c.Before = []any{int64(1), "eu", "gone", cdc.RawJSON(`{}`)}
			return c
		}, "d", map[string]any{"id": num("1"), "region": "eu", "note": "gone", "doc": "{}"}, nil,
			`{"id":1,"region":"eu"}`},
		{"delete without old row", func() cdc.Change {
			return dbzChange(cdc.OpDelete)
		}, "d", nil, nil, `null`},
		{"truncate", func() cdc.Change {
			c := dbzChange(cdc.OpTruncate)
			c.Cascade = true
			return c
		}, "t", nil, nil, `null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.change()
			out := AppendDebezium(nil, &c)
			env, m := decodeDebezium(t, out)
			assert.Equal(t, tt.op, env.Op)
			assert.Equal(t, tt.before, env.Before)
			assert.Equal(t, tt.after, env.After)
			assert.Equal(t, wantSource(tt.op), env.Source)
			assert.Equal(t, tx, env.Transaction)
			assert.Nil(t, env.Message)
			assert.Equal(t, int64(ms), *env.TsMs)
			assert.Equal(t, int64(us), *env.TsUs)
			assert.Equal(t, int64(ns), *env.TsNs)
			// Both rows are present, null or not, as the JsonConverter writes
			// every field of the Envelope schema.
			assert.Contains(t, m, "before")
			assert.Contains(t, m, "after")
			seq := sequence(t, env.Source.Sequence)
			assert.Equal(t, strconv.FormatUint(uint64(c.CommitLSN), 10), *seq[0])
			assert.Equal(t, strconv.FormatUint(uint64(c.LSN), 10), *seq[1])
			assert.JSONEq(t, tt.key, string(AppendDebeziumKey(nil, &c)))
		})
	}
}

func TestAppendDebeziumMessage(t *testing.T) {
	t.Run("transactional", func(t *testing.T) {
		c := dbzChange(cdc.OpMessage)
		c.Schema, c.Table, c.Rel = "", "", nil
		c.Prefix, c.Content, c.Transactional = "audit", []byte{0xff, 0, 'h', 'i'}, true
		out := AppendDebezium(nil, &c)
		env, m := decodeDebezium(t, out)
		assert.Equal(t, "m", env.Op)
		assert.NotContains(t, m, "before", "message events have no rows")
		assert.NotContains(t, m, "after")
		require.NotNil(t, env.Message)
		assert.Equal(t, "audit", env.Message.Prefix)
		assert.Equal(t, c.Content, env.Message.Content)
		assert.Equal(t, "", env.Source.Schema)
		assert.Equal(t, "", env.Source.Table)
		assert.Equal(t, int64(750), *env.Source.TxID)
		assert.Equal(t, &dbzTransaction{ID: "750:23803808", TotalOrder: 3, DataCollectionOrder: 3}, env.Transaction)
		assert.JSONEq(t, `{"prefix":"audit"}`, string(AppendDebeziumKey(nil, &c)))
	})
	t.Run("non-transactional", func(t *testing.T) {
		// As the pgoutput source builds it: no xid, no commit time, its own
		// transaction at LSN+1.
		c := cdc.Change{Op: cdc.OpMessage, Source: "main", Database: "shop", Producer: "p", LSN: 0x100,
			CommitLSN: 0x101, TxSize: 1, Prefix: "hb", Content: []byte("tick")}
		before := time.Now()
		out := AppendDebezium(nil, &c)
		after := time.Now()
		env, _ := decodeDebezium(t, out)
		assert.Nil(t, env.Source.TxID, "txId is null for non-transactional messages")
		assert.Nil(t, env.Transaction)
		assert.Equal(t, int64(0x100), *env.Source.LSN)
		// Debezium uses the time it met the message; so do we.
		assert.GreaterOrEqual(t, env.Source.TsMs, before.UnixMilli())
		assert.LessOrEqual(t, env.Source.TsMs, after.UnixMilli())
		assert.Equal(t, env.Source.TsMs, *env.TsMs)
		assert.Equal(t, []byte("tick"), env.Message.Content)
	})
}

// TestAppendDebeziumGolden pins the exact bytes of one event per op.
func TestAppendDebeziumGolden(t *testing.T) {
	const src = `"source":{"version":"bridge","connector":"postgresql","name":"main","ts_ms":1709190296789,` +
		`"snapshot":"%s","db":"shop","sequence":"[\"23803808\",\"23803720\"]","ts_us":1709190296789012,` +
		`"ts_ns":1709190296789012345,"schema":"%s","table":"%s","txId":750,"lsn":23803720,"xmin":null}`
	const tail = `"ts_ms":1709190296789,"ts_us":1709190296789012,"ts_ns":1709190296789012345`
	const tx = `"transaction":{"id":"750:23803808","total_order":3,"data_collection_order":3}`
	fill := func(snapshot, schema, table string) string {
		s := strings.Replace(src, "%s", snapshot, 1)
		s = strings.Replace(s, "%s", schema, 1)
		return strings.Replace(s, "%s", table, 1)
	}
	row := fill("false", "public", "orders")

	c := dbzChange(cdc.OpInsert)
	c.After = []any{int64(7), "eu", "hi", cdc.RawJSON(`{"k": "v"}`)}
	assert.Equal(t, `{"before":null,"after":{"id":7,"region":"eu","note":"hi","doc":"{\"k\": \"v\"}"},`+row+
		`,"op":"c",`+tail+`,`+tx+`}`, string(AppendDebezium(nil, &c)))

	u := dbzChange(cdc.OpUpdate)
	u.Before = []any{int64(7), "eu", cdc.Absent, cdc.Absent}
	u.After = []any{int64(8), "eu", cdc.Unchanged, nil}
	assert.Equal(t, `{"before":{"id":7,"region":"eu","note":null,"doc":null},`+
		`"after":{"id":8,"region":"eu","note":"__debezium_unavailable_value","doc":null},`+row+
		`,"op":"u",`+tail+`,`+tx+`}`, string(AppendDebezium(nil, &u)))

	d := dbzChange(cdc.OpDelete)
	d.Before = []any{int64(7), "eu", cdc.Absent, cdc.Absent}
	assert.Equal(t, `{"before":{"id":7,"region":"eu","note":null,"doc":null},"after":null,`+row+
		`,"op":"d",`+tail+`,`+tx+`}`, string(AppendDebezium(nil, &d)))

	r := dbzChange(cdc.OpRead)
	r.After = []any{int64(7), "eu", nil, nil}
	assert.Equal(t, `{"before":null,"after":{"id":7,"region":"eu","note":null,"doc":null},`+fill("true", "public", "orders")+
		`,"op":"r",`+tail+`,`+tx+`}`, string(AppendDebezium(nil, &r)))

	tr := dbzChange(cdc.OpTruncate)
	assert.Equal(t, `{"before":null,"after":null,`+row+`,"op":"t",`+tail+`,`+tx+`}`, string(AppendDebezium(nil, &tr)))

	m := dbzChange(cdc.OpMessage)
	m.Rel, m.Schema, m.Table = nil, "", ""
	m.Prefix, m.Content = "p", []byte("bar")
	assert.Equal(t, `{`+fill("false", "", "")+`,"op":"m",`+tail+`,"message":{"prefix":"p","content":"YmFy"},`+tx+`}`,
		string(AppendDebezium(nil, &m)))
}

func TestAppendDebeziumValue(t *testing.T) {
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}
	col := func(typ string, oid uint32) *cdc.Column { return &cdc.Column{Name: "c", Type: typ, OID: oid} }
	var (
		numeric     = col("numeric", 1700)
		bytea       = col("bytea", 17)
		jsonb       = col("jsonb", 3802)
		text        = col("text", 25)
		date        = col("date", 1082)
		timestamp   = col("timestamp", 1114)
		timestamptz = col("timestamptz", 1184)
		dates       = col("_date", 1182)
		timestamps  = col("_timestamp", 1115)
		texts       = col("_text", 1009)
		varchars    = col("_varchar", 1015)
		jsonbs      = col("_jsonb", 3807)
		ints        = col("_int4", 1007)
		bigints     = col("_int8", 1016)
		numerics    = col("_numeric", 1231)
		domain      = col("public.when", 90000) // a domain: neither OID nor name is known
	)
	placeholderBytes := func() string {
		parts := make([]string, len(DebeziumUnavailable))
		for i := range DebeziumUnavailable {
			parts[i] = strconv.Itoa(int(DebeziumUnavailable[i]))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}()
	tests := []struct {
		name string
		in   any
		col  *cdc.Column
		want string
	}{
		{"null", nil, text, `null`},
		{"bool", true, nil, `true`},
		{"int64", int64(-42), nil, `-42`},
		{"float", 0.25, nil, `0.25`},
		{"float NaN", math.NaN(), nil, `"NaN"`},
		{"float +Inf", math.Inf(1), nil, `"Infinity"`},
		{"float -Inf", math.Inf(-1), nil, `"-Infinity"`},
		{"string", "héllo \"q\"", text, `"héllo \"q\""`},

		// decimal.handling.mode=string: java.math.BigDecimal.toString.
		{"numeric", cdc.Numeric("1234.50"), numeric, `"1234.50"`},
		{"numeric negative", cdc.Numeric("-0.5"), numeric, `"-0.5"`},
		{"numeric integer", cdc.Numeric("100"), numeric, `"100"`},
		{"numeric 40 digits", cdc.Numeric("1234567890123456789012345678901234567890"), numeric, `"1234567890123456789012345678901234567890"`},
		{"numeric 1e-6 is plain", cdc.Numeric("0.000001"), numeric, `"0.000001"`},
		{"numeric below 1e-6 is E notation", cdc.Numeric("0.0000001"), numeric, `"1E-7"`},
		{"numeric E notation keeps scale", cdc.Numeric("-0.00000012340"), numeric, `"-1.2340E-7"`},
		{"numeric zero with big scale", cdc.Numeric("0.00000000"), numeric, `"0E-8"`},
		{"numeric zero", cdc.Numeric("0.00"), numeric, `"0.00"`},
		{"numeric negative zero", cdc.Numeric("-0"), numeric, `"0"`},
		{"numeric NaN", cdc.Numeric("NaN"), numeric, `"NAN"`},
		{"numeric Infinity", cdc.Numeric("Infinity"), numeric, `"POSITIVE_INFINITY"`},
		{"numeric -Infinity", cdc.Numeric("-Infinity"), numeric, `"NEGATIVE_INFINITY"`},
		{"numeric not plain", cdc.Numeric("1e5"), numeric, `"1e5"`},
		{"numeric empty", cdc.Numeric(""), numeric, `""`},

		// binary.handling.mode=bytes: base64.
		{"bytea", []byte{0, 0xff, 0x10}, bytea, `"AP8Q"`},
		{"bytea empty", []byte{}, bytea, `""`},

		// io.debezium.data.Json: a string holding the JSON text.
		{"jsonb", cdc.RawJSON(`{"a": [1, "x\n"]}`), jsonb, `"{\"a\": [1, \"x\\n\"]}"`},
		{"jsonb scalar", cdc.RawJSON(`"s"`), jsonb, `"\"s\""`},
		{"json empty", cdc.RawJSON(nil), jsonb, `null`},

		// time.precision.mode=adaptive.
		{"timestamptz", utc(2024, 2, 29, 7, 4, 56, 789012345), timestamptz, `"2024-02-29T07:04:56.789012Z"`},
		{"timestamptz whole", utc(2024, 2, 29, 7, 4, 56, 0), timestamptz, `"2024-02-29T07:04:56Z"`},
		{"timestamp", cdc.Timestamp{Time: utc(2024, 2, 29, 12, 34, 56, 789012000)}, timestamp, `1709210096789012`},
		{"timestamp epoch", cdc.Timestamp{Time: utc(1970, 1, 1, 0, 0, 0, 0)}, timestamp, `0`},
		{"timestamp before epoch", cdc.Timestamp{Time: utc(1969, 12, 31, 23, 59, 59, 999999000)}, timestamp, `-1`},
		{"timestamp BC", cdc.Timestamp{Time: utc(-4712, 1, 1, 0, 0, 0, 0)}, timestamp, strconv.FormatInt(utc(-4712, 1, 1, 0, 0, 0, 0).UnixMicro(), 10)},
		{"date", cdc.Date{Time: utc(2024, 2, 29, 0, 0, 0, 0)}, date, `19782`},
		{"date epoch", cdc.Date{Time: utc(1970, 1, 1, 0, 0, 0, 0)}, date, `0`},
		{"date before epoch", cdc.Date{Time: utc(1969, 12, 31, 0, 0, 0, 0)}, date, `-1`},
		{"date BC", cdc.Date{Time: utc(-4712, 1, 1, 0, 0, 0, 0)}, date, strconv.FormatInt(utc(-4712, 1, 1, 0, 0, 0, 0).Unix()/86400, 10)},

		// ±infinity, per type.
		{"date infinity", cdc.Infinity(1), date, `2146033979`},
		{"date -infinity", cdc.Infinity(-1), date, `-2147472691`},
		{"timestamp infinity", cdc.Infinity(1), timestamp, `9223372036825200000`},
		{"timestamp -infinity", cdc.Infinity(-1), timestamp, `-9223372036832400000`},
		{"timestamptz infinity", cdc.Infinity(1), timestamptz, `"infinity"`},
		{"timestamptz -infinity", cdc.Infinity(-1), timestamptz, `"-infinity"`},
		{"infinity by type name", cdc.Infinity(1), col("date", 0), `2146033979`},
		{"infinity of unknown type", cdc.Infinity(-1), domain, `"-infinity"`},
		{"infinity without column", cdc.Infinity(1), nil, `"infinity"`},

		// Arrays: elements rendered the same way, nested as they come.
		{"numeric array", []any{cdc.Numeric("1.5"), nil, cdc.Numeric("NaN")}, numerics, `["1.5",null,"NAN"]`},
		{"date array", []any{cdc.Date{Time: utc(1970, 1, 2, 0, 0, 0, 0)}, cdc.Infinity(1)}, dates, `[1,2146033979]`},
		{"timestamp array", []any{cdc.Infinity(-1), cdc.Timestamp{Time: utc(1970, 1, 1, 0, 0, 1, 0)}}, timestamps, `[-9223372036832400000,1000000]`},
		{"jsonb array", []any{cdc.RawJSON(`{"a":1}`), cdc.RawJSON(`[]`)}, jsonbs, `["{\"a\":1}","[]"]`},
		{"text array nested", []any{[]any{"a", "b"}, []any{}}, texts, `[["a","b"],[]]`},
		{"bytea array", []any{[]byte("hi"), nil}, col("_bytea", 1001), `["aGk=",null]`},

		// Unchanged TOAST: the placeholder, shaped per type.
		{"unchanged text", cdc.Unchanged, text, `"__debezium_unavailable_value"`},
		{"unchanged jsonb", cdc.Unchanged, jsonb, `"__debezium_unavailable_value"`},
		{"unchanged bytea", cdc.Unchanged, bytea, `"` + base64.StdEncoding.EncodeToString([]byte(DebeziumUnavailable)) + `"`},
		{"unchanged text array", cdc.Unchanged, texts, `["__debezium_unavailable_value"]`},
		{"unchanged varchar array", cdc.Unchanged, varchars, `["__debezium_unavailable_value"]`},
		{"unchanged jsonb array", cdc.Unchanged, jsonbs, `["__debezium_unavailable_value"]`},
		{"unchanged int4 array", cdc.Unchanged, ints, placeholderBytes},
		{"unchanged int8 array", cdc.Unchanged, bigints, placeholderBytes},
		{"unchanged date array", cdc.Unchanged, dates, placeholderBytes},
		{"unchanged by type name", cdc.Unchanged, col("_text", 0), `["__debezium_unavailable_value"]`},
		{"unchanged without column", cdc.Unchanged, nil, `"__debezium_unavailable_value"`},

		// Absent columns of a key-only before image.
		{"absent", cdc.Absent, text, `null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendDebeziumValue([]byte("prefix:"), tt.in, tt.col)
			require.True(t, strings.HasPrefix(string(got), "prefix:"))
			got = got[len("prefix:"):]
			assert.Equal(t, tt.want, string(got))
			assert.True(t, json.Valid(got), "valid JSON: %s", got)
		})
	}
}

// TestDebeziumTemporalIndependently checks day and microsecond counts
// against the time package rather than hand-computed constants.
func TestDebeziumTemporalIndependently(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1899, 12, 31, 0, 0, 0, 0, time.UTC),
		time.Date(5874897, 12, 31, 0, 0, 0, 0, time.UTC), // Postgres' last date
	} {
		require.Zero(t, tm.Unix()%86400, "midnight")
		want := tm.Unix() / 86400
		assert.Equal(t, strconv.FormatInt(want, 10), string(AppendDebeziumValue(nil, cdc.Date{Time: tm}, nil)), "%v", tm)
	}
	for _, tm := range []time.Time{
		time.Date(2024, 2, 29, 12, 34, 56, 789012000, time.UTC),
		time.Date(1900, 6, 1, 0, 0, 0, 1000, time.UTC),
		time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC), // Postgres' last timestamp
	} {
		assert.Equal(t, strconv.FormatInt(tm.UnixMicro(), 10), string(AppendDebeziumValue(nil, cdc.Timestamp{Time: tm}, nil)), "%v", tm)
	}
}

func TestAppendDebeziumKey(t *testing.T) {
	t.Run("no key columns", func(t *testing.T) {
		c := dbzChange(cdc.OpInsert)
		c.Rel = &cdc.Relation{Columns: []cdc.Column{{Name: "a"}}}
		c.After = []any{int64(1)}
		assert.Equal(t, `null`, string(AppendDebeziumKey(nil, &c)))
	})
	t.Run("unchanged toast key without old value is left out", func(t *testing.T) {
		c := dbzChange(cdc.OpUpdate)
		c.After = []any{int64(1), cdc.Unchanged, nil, nil}
		assert.Equal(t, `{"id":1}`, string(AppendDebeziumKey(nil, &c)))
	})
	t.Run("values are Debezium values", func(t *testing.T) {
		c := dbzChange(cdc.OpInsert)
		c.Rel = &cdc.Relation{Columns: []cdc.Column{{Name: "day", Type: "date", OID: 1082, Key: true}, {Name: "n", Type: "numeric", Key: true}}}
		c.After = []any{cdc.Date{Time: time.Date(1970, 1, 3, 0, 0, 0, 0, time.UTC)}, cdc.Numeric("NaN")}
		assert.Equal(t, `{"day":2,"n":"NAN"}`, string(AppendDebeziumKey(nil, &c)))
	})
	t.Run("appends", func(t *testing.T) {
		c := dbzChange(cdc.OpTruncate)
		assert.Equal(t, `xnull`, string(AppendDebeziumKey([]byte("x"), &c)))
	})
}

func TestAppendDebeziumEdges(t *testing.T) {
	t.Run("escaped names", func(t *testing.T) {
		c := dbzChange(cdc.OpInsert)
		c.Source, c.Database, c.Schema, c.Table = "s\"1", "d\\b", "sch\n", "t\xff"
		c.Rel = &cdc.Relation{Columns: []cdc.Column{{Name: "a\"b", Key: true}, {Name: "line\nbreak"}}}
		c.After = []any{int64(1), "x", "no column"}
		env, _ := decodeDebezium(t, AppendDebezium(nil, &c))
		assert.Equal(t, map[string]any{"a\"b": json.Number("1"), "line\nbreak": "x", "3": "no column"}, env.After)
		assert.Equal(t, "s\"1", env.Source.Name)
		assert.Equal(t, "d\\b", env.Source.DB)
		assert.Equal(t, "sch\n", env.Source.Schema)
		assert.Equal(t, "t\ufffd", env.Source.Table)
	})
	t.Run("large numbers", func(t *testing.T) {
		c := dbzChange(cdc.OpInsert)
		c.CommitLSN, c.LSN, c.Seq, c.Xid = math.MaxInt64, 0x16_B374D848, math.MaxUint32, math.MaxUint32
		c.After = []any{int64(1), "eu", nil, nil}
		env, _ := decodeDebezium(t, AppendDebezium(nil, &c))
		assert.Equal(t, int64(math.MaxUint32), *env.Source.TxID)
		assert.Equal(t, int64(0x16_B374D848), *env.Source.LSN)
		assert.Equal(t, "4294967295:9223372036854775807", env.Transaction.ID)
		assert.Equal(t, int64(math.MaxUint32)+1, env.Transaction.TotalOrder)
	})
	t.Run("zero LSNs are null", func(t *testing.T) {
		c := dbzChange(cdc.OpRead)
		c.CommitLSN, c.LSN, c.Xid = 0, 0, 0
		c.After = []any{int64(1), "eu", nil, nil}
		env, _ := decodeDebezium(t, AppendDebezium(nil, &c))
		assert.Nil(t, env.Source.LSN)
		assert.Nil(t, env.Source.TxID)
		assert.Nil(t, env.Transaction)
		assert.Equal(t, []*string{nil, nil}, sequence(t, env.Source.Sequence))
	})
	t.Run("appends", func(t *testing.T) {
		c := dbzChange(cdc.OpTruncate)
		assert.True(t, strings.HasPrefix(string(AppendDebezium([]byte("x"), &c)), `x{"before":null`))
	})
}

func FuzzAppendDebezium(f *testing.F) {
	for _, s := range []string{"", "a", "\"", "\\", "\x00", "\u2028", "\xff", "0.0000001", "-0", "NaN", "1.", ".5", "+1"} {
		f.Add(s, []byte(s), int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, s string, b []byte, n int64) {
		rel := &cdc.Relation{Columns: []cdc.Column{
			{Name: s, Key: true, Type: "text"}, {Name: "n", Type: "numeric"}, {Name: "j", Type: "jsonb"},
			{Name: "b", Type: "bytea", OID: 17}, {Name: "d", Type: "_date", OID: 1182}, {Name: "t", OID: 1114},
		}}
		raw := cdc.RawJSON(`{"s":` + strconv.Quote(s) + `}`)
		if !json.Valid(raw) {
			raw = cdc.RawJSON(`null`)
		}
		for _, op := range []cdc.Op{cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead, cdc.OpTruncate, cdc.OpMessage, cdc.Op(s)} {
			c := &cdc.Change{Producer: s, Source: s, Database: s, Schema: s, Table: s, Op: op, Rel: rel,
				Prefix: s, Content: b, Xid: uint32(n), LSN: cdc.LSN(n), CommitLSN: cdc.LSN(n),
				CommitTime: time.Unix(n%1e10, 0), Headers: map[string]string{"traceparent": s},
				Before: []any{s, cdc.Numeric(s), raw, cdc.Absent, cdc.Unchanged, cdc.Infinity(1)},
				After: []any{s, cdc.Numeric(s), cdc.Unchanged, b, []any{cdc.Infinity(-1), cdc.Date{Time: time.Unix(n, 0).UTC()}},
					cdc.Timestamp{Time: time.Unix(n%1e12, 0).UTC()}}}
			for _, out := range [][]byte{AppendDebezium(nil, c), AppendDebeziumKey(nil, c), AppendCloudEvent(nil, c)} {
				require.True(t, json.Valid(out), "invalid JSON %q", out)
			}
		}
	})
}

func TestBenchChangeDebeziumAllocs(t *testing.T) {
	c := benchChange()
	c.Database = "shop"
	out := AppendDebezium(nil, c)
	decodeDebezium(t, out)
	allocs := testing.AllocsPerRun(100, func() { out = AppendDebezium(out[:0], c) })
	assert.Zero(t, allocs, "AppendDebezium into a large enough buffer")
}

func BenchmarkAppendDebezium(b *testing.B) {
	c := benchChange()
	c.Database = "shop"
	buf := AppendDebezium(nil, c)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendDebezium(buf[:0], c)
	}
}
