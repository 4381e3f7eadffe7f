package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"
)

// decodeBody decodes a message's JSON payload into what encoding/json
// gives for a map[string]any (objects as map[string]any, arrays as []any,
// numbers as float64), the same values and the same errors. The e2e tests
// read every message of their streams back, up to a few hundred thousand
// in a run, and under -race encoding/json's reflection made that decoding
// a fifth of the test process's CPU; this is about four times cheaper.
//
// fastjson takes only what it decodes exactly as encoding/json does: valid
// UTF-8, no \u escapes (encoding/json's handling of invalid surrogates
// differs), an object at the top, and JSON that fastjson.Validate accepts;
// numbers are parsed from their text by strconv.ParseFloat, as
// encoding/json does. Anything else goes to encoding/json, so errors stay
// encoding/json's. TestDecodeBodyMatchesEncodingJSON holds it to that.
func decodeBody(data []byte) (map[string]any, error) {
	if bytes.Contains(data, []byte(`\u`)) || !utf8.Valid(data) || fastjson.ValidateBytes(data) != nil {
		return stdBody(data)
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(data)
	if err != nil || v.Type() != fastjson.TypeObject {
		return stdBody(data)
	}
	out, err := fromFastJSON(v)
	if err != nil {
		return stdBody(data)
	}
	return out.(map[string]any), nil
}

func stdBody(data []byte) (map[string]any, error) {
	var body map[string]any
	err := json.Unmarshal(data, &body)
	return body, err
}

func fromFastJSON(v *fastjson.Value) (any, error) {
	switch v.Type() {
	case fastjson.TypeObject:
		o, _ := v.Object()
		m := make(map[string]any, o.Len())
		var err error
		o.Visit(func(k []byte, x *fastjson.Value) {
			if err != nil {
				return
			}
			var xv any
			if xv, err = fromFastJSON(x); err == nil {
				m[string(k)] = xv // a repeated key: the last wins, as in encoding/json
			}
		})
		return m, err
	case fastjson.TypeArray:
		a, _ := v.Array()
		out := make([]any, len(a))
		for i, x := range a {
			xv, err := fromFastJSON(x)
			if err != nil {
				return nil, err
			}
			out[i] = xv
		}
		return out, nil
	case fastjson.TypeString:
		return string(v.GetStringBytes()), nil
	case fastjson.TypeNumber:
		return strconv.ParseFloat(string(v.MarshalTo(nil)), 64)
	case fastjson.TypeTrue:
		return true, nil
	case fastjson.TypeFalse:
		return false, nil
	case fastjson.TypeNull:
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected JSON value type %s", v.Type())
}

// jsonText returns the JSON text of the value at path in v ("2" for the
// number 2, as the writers record numbers with %d), or "<none>".
func jsonText(v *fastjson.Value, path ...string) string {
	if x := v.Get(path...); x != nil {
		return x.String()
	}
	return "<none>"
}

// TestDecodeBodyMatchesEncodingJSON: decodeBody gives what encoding/json
// gives, value for value, and fails where it fails.
func TestDecodeBodyMatchesEncodingJSON(t *testing.T) {
	defer parallel(t)()
	for _, in := range []string{
		`{"op":"insert","source":"kill","schema":"public","table":"kt","commit_lsn":"0/1507B88","lsn":"0/15079A0","seq":3,"tx_size":5,"xid":726,"key":{"id":12345},"before":null,"after":{"id":12345,"w":2,"n":4711,"v":0,"pad":"abc"}}`,
		`{"a":[1,2.5,-0,1e3,1E-7,123456789012345678901234567890,9007199254740993,0.1,-1.7976931348623157e308,5e-324],"b":[[],{}],"c":true,"d":false,"e":null}`,
		`{"s":"tab\tnl\nquote\"slash\/back\\\\ bell\b ff\f cr\r","é":"ünïcödé 日本 🎉"}`,
		`{"k":1,"k":2}`,
		`{"nested":{"deep":{"deeper":[{"x":"y"},[null,true]]}}}`,
		`{}`,
		`  {"ws" : [ 1 , 2 ] }  `,
		// to encoding/json: escapes, surrogates, invalid UTF-8
		`{"u":"\u00e9\u003c\ud83c\udf89"}`,
		`{"lone":"\ud800x"}`,
		"{\"bad\":\"\xff\xfe\"}",
		// errors
		`{"unterminated":"x}`,
		`{"trailing":1,}`,
		`{"bad escape":"\q"}`,
		`{"big":1e400}`,
		`{"ctl":"a` + "\x01" + `b"}`,
		`[1,2]`,
		`"str"`,
		`null`,
		``,
		`{"a":1} {"b":2}`,
		`{"a":01}`,
		`{"a":.5}`,
		`{"a":NaN}`,
	} {
		want, wantErr := stdBody([]byte(in))
		got, err := decodeBody([]byte(in))
		if wantErr != nil {
			require.Error(t, err, "%q: encoding/json refuses it (%v)", in, wantErr)
			require.Equal(t, wantErr.Error(), err.Error(), "%q", in)
			continue
		}
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
}
