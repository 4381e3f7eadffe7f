package format

import (
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// decodeCloudEvent reads b with the official CloudEvents Go SDK and
// validates it against the spec as the SDK implements it.
func decodeCloudEvent(t *testing.T, b []byte) cloudevents.Event {
	t.Helper()
	require.True(t, json.Valid(b), "invalid JSON: %s", b)
	var ev cloudevents.Event
	require.NoError(t, json.Unmarshal(b, &ev), "%s", b)
	require.NoError(t, ev.Validate(), "%s", b)
	return ev
}

// uriReference matches the characters RFC 3986 allows in a URI reference,
// with '%' only as part of a percent-encoding.
var uriReference = regexp.MustCompile(`^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-F]{2})+$`)

func TestAppendCloudEvent(t *testing.T) {
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		name    string
		change  func() cdc.Change
		typ     string
		subject string // "" means absent
	}{
		{"insert", func() cdc.Change {
			c := dbzChange(cdc.OpInsert)
			c.After = []any{int64(1), "eu", nil, cdc.RawJSON(`{"a": [1, 2.50]}`)}
			return c
		}, "io.bridgecdc.insert", "public.orders"},
		{"update", func() cdc.Change {
			c := dbzChange(cdc.OpUpdate)
			c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
			c.After = []any{int64(2), "eu", cdc.Unchanged, nil}
			c.Headers = map[string]string{"traceparent": traceparent, "tracestate": "rojo=00f067aa0ba902b7"}
			return c
		}, "io.bridgecdc.update", "public.orders"},
		{"delete", func() cdc.Change {
			c := dbzChange(cdc.OpDelete)
			c.Before = []any{int64(1), "eu", cdc.Absent, cdc.Absent}
			c.Headers = map[string]string{"traceparent": traceparent}
			return c
		}, "io.bridgecdc.delete", "public.orders"},
		{"read", func() cdc.Change {
			c := dbzChange(cdc.OpRead)
			c.After = []any{int64(1), "eu", nil, nil}
			return c
		}, "io.bridgecdc.read", "public.orders"},
		{"truncate", func() cdc.Change { return dbzChange(cdc.OpTruncate) }, "io.bridgecdc.truncate", "public.orders"},
		{"message", func() cdc.Change {
			c := dbzChange(cdc.OpMessage)
			c.Rel, c.Schema, c.Table = nil, "", ""
			c.Prefix, c.Content = "audit", []byte{0xff}
			return c
		}, "io.bridgecdc.message", "audit"},
		{"message with blank prefix", func() cdc.Change {
			c := dbzChange(cdc.OpMessage)
			c.Rel, c.Schema, c.Table = nil, "", ""
			c.Prefix = " "
			return c
		}, "io.bridgecdc.message", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.change()
			out := AppendCloudEvent(nil, &c)
			ev := decodeCloudEvent(t, out)

			assert.Equal(t, "1.0", ev.SpecVersion())
			assert.Equal(t, c.ID(), ev.ID())
			assert.Equal(t, "/bridge/main/shop", ev.Source())
			assert.Equal(t, tt.typ, ev.Type())
			assert.Equal(t, tt.subject, ev.Subject())
			if tt.subject == "" {
				assert.NotContains(t, decode(t, out), "subject")
			}
			assert.True(t, c.CommitTime.Truncate(time.Microsecond).Equal(ev.Time()), "time %v", ev.Time())
			assert.Equal(t, "application/json", ev.DataContentType())

			ext := ev.Extensions()
			assert.Equal(t, "0/16B37A0", ext["pglsn"])
			assert.Equal(t, "2", ext["pgseq"])
			assert.Equal(t, "750", ext["pgxid"])
			if tp, ok := c.Headers["traceparent"]; ok {
				assert.Equal(t, tp, ext["traceparent"])
			} else {
				assert.NotContains(t, ext, "traceparent")
			}
			if ts, ok := c.Headers["tracestate"]; ok {
				assert.Equal(t, ts, ext["tracestate"])
			} else {
				assert.NotContains(t, ext, "tracestate")
			}
			for name := range ext {
				assert.Regexp(t, `^[a-z0-9]{1,20}$`, name, "extension names are lower-case alphanumeric, at most 20")
			}

			// data is the native encoding, byte for byte.
			assert.Equal(t, string(AppendNative(nil, &c)), string(ev.Data()))

			// The SDK writes the event back with the same attributes and data.
			again, err := json.Marshal(ev)
			require.NoError(t, err)
			ev2 := decodeCloudEvent(t, again)
			assert.Equal(t, ev.Context.AsV1(), ev2.Context.AsV1())
			assert.JSONEq(t, string(ev.Data()), string(ev2.Data()))
		})
	}
}

