package sources

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseWhere(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Cond
	}{
		{"", nil},
		{"  ", nil},
		{"tenant_id = 42", []Cond{{"tenant_id", "=", []string{"42"}}}},
		{"Status <> 'it''s' and n>=-1.5e3", []Cond{{"status", "<>", []string{"it's"}}, {"n", ">=", []string{"-1.5e3"}}}},
		{`"Mixed Case" != 'x' AND done = false`, []Cond{{"Mixed Case", "<>", []string{"x"}}, {"done", "=", []string{"false"}}}},
		{"region IN ('eu','us' , 'a,b') and deleted_at is null", []Cond{{"region", "in", []string{"eu", "us", "a,b"}}, {"deleted_at", "is null", nil}}},
		{"x IS NOT NULL AND y in (true,false)", []Cond{{"x", "is not null", nil}, {"y", "in", []string{"true", "false"}}}},
		{"created < '2024-01-01 00:00:00+00'", []Cond{{"created", "<", []string{"2024-01-01 00:00:00+00"}}}},
		{"n = '1; DROP TABLE t; --'", []Cond{{"n", "=", []string{"1; DROP TABLE t; --"}}}},
	} {
		got, err := ParseWhere(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		// FormatWhere writes what ParseWhere reads back the same.
		again, err := ParseWhere(FormatWhere(got))
		require.NoError(t, err, FormatWhere(got))
		require.Equal(t, got, again, FormatWhere(got))
	}
}

// TestParseWhereRefusesSQL: nothing but the conditions of the grammar
// gets through: no OR, no statements, no comments, no functions, no
// subqueries, no unquoted keywords as columns.
func TestParseWhereRefusesSQL(t *testing.T) {
	for _, in := range []string{
		"id = 1 OR 1 = 1",
		"id = 1; DROP TABLE t",
		"id = 1 -- comment",
		"id = 1 /* x */",
		"(id = 1)",
		"id = (SELECT 1)",
		"id = now()",
		"id = other_column",
		"id IN (SELECT id FROM t)",
		"id = 1 AND",
		"AND id = 1",
		"id",
		"id =",
		"id = 'unterminated",
		`"unterminated = 1`,
		"id IS 1",
		"id IN ('a' 'b')",
		"id IN ('a'",
		"select = 1",
		"id = 1 ANDx = 2",
		"id == 1",
		"id = -",
	} {
		_, err := ParseWhere(in)
		require.Error(t, err, "%q must be refused", in)
		require.Contains(t, err.Error(), "where", in)
	}
}
