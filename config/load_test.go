package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// env returns a WithEnv option serving exactly kv ("NAME=value" entries).
func environ(kv ...string) Option {
	return WithEnv(func() []string { return kv })
}

// loadYAML writes doc to a temporary bridge.yaml and loads it with an empty
// environment unless opts bring their own.
func loadYAML(t *testing.T, doc string, opts ...Option) (*Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(p, []byte(doc), 0o600))
	return Load(p, append([]Option{environ()}, opts...)...)
}

// problems returns the lines of a Load or Decoder error, requiring it to be
// Errors.
func problems(t *testing.T, err error) []string {
	t.Helper()
	require.Error(t, err)
	var errs Errors
	require.True(t, errors.As(err, &errs), "want Errors, got %T: %v", err, err)
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// base is a small valid config that cases change with overrides.
const base = `
name: shop
sources:
  shop:
    type: pgoutput
    config: { dsn: "postgres://db/shop", slot: bridge_shop }
sinks:
  main:
    type: nats_jetstream
    config: { stream: CDC }
routes:
  - sinks: [main]
`

// withBase returns base with extra (a YAML mapping) merged over it, key by
// key; lists are replaced.
func withBase(t *testing.T, extra string) string {
	t.Helper()
	var b, e map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(base), &b))
	require.NoError(t, yaml.Unmarshal([]byte(extra), &e))
	var merge func(dst, src map[string]any)
	merge = func(dst, src map[string]any) {
		for k, v := range src {
			dm, ok1 := dst[k].(map[string]any)
			sm, ok2 := v.(map[string]any)
			if ok1 && ok2 {
				merge(dm, sm)
				continue
			}
			dst[k] = v
		}
	}
	merge(b, e)
	out, err := yaml.Marshal(b)
	require.NoError(t, err)
	return string(out)
}

func TestLoadValid(t *testing.T) {
	cfg, err := Load("testdata/valid.yaml", environ("PG_DSN=postgres://u:p@db/shop", "NATS_PASSWORD=hunter2"))
	require.NoError(t, err)

	want := &Config{
		Name:    "shop",
		DataDir: "/var/lib/bridge",
		NATS: NATS{
			URL: "nats://127.0.0.1:4222", NATSClient: NATSClient{User: "bridge", Password: "hunter2", PingInterval: 3 * time.Second, MaxPingsOutstanding: 3},
			Embedded: Embedded{Host: "0.0.0.0", Port: -1, StoreDir: "/srv/nats", SyncAlways: true},
		},
		Sources: map[string]Plugin{"shop": {Type: "pgoutput", Config: map[string]any{
			"dsn": "postgres://u:p@db/shop", "slot": "bridge_shop", "publication": "bridge_shop",
			"tables": []any{"public.orders", "public.customers"},
		}}},
		Sinks: map[string]Sink{
			"main": {
				Type:   "nats_jetstream",
				Batch:  Batch{MaxChanges: 500, MaxWait: 50 * time.Millisecond},
				Retry:  Retry{Initial: 200 * time.Millisecond, Max: 30 * time.Second},
				Config: map[string]any{"url": "nats://nats:4222", "stream": "CDC", "ack_wait": "5s"},
			},
			"audit": {
				Type:  "nats_core",
				Batch: Batch{MaxChanges: 1000, MaxWait: time.Millisecond},
				Retry: Retry{Initial: 100 * time.Millisecond, Max: 10 * time.Second},
			},
		},
		Routes: []Route{
			{
				Match: Match{
					Sources: []string{"shop"},
					Tables:  []string{"public.*", "*.audit_?"},
					Ops:     []string{"insert", "update", "delete"},
				},
				Sinks:   []string{"main", "audit"},
				Subject: "cdc.{{.Source}}.{{.Schema}}.{{.Table}}.{{.Op}}",
				Format:  "debezium",
			},
			{
				Match:   Match{Ops: []string{"message"}},
				Sinks:   []string{"main"},
				Subject: "cdc.{{.Source}}.{{.Schema}}.{{.Table}}",
				Format:  "native",
			},
		},
		Unrouted:   "error",
		Checkpoint: Checkpoint{Bucket: "shop_checkpoints", Interval: 250 * time.Millisecond, Replicas: 3},
		Schemas:    Schemas{Bucket: "bridge_schemas", Replicas: 1},
		Shutdown:   Shutdown{Timeout: 15 * time.Second},
		Log:        Log{Level: "debug", Format: "json"},
		Telemetry:  defaultTelemetry,
		HTTP:       defaultHTTP,
		Serve:      defaultServe,
		Config:     ConfigSource{Watch: true},
	}
	assert.Equal(t, want, bare(cfg))
}

