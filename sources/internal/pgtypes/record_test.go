package pgtypes

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

func TestSplitRecord(t *testing.T) {
	s := func(v string) []byte { return []byte(v) }
	for _, tt := range []struct {
		in   string
		want [][]byte
	}{
		{`()`, [][]byte{nil}},
		{`(1,2)`, [][]byte{s("1"), s("2")}},
		{`(,)`, [][]byte{nil, nil}},
		{`("",x)`, [][]byte{s(""), s("x")}},
		{`("a,b","(c)","d""e","f\\g")`, [][]byte{s("a,b"), s("(c)"), s(`d"e`), s(`f\g`)}},
		{`(a\,b,c\)d)`, [][]byte{s("a,b"), s("c)d")}},
		{`("{""a b"",NULL}","(1,""x"")")`, [][]byte{s(`{"a b",NULL}`), s(`(1,"x")`)}},
		{` (x) `, [][]byte{s("x")}},
		{`(a"b,c"d)`, [][]byte{s("ab,cd")}},
	} {
		t.Run(tt.in, func(t *testing.T) {
			got, err := splitRecord([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	for _, in := range []string{``, `x`, `(`, `(a`, `("a)`, `(a)x`, `(a\`} {
		_, err := splitRecord([]byte(in))
		assert.Error(t, err, in)
	}
}

func TestDecodeRecord(t *testing.T) {
	intT, textT := builtins[23], builtins[25]
	inner := &Type{Name: "public.inner", Kind: Composite, Fields: []Field{{"n", intT}}, names: []string{"n"}}
	typ := &Type{Name: "public.outer", Kind: Composite, Fields: []Field{{"a", intT}, {"b", textT}, {"c", inner}}, names: []string{"a", "b", "c"}}
	v, err := typ.DecodeText([]byte(`(1,"x y","(2)")`))
	require.NoError(t, err)
	assert.Equal(t, cdc.Record{Names: []string{"a", "b", "c"}, Values: []any{int64(1), "x y",
		cdc.Record{Names: []string{"n"}, Values: []any{int64(2)}, Text: "(2)"}}, Text: `(1,"x y","(2)")`}, v)

	// A value written before ALTER TYPE added a field keeps its text.
	v, err = typ.DecodeText([]byte(`(1,x,"(2)",4)`))
	require.NoError(t, err)
	assert.Equal(t, `(1,x,"(2)",4)`, v)

	// A field that does not decode names the field and its type.
	_, err = typ.DecodeText([]byte(`(one,x,)`))
	require.ErrorContains(t, err, "decoding public.outer value \"(one,x,)\": field a of type int4: invalid integer")
}