// TestAppendCloudEventExact pins the bytes, and so the attribute order.
func TestAppendCloudEventExact(t *testing.T) {
	c := dbzChange(cdc.OpTruncate)
	c.Headers = map[string]string{"traceparent": "00-aa-bb-01", "other": "x"}
	want := `{"specversion":"1.0","id":"shop.main.k3x9:00000000016B37A0:2","source":"/bridge/main/shop",` +
		`"type":"io.bridgecdc.truncate","subject":"public.orders","time":"2024-02-29T07:04:56.789012Z",` +
		`"datacontenttype":"application/json","pglsn":"0/16B37A0","pgseq":"2","pgxid":"750","traceparent":"00-aa-bb-01",` +
		`"data":` + string(AppendNative(nil, &c)) + `}`
	assert.Equal(t, want, string(AppendCloudEvent(nil, &c)))
}

func TestAppendCloudEventEdges(t *testing.T) {
	t.Run("non-transactional message", func(t *testing.T) {
		c := cdc.Change{Op: cdc.OpMessage, Source: "main", Database: "shop", Producer: "p", LSN: 0x100,
			CommitLSN: 0x101, TxSize: 1, Prefix: "hb", Content: []byte("tick")}
		out := AppendCloudEvent(nil, &c)
		ev := decodeCloudEvent(t, out)
		m := decode(t, out)
		assert.NotContains(t, m, "time", "no commit time")
		assert.NotContains(t, m, "pgxid", "no transaction")
		assert.True(t, ev.Time().IsZero())
		assert.Equal(t, "0/101", ev.Extensions()["pglsn"])
		assert.Equal(t, "hb", ev.Subject())
	})
	t.Run("source segments are percent-encoded", func(t *testing.T) {
		for _, name := range []string{"a b", "x/y", "q?#", "100%", "é", `"\`, "\x00\xff", "", "ok-._~!$&'()*+,;=:@"} {
			c := dbzChange(cdc.OpTruncate)
			c.Source, c.Database = name, name+"db"
			ev := decodeCloudEvent(t, AppendCloudEvent(nil, &c))
			src := ev.Source()
			assert.Regexp(t, uriReference, src, "source %q for %q", src, name)
			u, err := url.Parse(src)
			require.NoError(t, err)
			assert.False(t, u.IsAbs(), "a relative reference")
			segs := strings.Split(u.EscapedPath(), "/")
			require.Len(t, segs, 4, "%q", src)
			assert.Equal(t, "bridge", segs[1])
			for i, want := range []string{name, name + "db"} {
				got, err := url.PathUnescape(segs[2+i])
				require.NoError(t, err)
				assert.Equal(t, want, got)
			}
		}
	})
	t.Run("large seq and xid are strings", func(t *testing.T) {
		c := dbzChange(cdc.OpTruncate)
		c.Seq, c.Xid, c.CommitLSN = 4294967295, 4294967295, 0xFFFFFFFFFFFFFFFF
		ev := decodeCloudEvent(t, AppendCloudEvent(nil, &c))
		assert.Equal(t, "4294967295", ev.Extensions()["pgseq"])
		assert.Equal(t, "4294967295", ev.Extensions()["pgxid"])
		assert.Equal(t, "FFFFFFFF/FFFFFFFF", ev.Extensions()["pglsn"])
		assert.Equal(t, c.ID(), ev.ID())
	})
	t.Run("escaped strings", func(t *testing.T) {
		c := dbzChange(cdc.OpInsert)
		c.Producer, c.Schema, c.Table = "we\"ird\n", "s\\", "t\xff"
		c.Headers = map[string]string{"traceparent": "tp\"\n"}
		c.After = []any{int64(1), "eu", nil, nil}
		ev := decodeCloudEvent(t, AppendCloudEvent(nil, &c))
		assert.Equal(t, c.ID(), ev.ID())
		assert.Equal(t, "s\\.t\ufffd", ev.Subject())
		assert.Equal(t, "tp\"\n", ev.Extensions()["traceparent"])
	})
	t.Run("appends", func(t *testing.T) {
		c := dbzChange(cdc.OpTruncate)
		assert.True(t, strings.HasPrefix(string(AppendCloudEvent([]byte("x"), &c)), `x{"specversion":"1.0"`))
	})
}

func TestBenchChangeCloudEventAllocs(t *testing.T) {
	c := benchChange()
	c.Database = "shop"
	c.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	out := AppendCloudEvent(nil, c)
	decodeCloudEvent(t, out)
	allocs := testing.AllocsPerRun(100, func() { out = AppendCloudEvent(out[:0], c) })
	assert.Zero(t, allocs, "AppendCloudEvent into a large enough buffer")
}

func BenchmarkAppendCloudEvent(b *testing.B) {
	c := benchChange()
	c.Database = "shop"
	c.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	buf := AppendCloudEvent(nil, c)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendCloudEvent(buf[:0], c)
	}
}