// bare returns cfg without the record of where its values came from, to
// compare it with a Config written in a test.
func bare(cfg *Config) *Config {
	c := *cfg
	c.origin = nil
	return &c
}

func TestLoadDefaults(t *testing.T) {
	cfg, err := Load("testdata/minimal.yaml", environ())
	require.NoError(t, err)
	want := &Config{
		Name:    "shop",
		DataDir: "./data",
		NATS: NATS{NATSClient: NATSClient{PingInterval: 3 * time.Second, MaxPingsOutstanding: 3},
			Embedded: Embedded{Host: "127.0.0.1", Port: 4222, StoreDir: filepath.Join("data", "nats")}},
		Sources: map[string]Plugin{"shop": {Type: "pgoutput"}},
		Sinks: map[string]Sink{"main": {
			Type:  "nats_jetstream",
			Batch: Batch{MaxChanges: 1000, MaxWait: time.Millisecond},
			Retry: Retry{Initial: 100 * time.Millisecond, Max: 10 * time.Second},
		}},
		Routes: []Route{{
			Sinks:   []string{"main"},
			Subject: "cdc.{{.Source}}.{{.Schema}}.{{.Table}}",
			Format:  "native",
		}},
		Unrouted:   "drop",
		Checkpoint: Checkpoint{Bucket: "bridge_checkpoints", Interval: time.Second, Replicas: 1},
		Schemas:    Schemas{Bucket: "bridge_schemas", Replicas: 1},
		Shutdown:   Shutdown{Timeout: 5 * time.Second},
		Log:        Log{Level: "info", Format: "auto"},
		Telemetry:  defaultTelemetry,
		HTTP:       defaultHTTP,
		Serve:      defaultServe,
		Config:     ConfigSource{Watch: true},
	}
	assert.Equal(t, want, bare(cfg))
}

func TestBatchDefaultsByType(t *testing.T) {
	byType := WithBatchDefaults(func(typ string) Batch {
		switch typ {
		case "big":
			return Batch{MaxChanges: 4096}
		case "slow":
			return Batch{MaxWait: time.Second}
		}
		return Batch{}
	})
	doc := withBase(t, `
sinks:
  main: { type: big }
  set: { type: big, batch: { max_changes: 10 } }
  other: { type: other }
  slow: { type: slow }
  slowset: { type: slow, batch: { max_wait: 5ms } }
  fromenv: { type: big }
`)
	cfg, err := loadYAML(t, doc, byType, environ("BRIDGE_SINKS__FROMENV__BATCH__MAX_CHANGES=20"))
	require.NoError(t, err)
	got := map[string]Batch{}
	for name, s := range cfg.Sinks {
		got[name] = s.Batch
	}
	assert.Equal(t, map[string]Batch{
		"main":    {MaxChanges: 4096, MaxWait: time.Millisecond}, // the type's own, the framework's for the rest
		"set":     {MaxChanges: 10, MaxWait: time.Millisecond},   // the file wins
		"other":   {MaxChanges: 1000, MaxWait: time.Millisecond}, // a type without its own
		"slow":    {MaxChanges: 1000, MaxWait: time.Second},
		"slowset": {MaxChanges: 1000, MaxWait: 5 * time.Millisecond},
		"fromenv": {MaxChanges: 20, MaxWait: time.Millisecond}, // the environment wins
	}, got)

	// Without the option every type gets the framework's.
	cfg, err = loadYAML(t, doc)
	require.NoError(t, err)
	assert.Equal(t, Batch{MaxChanges: 1000, MaxWait: time.Millisecond}, cfg.Sinks["main"].Batch)
}

