package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"USER": "alice", "PASS": "s3cret", "EMPTY": "", "PORT": "5432", "lower_1": "x", "DIR": "/run/secrets", "file": "var"}
	files := map[string]string{"/run/secrets/pw": "filePw", "/run/secrets/port": "6543", "/s/empty": "", "rel/pw": "relPw", "/s/dollar": "pa$word ${USER}"}
	var read []string
	r := resolver{
		env: func(n string) (string, bool) { v, ok := vars[n]; return v, ok },
		file: func(p string) (string, error) {
			read = append(read, p)
			if v, ok := files[p]; ok {
				return v, nil
			}
			return "", fmt.Errorf("no file %s", p)
		},
	}
	tests := []struct {
		name, in, want string
		substituted    bool
		err            string
		read           []string // the files read, in order
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
		{name: "unsupported operator", in: "${USER:?required}", err: "invalid reference ${USER at offset 0: only ${NAME}, ${NAME:-default} and ${file:PATH} are supported"},
		{name: "dash without colon", in: "${USER-x}", err: "invalid reference ${USER at offset 0: only ${NAME}, ${NAME:-default} and ${file:PATH} are supported"},
		{name: "colon on another variable", in: "${USER:/x}", err: "invalid reference ${USER at offset 0: only ${NAME}, ${NAME:-default} and ${file:PATH} are supported"},

		{name: "file", in: "${file:/run/secrets/pw}", want: "filePw", substituted: true, read: []string{"/run/secrets/pw"}},
		{name: "file inside a DSN", in: "postgres://app:${file:/run/secrets/pw}@db/app", want: "postgres://app:filePw@db/app", substituted: true, read: []string{"/run/secrets/pw"}},
		{name: "empty file", in: "[${file:/s/empty}]", want: "[]", substituted: true, read: []string{"/s/empty"}},
		{name: "relative path", in: "${file:rel/pw}", want: "relPw", substituted: true, read: []string{"rel/pw"}},
		{name: "reference in the path", in: "${file:${DIR}/pw}", want: "filePw", substituted: true, read: []string{"/run/secrets/pw"}},
		{name: "default in the path", in: "${file:${NOPE:-/run/secrets}/port}", want: "6543", substituted: true, read: []string{"/run/secrets/port"}},
		{name: "file as a default", in: "${NOPE:-${file:/run/secrets/pw}}", want: "filePw", substituted: true, read: []string{"/run/secrets/pw"}},
		{name: "unused default reads no file", in: "${USER:-${file:/missing}}", want: "alice", substituted: true},
		{name: "variable named file", in: "${file}", want: "var", substituted: true},
		{name: "variable named file with a default", in: "${file:-x}", want: "var", substituted: true},
		{name: "file content is not expanded", in: "${file:/s/dollar}$$", want: "pa$word ${USER}$", substituted: true, read: []string{"/s/dollar"}},
		{name: "missing file", in: "x${file:/missing}", err: "no file /missing", read: []string{"/missing"}},
		{name: "missing file in a used default", in: "${NOPE:-${file:/missing}}", err: "no file /missing", read: []string{"/missing"}},
		{name: "unset variable in the path", in: "${file:${NOPE}/pw}", err: "environment variable NOPE is not set (use ${NOPE:-default} for a default)"},
		{name: "empty path", in: "${file:}", err: "invalid reference ${file:} at offset 0: name the file, e.g. ${file:/run/secrets/pg_password}"},
		{name: "unterminated file", in: "a ${file:/run/secrets/pw", err: "unterminated ${file: at offset 2"},
		{name: "bare dollar in the path", in: "${file:/a$b}", err: "bare $ at offset 9 (write $$ for a literal $, or ${NAME} to expand a variable)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read = nil
			got, substituted, err := expand(tt.in, r)
			assert.Equal(t, tt.read, read, "files read")
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

func TestReadFileRef(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	for _, tt := range []struct{ name, content, want string }{
		{"plain", "s3cret", "s3cret"},
		{"trailing newline", "s3cret\n", "s3cret"},
		{"trailing CRLF and blank lines", "s3cret\r\n\r\n", "s3cret"},
		{"inner newline and spaces kept", " a\nb ", " a\nb "},
		{"dollar kept", "pa$word ${X}", "pa$word ${X}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readFileRef(write(strings.ReplaceAll(tt.name, " ", "_"), tt.content))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	t.Run("missing", func(t *testing.T) {
		p := filepath.Join(dir, "nope")
		_, err := readFileRef(p)
		require.EqualError(t, err, "file "+p+" (${file:...}) does not exist: mount the secret there, or correct the path")
	})
	t.Run("directory", func(t *testing.T) {
		_, err := readFileRef(dir)
		require.EqualError(t, err, "file "+dir+" (${file:...}) is a directory: name the file inside it")
	})
	t.Run("too large", func(t *testing.T) {
		p := write("big", strings.Repeat("x", maxFileRef+1))
		_, err := readFileRef(p)
		require.EqualError(t, err, "file "+p+" (${file:...}) is larger than 1 MiB: ${file:...} reads secrets, check the path")
		exact := write("exact", strings.Repeat("x", maxFileRef))
		got, err := readFileRef(exact)
		require.NoError(t, err)
		assert.Len(t, got, maxFileRef)
	})
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
