package format

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TestAppendMasked: the header's pairs become an object in their order,
// with percent-encoded names decoded; every format carries it where
// docs/shaping.md says.
func TestAppendMasked(t *testing.T) {
	for h, want := range map[string]string{
		"email=hash":                           `{"email":"hash"}`,
		"email=hash,ssn=redact,n=truncate":     `{"email":"hash","ssn":"redact","n":"truncate"}`,
		"a%2Cb%3Dc%25=redact,d%0Ae=hash":       `{"a,b=c%":"redact","d\ne":"hash"}`,
		"größe=truncate,%zz=hash,trail%2=hash": `{"größe":"truncate","%zz":"hash","trail%2":"hash"}`,
	} {
		got := AppendMasked(nil, h)
		require.JSONEq(t, want, string(got), h)
		require.Equal(t, want, string(got), "order kept: %s", h)
	}

	c := baseChange(cdc.OpInsert)
	c.After = []any{int64(1), "eu", nil, nil}
	c.Headers = map[string]string{HeaderMasked: "note=redact,doc=hash"}
	require.Equal(t, map[string]any{"note": "redact", "doc": "hash"}, decode(t, AppendNative(nil, &c))["masked"])
	dbz := decode(t, AppendDebezium(nil, &c))
	require.Equal(t, map[string]any{"note": "redact", "doc": "hash"}, dbz["source"].(map[string]any)["masked"])
	ev := decodeCloudEvent(t, AppendCloudEvent(nil, &c))
	require.Equal(t, "note=redact,doc=hash", ev.Extensions()["pgmasked"])
	c.Headers = nil
	require.NotContains(t, decode(t, AppendNative(nil, &c)), "masked")
	require.NotContains(t, decode(t, AppendDebezium(nil, &c))["source"], "masked")
}

// TestAppendCloudEventData: a transform's result is the event's data, and
// the attributes are those of AppendCloudEvent.
func TestAppendCloudEventData(t *testing.T) {
	c := baseChange(cdc.OpInsert)
	c.After = []any{int64(1), "eu", nil, nil}
	full := AppendCloudEvent(nil, &c)
	body := []byte(`{"kind":"order","n":[1,2.5]}`)
	ev := decodeCloudEvent(t, AppendCloudEventData(nil, &c, body))
	require.JSONEq(t, string(body), string(ev.Data()))
	whole := decodeCloudEvent(t, full)
	require.Equal(t, whole.Context, ev.Context)
}