func TestLoadDefaultsDetails(t *testing.T) {
	t.Run("store_dir follows data_dir", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "data_dir: /srv/bridge\n"))
		require.NoError(t, err)
		assert.Equal(t, "/srv/bridge/nats", cfg.NATS.Embedded.StoreDir)
	})
	t.Run("partial sections keep the other defaults", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "checkpoint: { replicas: 3 }\nnats: { embedded: { port: 5222 } }\n"),
			WithOverrides(map[string]any{"sinks.main.batch.max_changes": 7}))
		require.NoError(t, err)
		assert.Equal(t, Checkpoint{Bucket: "bridge_checkpoints", Interval: time.Second, Replicas: 3}, cfg.Checkpoint)
		assert.Equal(t, Embedded{Host: "127.0.0.1", Port: 5222, StoreDir: filepath.Join("data", "nats")}, cfg.NATS.Embedded)
		assert.Equal(t, Batch{MaxChanges: 7, MaxWait: time.Millisecond}, cfg.Sinks["main"].Batch)
	})
	t.Run("null counts as absent", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "log: { level: null }\ncheckpoint:\nsinks: { main: { batch: ~ } }\n"))
		require.NoError(t, err)
		assert.Equal(t, "info", cfg.Log.Level)
		assert.Equal(t, time.Second, cfg.Checkpoint.Interval)
		assert.Equal(t, 1000, cfg.Sinks["main"].Batch.MaxChanges)
	})
	t.Run("an explicit zero is not replaced by the default", func(t *testing.T) {
		_, err := loadYAML(t, withBase(t, "sinks: { main: { batch: { max_changes: 0 } } }\n"))
		assert.Equal(t, []string{"sinks.main.batch.max_changes: must be > 0, got 0"}, problems(t, err))
	})
	t.Run("a null route still gets defaults and is validated", func(t *testing.T) {
		_, err := loadYAML(t, withBase(t, "routes: [~]\n"))
		assert.Equal(t, []string{"routes[0].sinks: at least one sink is required"}, problems(t, err))
	})
}

