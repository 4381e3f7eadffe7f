package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEnvNamedInPluginErrors: a problem the Decoder finds in a plugin block
// at a key a BRIDGE_* variable set names the variable, as Load's own
// problems do.
func TestEnvNamedInPluginErrors(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"wrong type", []string{"BRIDGE_SINKS__MAIN__CONFIG__SMALL=abc"},
			"sinks.main.config.small: expected an integer, got a string (set by environment variable BRIDGE_SINKS__MAIN__CONFIG__SMALL)"},
		{"unknown key", []string{"BRIDGE_SINKS__MAIN__CONFIG__MAX_PENDNG=5"},
			"sinks.main.config.max_pendng: unknown key (known: ack_wait, addr, any, count, extra, headers, level, limits, pair, ratio, retries, small, stream, subjects, tables, tls, untagged, url) (set by environment variable BRIDGE_SINKS__MAIN__CONFIG__MAX_PENDNG)"},
		{"plugin's Validate", []string{"BRIDGE_SINKS__MAIN__CONFIG__ACK_WAIT=-1s"},
			"sinks.main.config.ack_wait: must be > 0, got -1s (set by environment variable BRIDGE_SINKS__MAIN__CONFIG__ACK_WAIT)"},
		{"inside a nested block", []string{"BRIDGE_SINKS__MAIN__CONFIG__TLS__INSECURE=maybe"},
			"sinks.main.config.tls.insecure: expected a boolean, got a string (set by environment variable BRIDGE_SINKS__MAIN__CONFIG__TLS__INSECURE)"},
		{"a block's key that a single underscore hides", []string{"BRIDGE_SINKS__MAIN__CONFIG_STREAM=x"},
			"sinks.main.config_stream: unknown key (known: batch, config, retry, type) (set by environment variable BRIDGE_SINKS__MAIN__CONFIG_STREAM; did you mean BRIDGE_SINKS__MAIN__CONFIG__STREAM?)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadYAML(t, base, environ(tt.env...))
			if err != nil { // a framework key: Load reports it
				assert.Equal(t, []string{tt.want}, problems(t, err))
				return
			}
			c := defaultPlugin()
			c.AckWait = 1
			err = cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c)
			assert.Equal(t, []string{tt.want}, problems(t, err))
		})
	}
	t.Run("a key from the file is not blamed on a variable", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "sinks: {main: {config: {small: abc}}}"), environ("BRIDGE_SINKS__MAIN__CONFIG__URL=nats://x"))
		require.NoError(t, err)
		c := defaultPlugin()
		err = cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c)
		assert.Equal(t, []string{"sinks.main.config.small: expected an integer, got a string"}, problems(t, err))
	})
}

