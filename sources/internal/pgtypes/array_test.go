package pgtypes

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// textElem decodes elements as strings, like a text[] does.
func textElem(b []byte) (any, error) { return string(b), nil }

func TestParseArray(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		delim byte
		want  []any
	}{
		{"empty", `{}`, ',', []any{}},
		{"empty with space", ` { } `, ',', []any{}},
		{"simple", `{1,2,3}`, ',', []any{"1", "2", "3"}},
		{"null", `{NULL,null,NuLl}`, ',', []any{nil, nil, nil}},
		{"quoted null is a string", `{"NULL"}`, ',', []any{"NULL"}},
		{"escaped null is a string", `{\NULL}`, ',', []any{"NULL"}},
		{"empty quoted", `{""}`, ',', []any{""}},
		{"quotes and backslashes", `{"a\"b","c\\d","\\\""}`, ',', []any{`a"b`, `c\d`, `\"`}},
		{"delimiters and braces quoted", `{"a,b","{c}","}"}`, ',', []any{"a,b", "{c}", "}"}},
		{"whitespace ignored around", `{ 1 , 2 ,3 }`, ',', []any{"1", "2", "3"}},
		{"whitespace kept inside unquoted", `{a b,  c d  }`, ',', []any{"a b", "c d"}},
		{"whitespace kept inside quoted", `{" a "}`, ',', []any{" a "}},
		{"escaped trailing space kept", `{a\ }`, ',', []any{"a "}},
		{"escaped delimiter", `{a\,b}`, ',', []any{"a,b"}},
		{"unicode", `{héllo,"wörld 🎉"}`, ',', []any{"héllo", "wörld 🎉"}},
		{"two dims", `{{1,2},{3,4}}`, ',', []any{[]any{"1", "2"}, []any{"3", "4"}}},
		{"three dims", `{{{1}},{{2}}}`, ',', []any{[]any{[]any{"1"}}, []any{[]any{"2"}}}},
		{"decorations dropped", `[0:1]={1,2}`, ',', []any{"1", "2"}},
		{"two decorations", `[-2:-1][5:6]={{1,NULL},{3,4}}`, ',', []any{[]any{"1", nil}, []any{"3", "4"}}},
		{"decoration without lower bound", `[2]={a,b}`, ',', []any{"a", "b"}},
		{"decoration with spaces", `[1:1] = {x}`, ',', []any{"x"}},
		{"box delimiter", `{(1,1),(0,0);(2,2),(1,1)}`, ';', []any{"(1,1),(0,0)", "(2,2),(1,1)"}},
		{"json element", `{"{\"a\": [1, 2]}",null}`, ',', []any{`{"a": [1, 2]}`, nil}},
		{"composite element", `{"(1,\"x y\")"}`, ',', []any{`(1,"x y")`}},
		{"nested array literal element", `{"{1,2}","{}"}`, ',', []any{"{1,2}", "{}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseArray([]byte(tt.in), tt.delim, textElem)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseArrayErrors(t *testing.T) {
	for _, in := range []string{
		``, `1,2`, `{`, `{1`, `{1,`, `{1,}`, `{,1}`, `{1}}`, `{1} x`, `{"a}`, `{"a\`, `{a\`,
		`{{1},2}`, `{1,{2}}`, `{a"b"}`, `{a{b}`, `[1:2]{1,2}`, `[1:2={1,2}`, `[a:b]={1}`, `[]={1}`,
		`{{{{{{{1}}}}}}}`, `[1][1][1][1][1][1][1]={1}`, `{"a"b}`,
	} {
		t.Run(in, func(t *testing.T) {
			_, err := parseArray([]byte(in), ',', textElem)
			assert.Error(t, err)
		})
	}
}

// formatArray writes v as array_out would, quoting every string.
func formatArray(v []any, delim byte) string {
	var sb strings.Builder
	var walk func([]any)
	walk = func(v []any) {
		sb.WriteByte('{')
		for i, e := range v {
			if i > 0 {
				sb.WriteByte(delim)
			}
			switch e := e.(type) {
			case nil:
				sb.WriteString("NULL")
			case []any:
				walk(e)
			case string:
				sb.WriteByte('"')
				for j := 0; j < len(e); j++ {
					if e[j] == '"' || e[j] == '\\' {
						sb.WriteByte('\\')
					}
					sb.WriteByte(e[j])
				}
				sb.WriteByte('"')
			}
		}
		sb.WriteByte('}')
	}
	walk(v)
	return sb.String()
}

// FuzzArrayParse checks that parsing never panics and that whatever parses
// survives a round trip through array_out's quoting.
func FuzzArrayParse(f *testing.F) {
	for _, s := range []string{
		`{}`, `{1,2,3}`, `{"a\"b",NULL,"NULL"}`, `{{1,2},{3,4}}`, `[0:1]={1,2}`, `{ a b , c }`,
		`{(1,1),(0,0);(2,2),(1,1)}`, `{"{\"a\": 1}"}`, `{\\,\"}`, `[1:1][2:2]={{x}}`, `{{{{{{1}}}}}}`,
	} {
		f.Add(s, byte(','))
	}
	f.Add(`{(1,1),(0,0);(2,2),(1,1)}`, byte(';'))
	f.Fuzz(func(t *testing.T, in string, delim byte) {
		if delim == '"' || delim == '\\' || delim == '{' || delim == '}' || isSpace(delim) {
			delim = ','
		}
		v, err := parseArray([]byte(in), delim, textElem)
		if err != nil {
			return
		}
		out := formatArray(v, delim)
		v2, err := parseArray([]byte(out), delim, textElem)
		if err != nil {
			t.Fatalf("re-parsing %q (from %q): %v", out, in, err)
		}
		if !assert.ObjectsAreEqual(v, v2) {
			t.Fatalf("round trip of %q: %#v, then %#v", in, v, v2)
		}
	})
}