func TestLoadInterpolation(t *testing.T) {
	const dsnDoc = `
name: shop
sources:
  shop:
    type: pgoutput
    config: { dsn: "%s", slot: bridge_shop }
`
	dsnOf := func(cfg *Config) any { return cfg.Sources["shop"].Config["dsn"] }
	tests := []struct {
		name  string
		value string
		env   []string
		want  any
	}{
		{"set", "${PG_DSN}", []string{"PG_DSN=postgres://u@db/x"}, "postgres://u@db/x"},
		{"default when unset", "${PG_DSN:-postgres://localhost/x}", nil, "postgres://localhost/x"},
		{"default when empty", "${PG_DSN:-postgres://localhost/x}", []string{"PG_DSN="}, "postgres://localhost/x"},
		{"set wins over default", "${PG_DSN:-postgres://localhost/x}", []string{"PG_DSN=postgres://prod/x"}, "postgres://prod/x"},
		{"mixed with text", "postgres://${U}:${P}@db/x", []string{"U=bob", "P=pw"}, "postgres://bob:pw@db/x"},
		{"dollar dollar is a literal dollar", "pa$$word ${U}", []string{"U=bob"}, "pa$word bob"},
		{"escaped reference stays literal", "$${PG_DSN}", nil, "${PG_DSN}"},
		{"last duplicate env entry wins", "${U}", []string{"U=first", "U=second"}, "second"},
		{"whole-number result becomes an int", "${N}", []string{"N=42"}, 42},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadYAML(t, fmt.Sprintf(dsnDoc, tt.value), environ(tt.env...))
			require.NoError(t, err)
			assert.Equal(t, tt.want, dsnOf(cfg))
		})
	}

	t.Run("values cannot inject YAML", func(t *testing.T) {
		evil := "x\"\n    slot: hijacked\nunknown: 1"
		cfg, err := loadYAML(t, fmt.Sprintf(dsnDoc, "${EVIL}"), environ("EVIL="+evil))
		require.NoError(t, err)
		assert.Equal(t, evil, dsnOf(cfg))
		assert.Equal(t, "bridge_shop", cfg.Sources["shop"].Config["slot"])
	})
	t.Run("unset variable names path and variable", func(t *testing.T) {
		_, err := loadYAML(t, fmt.Sprintf(dsnDoc, "${PG_DSN}"))
		assert.Equal(t, []string{
			"sources.shop.config.dsn: environment variable PG_DSN is not set (use ${PG_DSN:-default} for a default)",
		}, problems(t, err))
	})
	t.Run("errors in list elements name the index", func(t *testing.T) {
		_, err := loadYAML(t, withBase(t, "routes: [{ sinks: [main, \"${SECOND}\"] }]\n"))
		assert.Equal(t, []string{
			"routes[0].sinks[1]: environment variable SECOND is not set (use ${SECOND:-default} for a default)",
		}, problems(t, err))
	})
	t.Run("bare dollar is an error", func(t *testing.T) {
		_, err := loadYAML(t, fmt.Sprintf(dsnDoc, "pa$word"))
		assert.Equal(t, []string{
			"sources.shop.config.dsn: bare $ at offset 2 (write $$ for a literal $, or ${NAME} to expand a variable)",
		}, problems(t, err))
	})
	t.Run("framework int from a variable", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "nats: { embedded: { port: \"${NATS_PORT:-4222}\" } }\n"), environ("NATS_PORT=5222"))
		require.NoError(t, err)
		assert.Equal(t, 5222, cfg.NATS.Embedded.Port)
	})
	t.Run("numeric-looking secret stays a verbatim string", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "nats: { password: \"${PW}\", token: \"${TOKEN}\" }\n"), environ("PW=0123", "TOKEN=1e3"))
		require.NoError(t, err)
		assert.Equal(t, "0123", cfg.NATS.Password)
		assert.Equal(t, "1e3", cfg.NATS.Token)
	})
	t.Run("secrets from files", func(t *testing.T) {
		dir := t.TempDir()
		secret := func(name, content string) string {
			p := filepath.Join(dir, name)
			require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
			return p
		}
		pw := secret("pg_password", "fi1eSecret\n")
		port := secret("port", "5222\n")
		natsPw := secret("nats_password", "0123\n")
		doc := withBase(t, fmt.Sprintf(`
sources: { shop: { config: { dsn: "postgres://app:${file:%s}@db/shop" } } }
nats: { password: "${file:%s}", token: "${file:${SECRETS}/pg_password}", embedded: { port: "${file:%s}" } }
`, pw, natsPw, port))
		cfg, err := loadYAML(t, doc, environ("SECRETS="+dir))
		require.NoError(t, err)
		assert.Equal(t, "postgres://app:fi1eSecret@db/shop", cfg.Sources["shop"].Config["dsn"])
		assert.Equal(t, "0123", cfg.NATS.Password, "a number-looking secret keeps its text")
		assert.Equal(t, "fi1eSecret", cfg.NATS.Token)
		assert.Equal(t, 5222, cfg.NATS.Embedded.Port, "a file's number is typed like a variable's")
	})
	t.Run("unreadable secret files name the path and the file, never the content", func(t *testing.T) {
		dir := t.TempDir()
		other := filepath.Join(dir, "other")
		require.NoError(t, os.WriteFile(other, []byte("otherSecret"), 0o600))
		missing := filepath.Join(dir, "pg_password")
		doc := withBase(t, fmt.Sprintf(`
sources: { shop: { config: { dsn: "postgres://app:${file:%s}@db/shop" } } }
nats: { password: "${file:%s}", token: "${file:%s}" }
`, missing, dir, other))
		_, err := loadYAML(t, doc)
		assert.Equal(t, []string{
			"nats.password: file " + dir + " (${file:...}) is a directory: name the file inside it",
			"sources.shop.config.dsn: file " + missing + " (${file:...}) does not exist: mount the secret there, or correct the path",
		}, problems(t, err), "in the order of the file (withBase sorts the keys)")
		assert.NotContains(t, err.Error(), "otherSecret")
	})
	t.Run("interpolation failure is not also a validation error", func(t *testing.T) {
		_, err := loadYAML(t, "name: ${NAME}\nsources: { shop: { type: pgoutput } }\n")
		assert.Equal(t, []string{
			"name: environment variable NAME is not set (use ${NAME:-default} for a default)",
		}, problems(t, err))
	})
}