// TestEnvLists: a list of plain values can be set from one variable,
// comma-separated or as a YAML flow list; a list of mappings and single
// items cannot, and the refusal says what to do.
func TestEnvLists(t *testing.T) {
	t.Run("comma-separated, in the framework and in a plugin block", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "serve: {tables: [public.x]}"), environ(
			"BRIDGE_SERVE__TABLES=public.a, public.b",
			"BRIDGE_SINKS__MAIN__CONFIG__SUBJECTS=cdc.>,audit.*",
			"BRIDGE_SINKS__MAIN__CONFIG__PAIR=1,2"))
		require.NoError(t, err)
		assert.Equal(t, []string{"public.a", "public.b"}, cfg.Serve.Tables)
		c := defaultPlugin()
		require.NoError(t, cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c))
		assert.Equal(t, []string{"cdc.>", "audit.*"}, c.Subjects)
		assert.Equal(t, [2]int{1, 2}, c.Pair)
	})
	t.Run("items that look like numbers stay strings as written", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ("BRIDGE_SINKS__MAIN__CONFIG__SUBJECTS=007,true,1.50"))
		require.NoError(t, err)
		c := defaultPlugin()
		require.NoError(t, cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c))
		assert.Equal(t, []string{"007", "true", "1.50"}, c.Subjects)
	})
	t.Run("a YAML flow list for items with commas", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ(`BRIDGE_SINKS__MAIN__CONFIG__SUBJECTS=[a, "b,c", '7']`))
		require.NoError(t, err)
		c := defaultPlugin()
		require.NoError(t, cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c))
		assert.Equal(t, []string{"a", "b,c", "7"}, c.Subjects)
	})
	t.Run("one item, and empty for an empty list", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "serve: {tables: [public.x]}"), environ("BRIDGE_SERVE__TABLES="))
		require.NoError(t, err)
		assert.Empty(t, cfg.Serve.Tables)
		cfg, err = loadYAML(t, base, environ("BRIDGE_SERVE__TABLES=public.a"))
		require.NoError(t, err)
		assert.Equal(t, []string{"public.a"}, cfg.Serve.Tables)
	})
	tests := []struct {
		name string
		env  string
		want string
	}{
		{"an item's problem at its index", "BRIDGE_SERVE__TABLES=public.a,orders",
			`serve.tables[1]: must be a schema.table name such as public.orders (globs are not supported), got "orders" (set by environment variable BRIDGE_SERVE__TABLES)`},
		{"an empty item", "BRIDGE_SERVE__TABLES=public.a,,public.b",
			"serve.tables: item 2 is empty (a stray comma?) (set by environment variable BRIDGE_SERVE__TABLES)"},
		{"a bad flow list", "BRIDGE_SERVE__TABLES=[public.a",
			`serve.tables: starts with "[" but is not a YAML flow list such as [public.a, "x,y"] (set by environment variable BRIDGE_SERVE__TABLES)`},
		{"a list of mappings", "BRIDGE_ROUTES=main",
			"routes: a list of mappings cannot be set from an environment variable: write it in the file (a value there can be a ${VAR} reference) (set by environment variable BRIDGE_ROUTES)"},
		{"an item of a list of mappings", "BRIDGE_ROUTES__0__SUBJECT=x",
			"routes: expected a list, got a mapping: list items cannot be set one by one from the environment; set the whole list in the file (set by environment variable BRIDGE_ROUTES__0__SUBJECT)"},
		{"an item of a list of values", "BRIDGE_SERVE__TABLES__0=public.a",
			"serve.tables: expected a list, got a mapping: list items cannot be set one by one from the environment; set the whole list in one variable, comma-separated, or in the file (set by environment variable BRIDGE_SERVE__TABLES__0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, base, environ(tt.env))
			assert.Equal(t, []string{tt.want}, problems(t, err))
		})
	}
	t.Run("a list in a plugin block", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ("BRIDGE_SINKS__MAIN__CONFIG__TABLES=a,b"))
		require.NoError(t, err)
		c := defaultPlugin()
		err = cfg.Decoder("sinks.main.config", cfg.Sinks["main"].Config)(&c)
		assert.Equal(t, []string{"sinks.main.config.tables: a list of mappings cannot be set from an environment variable: write it in the file (a value there can be a ${VAR} reference) (set by environment variable BRIDGE_SINKS__MAIN__CONFIG__TABLES)"}, problems(t, err))
	})
	t.Run("a string in the file is still not a list", func(t *testing.T) {
		_, err := loadYAML(t, withBase(t, "serve: {tables: public.a}"))
		assert.Equal(t, []string{"serve.tables: expected a list, got a string"}, problems(t, err))
	})
}

