package feeds

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TestEncodingIsOneLine decodes a change whose json column holds raw line
// breaks and a "\r" (Postgres keeps json text as written) and checks that
// its encoding for a feed, in every projection and delivery kind, is one
// line holding the same JSON value: a reader splitting on line breaks (an
// SSE data line) cannot cut it.
func TestEncodingIsOneLine(t *testing.T) {
	doc := "{\"a\":\n\n1,\r\"b\" :\r\n [ \"x\\ny\", {\"c\":\ttrue}]}"
	payload := []byte(`{"op":"update","key":{"id":7},"before":{"id":7,"doc":` + doc + `},"after":{"id":7,"doc":` + doc + `}}`)
	h := nats.Header{}
	h.Set(headerMsgID, "b.s.e:0000000000000010:0")
	h.Set(headerTxSize, "1")
	h.Set(headerTable, "public.docs")
	h.Set(headerOp, string(cdc.OpUpdate))
	c, err := decode(5, h, payload, nil)
	require.NoError(t, err)
	var want any
	require.NoError(t, json.Unmarshal([]byte(doc), &want))
	for _, p := range []*projection{{}, {cols: map[string]struct{}{"doc": {}}}} {
		for _, k := range []kind{kindAsIs, kindIn, kindOut} {
			b := c.appendJSON(nil, p, k)
			for i, x := range b {
				require.GreaterOrEqual(t, x, byte(0x20), "byte %d of %q", i, b)
			}
			var got struct{ Before, After map[string]any }
			require.NoError(t, json.Unmarshal(b, &got), "%s", b)
			if got.After != nil {
				require.Equal(t, want, got.After["doc"])
			}
			if got.Before != nil {
				require.Equal(t, want, got.Before["doc"])
			}
		}
	}
}