func TestLoadEnv(t *testing.T) {
	t.Run("overrides reach nested keys and are typed", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ(
			"BRIDGE_SOURCES__SHOP__CONFIG__DSN=postgres://env/shop",
			"BRIDGE_SOURCES__SHOP__CONFIG__STATUS_INTERVAL=10s",
			"BRIDGE_CHECKPOINT__INTERVAL=2s",
			"BRIDGE_SINKS__MAIN__BATCH__MAX_CHANGES=500",
			"BRIDGE_SINKS__MAIN__CONFIG__CREATE_STREAM=true",
			"BRIDGE_SINKS__MAIN__CONFIG__MAX_PENDING=4096",
			"BRIDGE_NATS__EMBEDDED__SYNC_ALWAYS=true",
			"BRIDGE_LOG__LEVEL=debug",
		))
		require.NoError(t, err)
		assert.Equal(t, map[string]any{"dsn": "postgres://env/shop", "slot": "bridge_shop", "status_interval": "10s"},
			cfg.Sources["shop"].Config)
		assert.Equal(t, 2*time.Second, cfg.Checkpoint.Interval)
		assert.Equal(t, 500, cfg.Sinks["main"].Batch.MaxChanges)
		assert.Equal(t, map[string]any{"stream": "CDC", "create_stream": true, "max_pending": 4096}, cfg.Sinks["main"].Config)
		assert.True(t, cfg.NATS.Embedded.SyncAlways)
		assert.Equal(t, "debug", cfg.Log.Level)
	})
	t.Run("env beats the file", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "log: { level: warn }\n"), environ("BRIDGE_LOG__LEVEL=error"))
		require.NoError(t, err)
		assert.Equal(t, "error", cfg.Log.Level)
	})
	t.Run("values are verbatim: numeric strings, dollars", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ("BRIDGE_NATS__PASSWORD=123456", "BRIDGE_NATS__TOKEN=pa$word ${X}"))
		require.NoError(t, err)
		assert.Equal(t, "123456", cfg.NATS.Password)
		assert.Equal(t, "pa$word ${X}", cfg.NATS.Token)
	})
	t.Run("a whole sink from the environment gets defaults", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ("BRIDGE_SINKS__BACKUP__TYPE=nats_core"))
		require.NoError(t, err)
		assert.Equal(t, Sink{
			Type:  "nats_core",
			Batch: Batch{MaxChanges: 1000, MaxWait: time.Millisecond},
			Retry: Retry{Initial: 100 * time.Millisecond, Max: 10 * time.Second},
		}, cfg.Sinks["backup"])
	})
	t.Run("no file at all", func(t *testing.T) {
		cfg, err := Load("", environ("BRIDGE_NAME=shop", "BRIDGE_SOURCES__SHOP__TYPE=pgoutput"))
		require.NoError(t, err)
		assert.Equal(t, "shop", cfg.Name)
		assert.Equal(t, "pgoutput", cfg.Sources["shop"].Type)
	})
	t.Run("other variables are ignored", func(t *testing.T) {
		cfg, err := loadYAML(t, base, environ("LOG__LEVEL=debug", "bridge_log__level=debug", "BRIDGE_=x", "NOEQUALS"))
		require.NoError(t, err)
		assert.Equal(t, "info", cfg.Log.Level)
	})
	tests := []struct {
		name string
		env  string
		want string
	}{
		{"unknown key", "BRIDGE_CHECKPOINT__INTERVALL=2s", "checkpoint.intervall: unknown key (known: bucket, confirm_delay, interval, owner_timeout, replicas) (set by environment variable BRIDGE_CHECKPOINT__INTERVALL)"},
		{"bad duration", "BRIDGE_CHECKPOINT__INTERVAL=fast", `checkpoint.interval: time: invalid duration "fast" (set by environment variable BRIDGE_CHECKPOINT__INTERVAL)`},
		{"number for a duration", "BRIDGE_CHECKPOINT__INTERVAL=5", `checkpoint.interval: time: missing unit in duration "5" (set by environment variable BRIDGE_CHECKPOINT__INTERVAL)`},
		{"string for an int", "BRIDGE_CHECKPOINT__REPLICAS=three", "checkpoint.replicas: expected an integer, got a string (set by environment variable BRIDGE_CHECKPOINT__REPLICAS)"},
		{"empty segment", "BRIDGE_SINKS____TYPE=x", "BRIDGE_SINKS____TYPE: empty path segment in variable name (separate names with a double underscore: BRIDGE_SINKS__MAIN__TYPE)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, base, environ(tt.env))
			assert.Equal(t, []string{tt.want}, problems(t, err))
		})
	}
}