// TestEnvNames: which BRIDGE_* variables are read, which are reported as
// typos, and which are ignored (Kubernetes sets BRIDGE_SERVICE_HOST and
// friends in every pod of a namespace with a Service named bridge).
func TestEnvNames(t *testing.T) {
	kubernetes := []string{
		"BRIDGE_PORT=tcp://10.0.0.7:8080",
		"BRIDGE_SERVICE_HOST=10.0.0.7",
		"BRIDGE_SERVICE_PORT=8080",
		"BRIDGE_SERVICE_PORT_HTTP=8080",
		"BRIDGE_PORT_8080_TCP=tcp://10.0.0.7:8080",
		"BRIDGE_PORT_8080_TCP_PROTO=tcp",
		"BRIDGE_PORT_8080_TCP_PORT=8080",
		"BRIDGE_PORT_8080_TCP_ADDR=10.0.0.7",
		// A Service named bridge-nats: a known section's name, then one underscore.
		"BRIDGE_NATS_SERVICE_HOST=10.0.0.8",
		"BRIDGE_NATS_PORT_4222_TCP_ADDR=10.0.0.8",
		"BRIDGE_BIN=/usr/local/bin/bridge",
	}
	t.Run("Kubernetes service variables are ignored, and listed", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ(append(kubernetes, "BRIDGE_LOG__LEVEL=debug")...))
		require.NoError(t, err)
		assert.Equal(t, "debug", cfg.Log.Level)
		assert.Equal(t, []string{
			"BRIDGE_BIN", "BRIDGE_NATS_PORT_4222_TCP_ADDR", "BRIDGE_NATS_SERVICE_HOST", "BRIDGE_PORT",
			"BRIDGE_PORT_8080_TCP", "BRIDGE_PORT_8080_TCP_ADDR", "BRIDGE_PORT_8080_TCP_PORT", "BRIDGE_PORT_8080_TCP_PROTO",
			"BRIDGE_SERVICE_HOST", "BRIDGE_SERVICE_PORT", "BRIDGE_SERVICE_PORT_HTTP",
		}, cfg.IgnoredEnv())
	})
	t.Run("also when the config has problems", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "unrouted: never"), environ(kubernetes...))
		assert.Equal(t, []string{`unrouted: must be one of drop, error, got "never"`}, problems(t, err))
		assert.Len(t, cfg.IgnoredEnv(), len(kubernetes))
	})
	t.Run("nothing ignored", func(t *testing.T) {
		cfg, err := loadYAML(t, base)
		require.NoError(t, err)
		assert.Empty(t, cfg.IgnoredEnv())
		assert.Empty(t, (&Config{}).IgnoredEnv())
	})
	tests := []struct {
		name string
		env  string
		want string
	}{
		{"one underscore between levels", "BRIDGE_CHECKPOINT_INTERVAL=2s",
			"BRIDGE_CHECKPOINT_INTERVAL: names no key of bridge.yaml; did you mean BRIDGE_CHECKPOINT__INTERVAL? (a double underscore separates levels)"},
		{"one underscore everywhere", "BRIDGE_SOURCES_SHOP_CONFIG_DSN=postgres://x",
			"BRIDGE_SOURCES_SHOP_CONFIG_DSN: names no key of bridge.yaml; did you mean BRIDGE_SOURCES__SHOP__CONFIG__DSN? (a double underscore separates levels)"},
		{"keeps the underscores of a key", "BRIDGE_SINKS_MAIN_BATCH_MAX_CHANGES=5",
			"BRIDGE_SINKS_MAIN_BATCH_MAX_CHANGES: names no key of bridge.yaml; did you mean BRIDGE_SINKS__MAIN__BATCH__MAX_CHANGES? (a double underscore separates levels)"},
		{"one underscore below a known section", "BRIDGE_LOG__FORMAT_X=json",
			"log.format_x: unknown key (known: format, level) (set by environment variable BRIDGE_LOG__FORMAT_X)"},
		{"one underscore, then a known key", "BRIDGE_NATS__EMBEDDED_PORT=5",
			"nats.embedded_port: unknown key (known: context, creds, embedded, max_pings_outstanding, nkey_seed_file, password, ping_interval, tls, token, url, user) (set by environment variable BRIDGE_NATS__EMBEDDED_PORT; did you mean BRIDGE_NATS__EMBEDDED__PORT?)"},
		{"a misspelt section", "BRIDGE_CHEKPOINT__INTERVAL=2s",
			"BRIDGE_CHEKPOINT__INTERVAL: names no key of bridge.yaml; did you mean BRIDGE_CHECKPOINT__INTERVAL?"},
		{"a section missing a letter", "BRIDGE_SINK__MAIN__TYPE=nats_core",
			"BRIDGE_SINK__MAIN__TYPE: names no key of bridge.yaml; did you mean BRIDGE_SINKS__MAIN__TYPE?"},
		{"two letters swapped", "BRIDGE_SORUCES__SHOP__TYPE=pgoutput",
			"BRIDGE_SORUCES__SHOP__TYPE: names no key of bridge.yaml; did you mean BRIDGE_SOURCES__SHOP__TYPE?"},
		{"a misspelt top-level key", "BRIDGE_UNROTED=drop",
			"BRIDGE_UNROTED: names no key of bridge.yaml; did you mean BRIDGE_UNROUTED?"},
		{"a misspelt key in a known section", "BRIDGE_CHECKPOINT__INTERVALL=2s",
			"checkpoint.intervall: unknown key (known: bucket, confirm_delay, interval, owner_timeout, replicas) (set by environment variable BRIDGE_CHECKPOINT__INTERVALL)"},
		{"a whole section from one variable", "BRIDGE_NATS=nats://x",
			"nats: expected a mapping, got a string (set by environment variable BRIDGE_NATS)"},
		{"an empty level", "BRIDGE_SINKS____TYPE=x",
			"BRIDGE_SINKS____TYPE: empty path segment in variable name (separate names with a double underscore: BRIDGE_SINKS__MAIN__TYPE)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, base, environ(append([]string{tt.env}, kubernetes...)...))
			assert.Equal(t, []string{tt.want}, problems(t, err))
		})
	}
}

func TestUnderscoreHint(t *testing.T) {
	for lower, want := range map[string]string{
		"checkpoint_interval":         "BRIDGE_CHECKPOINT__INTERVAL",
		"data_dir":                    "", // a key as it is: no hint
		"nats_embedded_store_dir":     "BRIDGE_NATS__EMBEDDED__STORE_DIR",
		"serve_tables":                "BRIDGE_SERVE__TABLES",
		"routes_0_subject":            "", // list items cannot be set
		"port_8080_tcp_addr":          "",
		"service_host":                "",
		"sources__shop__config_dsn":   "BRIDGE_SOURCES__SHOP__CONFIG__DSN",
		"sources__shop__config":       "",
		"a_b_c_d_e_f_g_h_i_j_k_l_m_n": "", // too many to try
	} {
		assert.Equal(t, want, underscoreHint(lower), lower)
	}
}

func TestOneEdit(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"sink", "sinks", true}, {"sinkss", "sinks", true}, {"sonks", "sinks", true}, {"snisk", "sinks", false},
		{"sniks", "sinks", true}, {"sinks", "sinks", false}, {"port", "sort", true}, {"service_host", "serve", false},
		{"lo", "log", true}, {"", "a", true},
	} {
		assert.Equal(t, tt.want, oneEdit(tt.a, tt.b), "%s %s", tt.a, tt.b)
	}
	assert.Empty(t, nearKey("lo", []string{"log"}), "too short to guess")
}
