package config

// Decoder decodes a plugin's own `config:` block into the struct pointed to by
// into: strictly (unknown keys are errors), with duration and
// encoding.TextUnmarshaler hooks, then calls Validate() error on into when it
// has one. Every error it returns names the full YAML path of the key
// (e.g. "sinks.main.config.stream"); several problems come back joined.
type Decoder func(into any) error