func TestLoadOverrides(t *testing.T) {
	t.Run("overrides beat env and file", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "log: { level: warn }\n"), environ("BRIDGE_LOG__LEVEL=error"),
			WithOverrides(map[string]any{"log.level": "debug"}))
		require.NoError(t, err)
		assert.Equal(t, "debug", cfg.Log.Level)
	})
	t.Run("typed and string values", func(t *testing.T) {
		cfg, err := loadYAML(t, base, WithOverrides(map[string]any{
			"checkpoint.interval":          3 * time.Second,
			"shutdown.timeout":             "7s",
			"checkpoint.replicas":          "3",
			"nats.password":                "0042",
			"sources.shop.config.max_lag":  "100",
			"nats.embedded.sync_always":    true,
			"sinks.main.retry.max":         nil, // ignored
			"log":                          map[string]any{"level": nil, "format": "json"},
			"sinks.main.config.extra.deep": "yes",
		}))
		require.NoError(t, err)
		assert.Equal(t, 3*time.Second, cfg.Checkpoint.Interval)
		assert.Equal(t, 7*time.Second, cfg.Shutdown.Timeout)
		assert.Equal(t, 3, cfg.Checkpoint.Replicas)
		assert.Equal(t, "0042", cfg.NATS.Password)
		assert.Equal(t, 100, cfg.Sources["shop"].Config["max_lag"])
		assert.True(t, cfg.NATS.Embedded.SyncAlways)
		assert.Equal(t, 10*time.Second, cfg.Sinks["main"].Retry.Max)
		assert.Equal(t, map[string]any{"deep": "yes"}, cfg.Sinks["main"].Config["extra"])
		assert.Equal(t, Log{Level: "info", Format: "json"}, cfg.Log)
	})
	t.Run("nested maps merge", func(t *testing.T) {
		cfg, err := loadYAML(t, base, WithOverrides(map[string]any{
			"sources": map[string]any{"shop": map[string]any{"config": map[string]any{"dsn": "postgres://flag/x"}}},
		}))
		require.NoError(t, err)
		assert.Equal(t, map[string]any{"dsn": "postgres://flag/x", "slot": "bridge_shop"}, cfg.Sources["shop"].Config)
	})
	t.Run("later overrides win", func(t *testing.T) {
		cfg, err := loadYAML(t, base,
			WithOverrides(map[string]any{"log.level": "debug", "log.format": "json"}),
			WithOverrides(map[string]any{"log.level": "warn"}))
		require.NoError(t, err)
		assert.Equal(t, Log{Level: "warn", Format: "json"}, cfg.Log)
	})
	t.Run("a Go-typed number does not pass for a string", func(t *testing.T) {
		_, err := loadYAML(t, base, environ("BRIDGE_NATS__PASSWORD=1"), WithOverrides(map[string]any{"nats.password": 2}))
		assert.Equal(t, []string{"nats.password: expected a string, got an integer"}, problems(t, err))
	})
}

