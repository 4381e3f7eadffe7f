package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidation(t *testing.T) {
	route := func(kv ...any) map[string]any {
		r := map[string]any{"sinks": []any{"main"}}
		for i := 0; i < len(kv); i += 2 {
			r[kv[i].(string)] = kv[i+1]
		}
		return r
	}
	tests := []struct {
		name string
		set  map[string]any
		want []string
	}{
		{"name missing", map[string]any{"name": ""}, []string{"name: must be set"}},
		{"name with a space", map[string]any{"name": "my shop"}, []string{`name: must match ^[A-Za-z0-9_-]+$, got "my shop"`}},
		{"source without type", map[string]any{"sources.shop.type": ""}, []string{"sources.shop.type: must be set"}},
		{"sink without type", map[string]any{"sinks.main.type": ""}, []string{"sinks.main.type: must be set"}},
		{"bad source name", map[string]any{"sources": map[string]any{"sh op": map[string]any{"type": "pgoutput"}}},
			[]string{"sources.sh op: name must match ^[A-Za-z0-9_-]+$"}},
		{"bad sink name", map[string]any{"sinks": map[string]any{"ma!n": map[string]any{"type": "nats_core"}}, "routes": []any{route("sinks", []any{"ma!n"})}},
			[]string{"sinks.ma!n: name must match ^[A-Za-z0-9_-]+$"}},
		{"unrouted", map[string]any{"unrouted": "ignore"}, []string{`unrouted: must be one of drop, error, got "ignore"`}},
		{"checkpoint interval zero", map[string]any{"checkpoint.interval": "0s"}, []string{"checkpoint.interval: must be > 0, got 0s"}},
		{"shutdown timeout negative", map[string]any{"shutdown.timeout": "-1s"}, []string{"shutdown.timeout: must be > 0, got -1s"}},
		{"owner_timeout below 1s", map[string]any{"checkpoint.owner_timeout": "500ms"}, []string{"checkpoint.owner_timeout: must be 0 (off) or at least 1s, got 500ms"}},
		{"owner_timeout negative", map[string]any{"checkpoint.owner_timeout": "-1s"}, []string{"checkpoint.owner_timeout: must be 0 (off) or at least 1s, got -1s"}},
		{"max_wait zero", map[string]any{"sinks.main.batch.max_wait": "0ms"}, []string{"sinks.main.batch.max_wait: must be > 0, got 0s"}},
		{"retry initial zero", map[string]any{"sinks.main.retry.initial": "0s"}, []string{"sinks.main.retry.initial: must be > 0, got 0s"}},
		{"retry max zero", map[string]any{"sinks.main.retry.max": "0s"}, []string{"sinks.main.retry.max: must be > 0, got 0s"}},
		{"max_changes negative", map[string]any{"sinks.main.batch.max_changes": -1}, []string{"sinks.main.batch.max_changes: must be > 0, got -1"}},
		{"retry initial above max", map[string]any{"sinks.main.retry.initial": "20s"},
			[]string{"sinks.main.retry.initial: must be <= retry.max (10s), got 20s"}},
		{"continue without a name", map[string]any{"routes": []any{route("continue", true), route()}},
			[]string{"routes[0].name: must be set with continue: true: the name tells this route's messages from the other routes' of the same change (e.g. name: main)"}},
		{"route name with a space", map[string]any{"routes": []any{route("name", "my route")}},
			[]string{`routes[0].name: must match ^[A-Za-z0-9_-]+$, got "my route"`}},
		{"route name with the id separator", map[string]any{"routes": []any{route("name", "a@b")}},
			[]string{`routes[0].name: must match ^[A-Za-z0-9_-]+$, got "a@b"`}},
		{"route names twice", map[string]any{"routes": []any{route("name", "masked", "continue", true), route("name", "masked")}},
			[]string{`routes[1].name: "masked" is also the name of routes[0]; names must be unique`}},
		{"serve.route names no route", map[string]any{"serve.route": "masked", "routes": []any{route("name", "full")}},
			[]string{`serve.route: no route named "masked" (named routes: full); set routes[].name on the route whose messages the feeds serve`}},
		{"serve.route of another format", map[string]any{"serve.route": "dbz", "routes": []any{route("name", "dbz", "format", "debezium")}},
			[]string{`serve.route: route "dbz" publishes the debezium format, and the feeds read the native format; serve a route of format native (a second route with continue: true and a name of its own can publish the same changes natively into the same stream)`}},
		{"wasm block without module and sum", map[string]any{"routes": []any{route("wasm_filter", map[string]any{"timeout": "50ms"})}},
			[]string{"routes[0].wasm_filter.module: must be set: the path of the .wasm file", "routes[0].wasm_filter.sha256: must be set: the module's sum, from `sha256sum <module>`, quoted"}},
		{"wasm bad sum, function, limits", map[string]any{"routes": []any{route("wasm_transform", map[string]any{"module": "t.wasm", "sha256": "abc", "function": "my func", "timeout": "-1s", "max_memory_mib": 5000})}},
			[]string{`routes[0].wasm_transform.function: must be the name of an export, got "my func"`, "routes[0].wasm_transform.max_memory_mib: must be between 1 and 4096 (MiB), got 5000",
				`routes[0].wasm_transform.sha256: must be 64 hex digits (the output of ` + "`sha256sum`" + `), got "abc"`, "routes[0].wasm_transform.timeout: must be > 0, got -1s"}},
		{"transform and wasm_transform", map[string]any{"routes": []any{route("transform", "after", "wasm_transform", map[string]any{"module": "t.wasm", "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})}},
			[]string{"routes[0].wasm_transform: set transform or wasm_transform, not both: each builds the whole body"}},
		{"route without sinks", map[string]any{"routes": []any{route("sinks", []any{})}}, []string{"routes[0].sinks: at least one sink is required"}},
		{"route to an unknown sink", map[string]any{"routes": []any{route(), route("sinks", []any{"mian"})}},
			[]string{`routes[1].sinks[0]: no sink named "mian" (defined: main)`}},
		{"route from an unknown source", map[string]any{"routes": []any{route("match", map[string]any{"sources": []any{"shop", "shp"}})}},
			[]string{`routes[0].match.sources[1]: no source named "shp" (defined: shop)`}},
		{"subject does not parse", map[string]any{"routes": []any{route("subject", "cdc.{{.Table")}},
			[]string{"routes[0].subject: template: subject:1: unclosed action"}},
		{"subject names an unknown field", map[string]any{"routes": []any{route("subject", "cdc.{{.Tabel}}")}},
			[]string{`routes[0].subject: template: subject:1:6: executing "subject" at <.Tabel>: map has no entry for key "Tabel" (fields: .Source .Schema .Table .Op .Prefix .Key.<column> .Col.<column> .Out.<key>)`}},
		{"subject renders an empty token", map[string]any{"routes": []any{route("subject", "cdc..{{.Table}}")}},
			[]string{`routes[0].subject: renders "cdc..table", which is not a valid NATS subject (dot-separated non-empty tokens, no spaces or wildcards)`}},
		{"subject with a wildcard", map[string]any{"routes": []any{route("subject", "cdc.>")}},
			[]string{`routes[0].subject: renders "cdc.>", which is not a valid NATS subject (dot-separated non-empty tokens, no spaces or wildcards)`}},
		{"empty subject", map[string]any{"routes": []any{route("subject", "")}}, []string{"routes[0].subject: must be set"}},
		{"unknown op", map[string]any{"routes": []any{route("match", map[string]any{"ops": []any{"insert", "upsert"}})}},
			[]string{`routes[0].match.ops[1]: unknown op "upsert" (known: insert, update, delete, truncate, message, read, control, schema, ddl)`}},
		{"unknown on_schema_change", map[string]any{"routes": []any{route("on_schema_change", "stop")}},
			[]string{`routes[0].on_schema_change: must be one of continue, pause, dead_letter, got "stop"`}},
		{"dead_letter_subject without dead_letter", map[string]any{"routes": []any{route("dead_letter_subject", "dlq.{{.Table}}")}},
			[]string{`routes[0].dead_letter_subject: is used by on_schema_change: dead_letter only; set that, or drop dead_letter_subject`}},
		{"debezium options on another format", map[string]any{"routes": []any{route("debezium", map[string]any{"schemas_enable": true})}},
			[]string{`routes[0].debezium: applies to format: debezium only, and the route's format is "native"`}},
		{"unknown debezium key", map[string]any{"routes": []any{route("format", "debezium", "debezium", map[string]any{"key": "subject"})}},
			[]string{`routes[0].debezium.key: must be one of none, header, got "subject"`}},
		{"schemas bucket is the checkpoints'", map[string]any{"schemas": map[string]any{"enabled": true, "bucket": "bridge_checkpoints"}},
			[]string{`schemas.bucket: must differ from checkpoint.bucket ("bridge_checkpoints")`}},
		{"table glob without schema", map[string]any{"routes": []any{route("match", map[string]any{"tables": []any{"orders"}})}},
			[]string{`routes[0].match.tables[0]: must be a schema.table glob such as public.* or *.orders, got "orders"`}},
		{"table glob with two dots", map[string]any{"routes": []any{route("match", map[string]any{"tables": []any{"a.b.c"}})}},
			[]string{`routes[0].match.tables[0]: must be a schema.table glob such as public.* or *.orders, got "a.b.c"`}},
		{"bad table glob", map[string]any{"routes": []any{route("match", map[string]any{"tables": []any{"public.*", "public.[a"}})}},
			[]string{`routes[0].match.tables[1]: invalid glob "public.[a": syntax error in pattern`}},
		{"columns: include and exclude", map[string]any{"routes": []any{route("columns", []any{map[string]any{"include": []any{"a"}, "exclude": []any{"b"}}})}},
			[]string{`routes[0].columns[0]: set include or exclude, not both`}},
		{"columns: neither", map[string]any{"routes": []any{route("columns", []any{map[string]any{"tables": []any{"public.*"}}})}},
			[]string{`routes[0].columns[0]: set include (the columns to publish, besides the key) or exclude (the columns to leave out)`}},
		{"columns: bad glob, empty and twice-listed names", map[string]any{"routes": []any{route("columns", []any{map[string]any{"tables": []any{"orders"}, "exclude": []any{"a", "", "a"}}})}},
			[]string{`routes[0].columns[0].exclude[1]: must be a column name, got an empty string`,
				`routes[0].columns[0].exclude[2]: column "a" is listed twice`,
				`routes[0].columns[0].tables[0]: must be a schema.table glob such as public.* or *.orders, got "orders"`}},
		{"columns: a mapping, not a list", map[string]any{"routes": []any{route("columns", map[string]any{"include": []any{"a"}})}},
			[]string{`routes[0].columns: expected a list, got a mapping`}},
		{"mask: nothing to mask", map[string]any{"routes": []any{route("mask", []any{map[string]any{"tables": []any{"public.users"}}})}},
			[]string{`routes[0].mask[0]: set redact, hash or truncate: the columns to mask`}},
		{"mask: hash without a key", map[string]any{"routes": []any{route("mask", []any{map[string]any{"hash": []any{"email"}}})}},
			[]string{"routes[0].mask[0].hash_key: must be set with hash: the secret key of the HMAC, at least 16 bytes, e.g. ${MASK_HASH_KEY} holding the output of `openssl rand -hex 32`"}},
		{"mask: short key", map[string]any{"routes": []any{route("mask", []any{map[string]any{"hash": []any{"email"}, "hash_key": "s3cret"}})}},
			[]string{"routes[0].mask[0].hash_key: must be at least 16 bytes, got 6: use a random key, e.g. the output of `openssl rand -hex 32`"}},
		{"mask: one column, two masks; bad truncate", map[string]any{"routes": []any{route("mask", []any{map[string]any{
			"redact": []any{"email"}, "hash": []any{"email"}, "hash_key": "0123456789abcdef", "truncate": map[string]any{"email": 3, "note": 0}}})}},
			[]string{`routes[0].mask[0].hash[0]: column "email" is under redact too: a column has one mask`,
				`routes[0].mask[0].truncate.email: column "email" is under redact or hash too: a column has one mask`,
				`routes[0].mask[0].truncate.note: must be > 0 (the characters kept), got 0`}},
		{"log level", map[string]any{"log.level": "verbose"}, []string{`log.level: must be one of debug, info, warn, error, got "verbose"`}},
		{"log format", map[string]any{"log.format": "xml"}, []string{`log.format: must be one of auto, text, json, got "xml"`}},
		{"replicas", map[string]any{"checkpoint.replicas": 0}, []string{"checkpoint.replicas: must be between 1 and 5, got 0"}},
		{"bucket", map[string]any{"checkpoint.bucket": "my.bucket"}, []string{`checkpoint.bucket: must match ^[A-Za-z0-9_-]+$, got "my.bucket"`}},
		{"port", map[string]any{"nats.embedded.port": 70000}, []string{"nats.embedded.port: must be a port number, or -1 for any free port, got 70000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, base, WithOverrides(tt.set))
			assert.Equal(t, tt.want, problems(t, err))
		})
	}

	t.Run("no sources", func(t *testing.T) {
		_, err := loadYAML(t, "name: shop\n")
		assert.Equal(t, []string{"sources: at least one source is required"}, problems(t, err))
	})
	t.Run("no sinks defined", func(t *testing.T) {
		_, err := loadYAML(t, "name: shop\nsources: { shop: { type: pgoutput } }\nroutes: [{ sinks: [main] }]\n")
		assert.Equal(t, []string{`routes[0].sinks[0]: no sink named "main" (defined: none)`}, problems(t, err))
	})
	t.Run("a subject may read a transform's values", func(t *testing.T) {
		_, err := loadYAML(t, base, WithOverrides(map[string]any{"routes": []any{route("subject", "ev.{{.Out.kind}}", "transform", "after")}}))
		assert.NoError(t, err)
	})
	t.Run("plugin types and formats are left to the runtime", func(t *testing.T) {
		_, err := loadYAML(t, base, WithOverrides(map[string]any{
			"sources.shop.type": "no_such_source", "sinks.main.type": "no_such_sink",
			"routes": []any{route("format", "no_such_format")},
		}))
		assert.NoError(t, err)
	})
}

func TestValidateInCode(t *testing.T) {
	c := &Config{
		Name:    "shop",
		Sources: map[string]Plugin{"shop": {Type: "pgoutput"}},
		Sinks: map[string]Sink{"main": {
			Type:  "nats_core",
			Batch: Batch{MaxChanges: 1, MaxWait: time.Millisecond},
			Retry: Retry{Initial: time.Millisecond, Max: time.Second},
		}},
		Routes:     []Route{{Sinks: []string{"main"}, Subject: "cdc.x"}},
		Unrouted:   "drop",
		Checkpoint: Checkpoint{Bucket: "b", Interval: time.Second, Replicas: 1},
		Shutdown:   Shutdown{Timeout: time.Second},
		Log:        Log{Level: "info", Format: "auto"},
	}
	require.NoError(t, c.Validate())

	c.Routes = append(c.Routes, Route{Subject: "x"}, Route{Sinks: []string{"nope"}, Subject: "x"})
	c.Log.Level = ""
	assert.Equal(t, []string{
		`log.level: must be one of debug, info, warn, error, got ""`,
		"routes[1].sinks: at least one sink is required",
		`routes[2].sinks[0]: no sink named "nope" (defined: main)`,
	}, problems(t, c.Validate()))
}
