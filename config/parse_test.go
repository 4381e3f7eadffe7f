package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSyntaxErrors: a file that does not parse, or holds a key twice, is
// reported as file:line: what to change, one line per problem, at the line
// at fault (yaml.v3 often names the line where the enclosing mapping
// starts).
func TestSyntaxErrors(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string // after "<file>:"
	}{
		{"key twice at the top", "name: shop\nsinks:\n  main: {type: nats_core}\nsources: {}\nsinks:\n  other: {type: nats_core}\n",
			[]string{`5: key "sinks" appears twice (first at line 2)`}},
		{"key twice, nested and in a flow mapping, every one", "name: shop\nsources:\n  shop:\n    type: pgoutput\n    type: wal2json\nsinks: {main: {type: a, type: b}}\n",
			[]string{`5: key "sources.shop.type" appears twice (first at line 4)`, `6: key "sinks.main.type" appears twice (first at line 6)`}},
		{"tab indenting a key", "name: shop\nsources:\n  shop:\n\ttype: pgoutput\n",
			[]string{"4: a tab character: YAML indents with spaces only"}},
		{"tab before spaces", "name: shop\nsources:\n  shop:\n    config:\n\t  dsn: x\n",
			[]string{"5: a tab character: YAML indents with spaces only"}},
		{"tab at a top-level key", "name: shop\n\n\tsources: {}\n",
			[]string{"3: a tab character: YAML indents with spaces only"}},
		{"key indented less than its siblings", "name: shop\nsources:\n  shop:\n    type: pgoutput\n   config: {}\n",
			[]string{"5: this line does not fit the mapping it is in: indent it like the keys beside it, and check that quotes are closed"}},
		{"key indented under a value", "name: shop\n  sources: x\n",
			[]string{`2: unexpected ":" here: put a value that contains ": " in quotes, or indent this key like the keys beside it`}},
		{"colon in an unquoted value", "name: a: b\n",
			[]string{`1: unexpected ":" here: put a value that contains ": " in quotes, or indent this key like the keys beside it`}},
		{"list item out of line", "routes:\n  - sinks: [main]\n   subject: x\n",
			[]string{"3: this line does not fit the list it is in: indent every item's - like the first one's"}},
		{"unclosed list", "name: shop\nsources: [a, b\n",
			[]string{"2: did not find expected ',' or ']': a [...] or {...} is not closed, or an item in it needs quotes"}},
		{"unclosed quote", "name: shop\nsources: \"abc\nsinks: {}\n",
			[]string{"2: the file ends inside a quoted value or a [...] or {...}: close it"}},
		{"reserved first character", "name: shop\nsources: {}\nsinks: @main\n",
			[]string{"3: a value starts with a character YAML reserves (such as @ or `): put the value in quotes"}},
		{"key without a colon", "name: shop\nsources\n  shop: {}\n",
			[]string{`2: a key without ":" (or a value running on past its line): write "key: value", and quote values that span lines`}},
		{"a list, not a mapping", "- a\n- b\n",
			[]string{"1: the file must be a mapping of keys (name:, sources:, sinks:, ...), not a list"}},
		{"a string, not a mapping", "name shop\n",
			[]string{"1: the file must be a mapping of keys (name:, sources:, sinks:, ...), not a string"}},
		{"a list as a key", "name: shop\nsources:\n  [a, b]: x\n",
			[]string{"3: a key must be a name, not a list (under sources)"}},
		{"two documents", "name: shop\n---\nname: other\n",
			[]string{"2: a second YAML document (after ---): the bridge reads one document per file; remove the --- and merge the two"}},
		{"unknown alias", "sinks: &s {}\nsources: *nope\n",
			[]string{"2: unknown anchor 'nope' referenced"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bridge.yaml")
			require.NoError(t, os.WriteFile(p, []byte(tt.doc), 0o600))
			cfg, err := Load(p, environ())
			require.Error(t, err)
			assert.Nil(t, cfg)
			var errs Errors
			assert.False(t, errors.As(err, &errs), "a syntax error is not a FieldError")
			var want []string
			for _, w := range tt.want {
				want = append(want, p+":"+w)
			}
			var got []string
			for _, e := range flattenJoined(err) {
				var se *SyntaxError
				require.ErrorAs(t, e, &se)
				got = append(got, se.Error())
			}
			assert.Equal(t, want, got)
		})
	}
}

// TestSyntaxAccepted: what parses stays accepted: a leading ---, an empty
// trailing document, a file of comments, tabs inside values, anchors and
// merge keys.
func TestSyntaxAccepted(t *testing.T) {
	for name, doc := range map[string]string{
		"leading ---":        "---\n" + base,
		"empty trailing doc": base + "---\n",
		"tab after a colon":  base + "unrouted:\tdrop\n",
		"anchor and merge":   base + "x-retry: &r {initial: 1s}\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadYAML(t, doc)
			if name == "anchor and merge" { // parses; the extra key is then unknown
				assert.Equal(t, []string{"x-retry: unknown key (known: checkpoint, config, data_dir, http, log, name, nats, routes, schemas, serve, shutdown, sinks, sources, telemetry, unrouted)"}, problems(t, err))
				return
			}
			require.NoError(t, err)
		})
	}
	t.Run("only comments", func(t *testing.T) {
		_, err := loadYAML(t, "# nothing yet\n")
		assert.Equal(t, []string{"name: must be set", "sources: at least one source is required"}, problems(t, err))
	})
	t.Run("merge key", func(t *testing.T) {
		cfg, err := loadYAML(t, base+"checkpoint:\n  <<: {interval: 3s}\n  bucket: b\n")
		require.NoError(t, err)
		assert.Equal(t, "b", cfg.Checkpoint.Bucket)
		assert.Equal(t, "3s", cfg.Checkpoint.Interval.String())
	})
}

// flattenJoined returns the errors joined in err, or err itself.
func flattenJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