func TestLoadUnknownKeys(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"top level", withBase(t, "nmae: x\n"),
			"nmae: unknown key (known: checkpoint, config, data_dir, http, log, name, nats, routes, schemas, serve, shutdown, sinks, sources, telemetry, unrouted)"},
		{"nested struct", withBase(t, "nats: { embedded: { hots: x } }\n"),
			"nats.embedded.hots: unknown key (known: host, port, store_dir, sync_always)"},
		{"source map value", withBase(t, "sources: { shop: { dsn: x } }\n"),
			"sources.shop.dsn: unknown key (known: config, type)"},
		{"struct inside a sink", withBase(t, "sinks: { main: { batch: { max_chnages: 10 } } }\n"),
			"sinks.main.batch.max_chnages: unknown key (known: max_changes, max_wait)"},
		{"list element", withBase(t, "routes: [{ sinks: [main], match: { tabels: [public.x] } }]\n"),
			"routes[0].match.tabels: unknown key (known: ops, sources, tables)"},
		{"keys are case-sensitive", withBase(t, "Name: x\n"),
			"Name: unknown key (known: checkpoint, config, data_dir, http, log, name, nats, routes, schemas, serve, shutdown, sinks, sources, telemetry, unrouted)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, tt.doc)
			assert.Equal(t, []string{tt.want}, problems(t, err))
		})
	}
	t.Run("plugin config blocks are not checked", func(t *testing.T) {
		cfg, err := loadYAML(t, withBase(t, "sinks: { main: { config: { anything: [1, 2], nested: { deep: true } } } }\n"))
		require.NoError(t, err)
		assert.Equal(t, map[string]any{"stream": "CDC", "anything": []any{1, 2}, "nested": map[string]any{"deep": true}},
			cfg.Sinks["main"].Config)
	})
}

func TestLoadTypeErrors(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"bad duration", withBase(t, "sinks: { main: { batch: { max_wait: fast } } }\n"),
			`sinks.main.batch.max_wait: time: invalid duration "fast"`},
		{"duration without unit", withBase(t, "checkpoint: { interval: 5 }\n"),
			`checkpoint.interval: expected a duration such as "50ms" or "2s", got an integer`},
		{"string for int", withBase(t, "nats: { embedded: { port: abc } }\n"),
			"nats.embedded.port: expected an integer, got a string"},
		{"quoted number for int (no weak typing)", withBase(t, "nats: { embedded: { port: \"4222\" } }\n"),
			"nats.embedded.port: expected an integer, got a string"},
		{"fraction for int", withBase(t, "checkpoint: { replicas: 1.5 }\n"),
			"checkpoint.replicas: expected an integer, got a fractional or out-of-range number"},
		{"int for string", "name: 42\nsources: { shop: { type: pgoutput } }\n",
			"name: expected a string, got an integer"},
		{"string for bool", withBase(t, "nats: { embedded: { sync_always: \"yes\" } }\n"),
			"nats.embedded.sync_always: expected a boolean, got a string"},
		{"scalar for list", withBase(t, "routes: [{ sinks: main }]\n"),
			"routes[0].sinks: expected a list, got a string"},
		{"list for map", "name: shop\nsources: [shop]\n",
			"sources: expected a mapping, got a list"},
		{"scalar for struct", withBase(t, "log: debug\n"),
			"log: expected a mapping, got a string"},
		{"scalar for plugin block", withBase(t, "sources: { shop: { config: 5 } }\n"),
			"sources.shop.config: expected a mapping, got an integer"},
		{"timestamp for string", withBase(t, "nats: { user: 2024-01-02 }\n"),
			"nats.user: expected a string, got a timestamp (quote it to make it a string)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, tt.doc)
			assert.Equal(t, []string{tt.want}, problems(t, err)) // and no second error for the same key
		})
	}
}

