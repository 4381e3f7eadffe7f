// Package app builds and runs a bridge from a loaded bridge.yaml: one
// pipeline per source, each with its own sink connections, router, snapshot
// runtime and observer; the KV checkpoint store; the embedded nats-server
// when nats.url is empty; tracing; the slot pollers; and the HTTP listener
// with /metrics, /livez and /readyz (http.go).
//
// Lifecycle: New validates the config against the plugin registries with
// no network I/O and reports every problem at once, each naming its YAML
// path. Start dials and builds; Run runs every pipeline until the context
// ends or one stops with a fatal error, then closes everything, each
// goodbye bounded by shutdown.timeout. While Run runs, the App serves the
// control plane (control.go: bridge/control's endpoints on its NATS
// connection) and reloads its configuration (reload.go: Reload, on the
// endpoint, SIGHUP, and changes of the file or of config.kv), adding,
// rebuilding and removing the runners of runners.go. Close releases what a failed Start
// opened. Options choose the registries (WithSinks, WithSources), the
// logger and the tracer provider; nothing is read from package-level state.
package app
