package pgtypes

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFormatMatchesCatalog checks the types formatted without the server
// against format_type: every built-in type without a modifier, and the
// types that take one with a few (as atttypmod holds them).
func TestFormatMatchesCatalog(t *testing.T) {
	conn := resolverDB(t, "formats")
	type tm struct {
		oid uint32
		mod int32
	}
	cases := []tm{
		{1043, 24}, {1015, 24}, {1042, 9}, {1014, 5}, {1700, 10<<16 | 2 + 4}, {1700, 38<<16 + 4}, {1231, 12<<16 | 4 + 4},
		{1083, 3}, {1266, 0}, {1114, 6}, {1115, 3}, {1184, 3}, {1185, 0}, {1560, 5}, {1562, 12}, {1563, 7},
	}
	if s := server(t); s.Major >= 15 {
		cases = append(cases, tm{1700, 5<<16 | (-2 & 0x7ff) + 4}) // numeric(5,-2)
	}
	for oid := range builtins {
		cases = append(cases, tm{oid, -1})
	}
	for _, c := range cases {
		got, ok := formatBuiltin(c.oid, c.mod)
		require.True(t, ok, "%d(%d)", c.oid, c.mod)
		var want string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT format_type($1, $2)`, c.oid, c.mod).Scan(&want))
		assert.Equal(t, want, got, "format_type(%d, %d)", c.oid, c.mod)
	}
	_, ok := formatBuiltin(1186, 3)
	require.False(t, ok, "an interval's modifier is the server's to print")

	r := NewResolver(conn)
	d, err := r.DeclaredMod(t.Context(), 1186, 0x7fff0000|3)
	require.NoError(t, err)
	require.Equal(t, "interval(3)", d)
	d, err = r.DeclaredMod(t.Context(), 23, -1)
	require.NoError(t, err)
	require.Empty(t, d)
	d, err = r.Declared(t.Context(), 1043, "character varying")
	require.NoError(t, err)
	require.Empty(t, d)
	d, err = r.Declared(t.Context(), 1043, "character varying(20)")
	require.NoError(t, err)
	require.Equal(t, "character varying(20)", d)
}