func TestLoadAllErrorsAtOnce(t *testing.T) {
	_, err := Load("testdata/invalid.yaml", environ())
	want := []string{ // in the order of the file
		`name: must match ^[A-Za-z0-9_-]+$, got "my bridge"`,
		`nmae: unknown key (known: checkpoint, config, data_dir, http, log, name, nats, routes, schemas, serve, shutdown, sinks, sources, telemetry, unrouted)`,
		`nats.embedded.port: expected an integer, got a string`,
		`sources.shop.type: must be set`,
		`sources.shop.dsn: environment variable PG_DSN is not set (use ${PG_DSN:-default} for a default)`,
		`sources.shop.dsn: unknown key (known: config, type)`,
		`sources.shop.config.dsn: environment variable PG_DSN is not set (use ${PG_DSN:-default} for a default)`,
		`checkpoint.interval: time: invalid duration "fast"`,
		`sinks.main.batch.max_chnages: unknown key (known: max_changes, max_wait)`,
		`sinks.main.batch.max_wait: must be > 0, got 0s`,
		`sinks.main.retry.initial: must be <= retry.max (1s), got 1m0s`,
		`routes[0].match.tabels: unknown key (known: ops, sources, tables)`,
		`routes[0].match.ops[0]: unknown op "upsert" (known: insert, update, delete, truncate, message, read, control, schema, ddl)`,
		`routes[1].sinks[0]: no sink named "mian" (defined: main)`,
		`routes[1].subject: template: subject:1: unclosed action`,
		`unrouted: must be one of drop, error, got "sometimes"`,
		`log.level: must be one of debug, info, warn, error, got "verbose"`,
	}
	assert.Equal(t, want, problems(t, err))
	assert.Equal(t, strings.Join(want, "\n"), err.Error())

	var fe *FieldError
	require.True(t, errors.As(err, &fe))
	assert.Equal(t, "name", fe.Path)
}

func TestLoadFileErrors(t *testing.T) {
	t.Run("missing file", func(t *testing.T) {
		_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), environ())
		require.ErrorIs(t, err, fs.ErrNotExist)
		var errs Errors
		assert.False(t, errors.As(err, &errs))
	})
	t.Run("bad YAML", func(t *testing.T) {
		_, err := loadYAML(t, "name: [unclosed\n")
		var se *SyntaxError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, 1, se.Line)
		assert.True(t, strings.HasSuffix(se.File, "bridge.yaml"), se.File)
	})
	t.Run("not a mapping", func(t *testing.T) {
		_, err := loadYAML(t, "- a\n- b\n")
		require.ErrorContains(t, err, "bridge.yaml:1: the file must be a mapping of keys")
	})
	t.Run("empty file", func(t *testing.T) {
		_, err := loadYAML(t, "")
		assert.Equal(t, []string{"name: must be set", "sources: at least one source is required"}, problems(t, err))
	})
}

// The telemetry, http and serve defaults.
var (
	defaultTelemetry = Telemetry{
		Tracing: Tracing{Protocol: "http/protobuf", SampleRatio: 1, ContextPrefix: "traceparent"},
		Metrics: Metrics{SlotPollInterval: 10 * time.Second},
	}
	defaultHTTP = HTTP{Listen: "127.0.0.1:8080", MaxCheckpointAge: time.Minute, Console: true}

	defaultServe = Serve{
		Listen: "127.0.0.1:8090", Stream: "CDC", MaxConns: 10000, MaxPerClient: 100,
		Hold: 20 * time.Second, KeepAlive: 15 * time.Second, WriteTimeout: 10 * time.Second,
		MaxLag: 100000, WindowTxns: 100000, WindowBytes: 64 << 20, MaxProjections: 1000, MaxColumns: 256, ProjectionIdle: time.Minute,
		Auth:           ServeAuth{Leeway: 30 * time.Second, ScopeClaim: "scope"},
		MaxHeaderBytes: 65536, MaxQueryBytes: 16384, MaxFilterDepth: 16,
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
	}
)
