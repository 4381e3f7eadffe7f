package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"USER": "alice", "PASS": "s3cret", "EMPTY": "", "PORT": "5432", "lower_1": "x"}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	tests := []struct {
		name, in, want string
		substituted    bool
		err            string
	}{
		{name: "no references", in: "plain text", want: "plain text"},
		{name: "set", in: "${USER}", want: "alice", substituted: true},
		{name: "several with text", in: "postgres://${USER}:${PASS}@db:${PORT}/x", want: "postgres://alice:s3cret@db:5432/x", substituted: true},
		{name: "set but empty", in: "[${EMPTY}]", want: "[]", substituted: true},
		{name: "lowercase and digits in name", in: "${lower_1}", want: "x", substituted: true},
		{name: "default when unset", in: "${NOPE:-fallback}", want: "fallback", substituted: true},
		{name: "default when empty", in: "${EMPTY:-fallback}", want: "fallback", substituted: true},
		{name: "empty default", in: "${NOPE:-}", want: "", substituted: true},
		{name: "value wins over default", in: "${USER:-bob}", want: "alice", substituted: true},
		{name: "default with colons and slashes", in: "${NOPE:-nats://h:4222}", want: "nats://h:4222", substituted: true},
		{name: "nested default", in: "${NOPE:-${USER}}", want: "alice", substituted: true},
		{name: "unused default may reference an unset variable", in: "${USER:-${NOPE}}", want: "alice", substituted: true},
		{name: "dollar dollar", in: "pa$$word", want: "pa$word"},
		{name: "dollar dollar before brace is literal", in: "$${USER}", want: "${USER}"},
		{name: "dollar dollar in default", in: "${NOPE:-a$$b}", want: "a$b", substituted: true},
		{name: "unset", in: "x${NOPE}y", err: "environment variable NOPE is not set (use ${NOPE:-default} for a default)"},
		{name: "unset inside used default", in: "${NOPE:-${ALSO_NOPE}}", err: "environment variable ALSO_NOPE is not set (use ${ALSO_NOPE:-default} for a default)"},
		{name: "bare dollar", in: "pa$word", err: "bare $ at offset 2 (write $$ for a literal $, or ${NAME} to expand a variable)"},
		{name: "trailing dollar", in: "price$", err: "bare $ at offset 5 (write $$ for a literal $, or ${NAME} to expand a variable)"},
		{name: "unterminated", in: "${USER", err: "unterminated ${USER at offset 0"},
		{name: "unterminated default", in: "a ${USER:-x", err: "unterminated ${USER:- at offset 2"},
		{name: "no name", in: "${}", err: "invalid reference at offset 0: ${ must be followed by a variable name"},
		{name: "name starting with a digit", in: "${1X}", err: "invalid reference at offset 0: ${ must be followed by a variable name"},
		{name: "unsupported operator", in: "${USER:?required}", err: "invalid reference ${USER at offset 0: only ${NAME} and ${NAME:-default} are supported"},
		{name: "dash without colon", in: "${USER-x}", err: "invalid reference ${USER at offset 0: only ${NAME} and ${NAME:-default} are supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, substituted, err := expand(tt.in, lookup)
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.substituted, substituted)
		})
	}
}

func TestScalar(t *testing.T) {
	tests := []struct {
		in   string
		want any
	}{
		{"500", 500},
		{"-3", -3},
		{"1.5", 1.5},
		{"true", true},
		{"false", false},
		{"2s", "2s"},
		{"abc", "abc"},
		{"", ""},
		{"null", "null"},
		{"~", "~"},
		{" 5", " 5"},
		{"5 # comment", "5 # comment"},
		{`"5"`, `"5"`},
		{"[1, 2]", "[1, 2]"},
		{"a: b", "a: b"},
		{"{x}", "{x}"},
		{"line1\nline2", "line1\nline2"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			assert.Equal(t, tt.want, scalar(tt.in))
		})
	}
}
