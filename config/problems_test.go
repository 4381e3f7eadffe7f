package config

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProblemsInFileOrder: problems print in the order of the file, not of
// their paths; a problem that follows from another prints after it; keys
// from no line of the file (environment, defaults) come last.
func TestProblemsInFileOrder(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		env  []string
		want []string
	}{
		{
			name: "sinks written as a list: the cause before the route that names a sink",
			doc: `name: shop
routes:
  - sinks: [main]
sources:
  shop: {type: pgoutput}
sinks:
  - name: main
    type: nats_jetstream
`,
			want: []string{
				"sinks: expected a mapping, got a list",
				`routes[0].sinks[0]: no sink named "main": the sinks section could not be read (see above)`,
			},
		},
		{
			name: "sources written as a list: the cause before match.sources",
			doc: `name: shop
routes:
  - sinks: [main]
    match: {sources: [shop]}
sinks:
  main: {type: nats_core}
sources: [shop]
`,
			want: []string{
				"sources: expected a mapping, got a list",
				`routes[0].match.sources[0]: no source named "shop": the sources section could not be read (see above)`,
			},
		},
		{
			name: "by line, not by path",
			doc: `unrouted: sometimes
name: "my bridge"
sources:
  shop: {type: pgoutput}
sinks:
  main: {type: nats_core, batch: {max_changes: 0}}
routes:
  - sinks: [mian]
    match: {ops: [upsert]}
log: {level: loud}
`,
			want: []string{
				`unrouted: must be one of drop, error, got "sometimes"`,
				`name: must match ^[A-Za-z0-9_-]+$, got "my bridge"`,
				`sinks.main.batch.max_changes: must be > 0, got 0`,
				`routes[0].sinks[0]: no sink named "mian" (defined: main)`,
				`routes[0].match.ops[0]: unknown op "upsert" (known: insert, update, delete, truncate, message, read, control, schema, ddl)`,
				`log.level: must be one of debug, info, warn, error, got "loud"`,
			},
		},
		{
			name: "a key left out and a variable's key after the file's",
			doc: `sources:
  shop: {type: pgoutput}
sinks:
  main: {type: nats_core, retry: {max: 0s}}
routes:
  - sinks: [main]
`,
			env: []string{"BRIDGE_CHECKPOINT__INTERVAL=0s", "BRIDGE_SINKS__MAIN__BATCH__MAX_CHANGES=-1"},
			want: []string{
				"sinks.main.retry.max: must be > 0, got 0s",
				"checkpoint.interval: must be > 0, got 0s (set by environment variable BRIDGE_CHECKPOINT__INTERVAL)",
				"name: must be set",
				"sinks.main.batch.max_changes: must be > 0, got -1 (set by environment variable BRIDGE_SINKS__MAIN__BATCH__MAX_CHANGES)",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, tt.doc, environ(tt.env...))
			assert.Equal(t, tt.want, problems(t, err))
		})
	}
}

// TestProblemsMerge: Config.Problems merges Load's problems with those the
// runtime finds in the same Config, in one file order, dropping a later
// problem at a path an earlier one names and naming the variable that set
// a key.
func TestProblemsMerge(t *testing.T) {
	doc := `name: shop
sources:
  shop:
    type: pgoutput
    config: {tabels: [x]}
sinks:
  main: {type: nats_jetstrem}
routes:
  - sinks: [mian]
    format: avro
`
	cfg, err := loadYAML(t, doc, environ("BRIDGE_SERVE__WHERE__EQ=x"))
	require.NotNil(t, cfg)
	// What the runtime would find, in its own order.
	app := errors.Join(
		&FieldError{Path: "routes[0].format", Msg: `unknown format "avro"`},
		&FieldError{Path: "routes[0].sinks[0]", Msg: `no sink named "mian"`}, // Load said it
		&FieldError{Path: "serve.where", Msg: "eq needs two operands"},
		errors.New("a problem without a path\nin two lines"),
		&FieldError{Path: "sinks.main.type", Msg: `unknown sink type "nats_jetstrem"`},
		&FieldError{Path: "sources.shop.config.tabels", Msg: "unknown key"},
	)
	got := problems(t, cfg.Problems(err, app))
	assert.Equal(t, []string{
		"sources.shop.config.tabels: unknown key",
		`sinks.main.type: unknown sink type "nats_jetstrem"`,
		`routes[0].sinks[0]: no sink named "mian" (defined: main)`,
		`routes[0].format: unknown format "avro"`,
		"a problem without a path",
		"in two lines",
		"serve.where: eq needs two operands (set by environment variable BRIDGE_SERVE__WHERE__EQ)",
	}, got)

	t.Run("nothing to report", func(t *testing.T) {
		assert.NoError(t, cfg.Problems(nil, nil))
	})
	t.Run("no Config: by path", func(t *testing.T) {
		got := problems(t, (*Config)(nil).Problems(errors.Join(Field("b", "2"), Field("a", "1"))))
		assert.Equal(t, []string{"a: 1", "b: 2"}, got)
	})
	t.Run("the callers' errors are not changed", func(t *testing.T) {
		fe := &FieldError{Path: "serve.where", Msg: "bad"}
		_ = cfg.Problems(fe)
		assert.Equal(t, "bad", fe.Msg)
	})
}

// TestDecoderInFileOrder: the Decoder of a loaded Config reports a plugin
// block's problems in the order of the file.
func TestDecoderInFileOrder(t *testing.T) {
	cfg, err := loadYAML(t, withBase(t, "sinks: {main: {config: {zz_unknown: 1, stream: 5}}}"))
	require.NoError(t, err)
	// withBase marshals keys sorted: stream is written before zz_unknown.
	c := defaultPlugin()
	got := problems(t, cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c))
	require.Len(t, got, 2)
	assert.Contains(t, got[0], "sinks.main.config.stream: expected a string")
	assert.Contains(t, got[1], "sinks.main.config.zz_unknown: unknown key")

	doc := `name: shop
sources: {shop: {type: pgoutput}}
sinks:
  main:
    type: nats_core
    config:
      zz_unknown: 1
      stream: 5
routes: [{sinks: [main]}]
`
	cfg, err = loadYAML(t, doc)
	require.NoError(t, err)
	got = problems(t, cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c))
	require.Len(t, got, 2)
	assert.Contains(t, got[0], "sinks.main.config.zz_unknown: unknown key")
	assert.Contains(t, got[1], "sinks.main.config.stream: expected a string")
}

// TestProblemsOverridesLate: a problem at a key an override (a flag) set
// prints after the file's, even when the file has the key too.
func TestProblemsOverridesLate(t *testing.T) {
	doc := `name: shop
serve:
  max_conns: 5
sources: {shop: {type: pgoutput}}
sinks: {main: {type: nats_core}}
routes: [{sinks: [main]}]
unrouted: never
`
	_, err := loadYAML(t, doc, WithOverrides(map[string]any{"serve": map[string]any{"max_conns": 0}}))
	assert.Equal(t, []string{
		`unrouted: must be one of drop, error, got "never"`,
		"serve.max_conns: must be > 0, got 0",
	}, problems(t, err))
}
