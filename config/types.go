// Package config loads bridge.yaml: koanf layers (YAML file < BRIDGE_* env <
// flags), ${VAR} and ${VAR:-default} interpolation, strict decoding (unknown
// keys are errors), and errors that name their YAML path, all reported at once.
//
// The framework's own keys are decoded into Config here; each plugin's
// `config:` block stays raw and is decoded by the plugin itself through a
// Decoder, so framework and plugin keys never share a map.
package config

import (
	"strings"
	"time"
)

// Config is the whole of bridge.yaml.
type Config struct {
	// Name is the bridge name, the first part of every producer id. Required;
	// letters, digits, '-' and '_' only.
	Name string `koanf:"name"`
	// DataDir holds local state: the embedded NATS server's store, its
	// address and the key its clients authenticate with
	// (embedded-nats.nk, mode 0600), and the compile cache of routes'
	// WebAssembly modules (wasm/). Created with mode 0700 when missing.
	// Default "./data".
	DataDir string `koanf:"data_dir"`
	// NATS is the default NATS connection for the checkpoint store and NATS sinks.
	NATS NATS `koanf:"nats"`
	// Sources are keyed by name.
	Sources map[string]Plugin `koanf:"sources"`
	// Sinks are keyed by name.
	Sinks map[string]Sink `koanf:"sinks"`
	// Routes decide which changes go where; first match wins.
	Routes []Route `koanf:"routes"`
	// Unrouted says what happens to a change no route matches: "drop" (the
	// default; the change is still checkpointed) or "error" (the pipeline stops).
	Unrouted string `koanf:"unrouted"`
	// Checkpoint configures the KV checkpoint store.
	Checkpoint Checkpoint `koanf:"checkpoint"`
	// Schemas configures the schema registry and schema change events
	// (docs/schemas.md).
	Schemas Schemas `koanf:"schemas"`
	// Shutdown bounds each goodbye on SIGTERM. Default 5s.
	Shutdown Shutdown `koanf:"shutdown"`
	// Log configures logging.
	Log Log `koanf:"log"`
	// Telemetry configures traces and metrics.
	Telemetry Telemetry `koanf:"telemetry"`
	// HTTP configures the server of /metrics, /livez, /readyz and the web
	// console.
	HTTP HTTP `koanf:"http"`
	// Serve configures `bridge serve`, the feeds HTTP server (docs/feeds.md);
	// `bridge run` ignores it. A flag named after a key, with dashes
	// (--max-conns for max_conns), overrides the key when given.
	Serve Serve `koanf:"serve"`
	// Config says where more of the configuration comes from: a JetStream
	// KV entry a fleet of bridges shares (docs/control.md).
	Config ConfigSource `koanf:"config"`

	// texts maps the YAML path of each value that came from a BRIDGE_*
	// variable, an override or a ${VAR} reference and was read as a number
	// or boolean to its original text, so that decoding it into a string
	// (here or in a plugin's Decoder) keeps e.g. a numeric password verbatim.
	// Set by Load; nil otherwise.
	texts map[string]string
	// origin records the file's lines and the BRIDGE_* variables, for
	// Problems, the Decoder's errors and IgnoredEnv. Set by Load; nil
	// otherwise.
	origin *origin
}

// NATS is a NATS connection. With URL and Context empty the bridge starts
// an embedded nats-server with JetStream, storing in <data_dir>/nats.
type NATS struct {
	// URL is a comma-separated list of servers (nats://host:4222, or
	// tls://host:4222 to require TLS, verified with the system's roots
	// unless tls.ca_file is set); empty (and no context) starts the
	// embedded server.
	URL string `koanf:"url"`
	// NATSClient holds the credentials, TLS and context keys.
	NATSClient `koanf:",squash"`
	// Embedded configures the embedded server (used only when URL and
	// Context are empty).
	Embedded Embedded `koanf:"embedded"`
}

// NATSClient is how a NATS client authenticates, encrypts and checks that
// its connection is alive: the keys of the nats section and of a NATS
// sink's block besides url.
type NATSClient struct {
	// Context names a context of the nats CLI (`nats context save`), read
	// from $XDG_CONFIG_HOME/nats/context/<name>.json (by default
	// ~/.config/nats/context/<name>.json), or is the path of such a file
	// (ending in .json). Its url, credentials (creds, nkey, user and
	// password, token, user_jwt and user_seed), TLS files (ca, cert, key),
	// tls_first and inbox_prefix apply; a key set here wins over the
	// context's (any credential key replaces the context's credentials).
	// Optional.
	Context string `koanf:"context"`
	// Creds is the path of a .creds file: a user JWT and its nkey seed
	// (operator mode, `nsc generate creds`). Read again at each reconnect.
	// Optional; its content is never logged.
	Creds string `koanf:"creds"`
	// NKeySeedFile is the path of a file holding a user's nkey seed (SU...,
	// `nk -gen user`), for servers whose authorization lists the user's
	// public nkey. Optional; its content is never logged.
	NKeySeedFile string `koanf:"nkey_seed_file"`
	// User and Password for user/password auth. Optional; never logged.
	User     string `koanf:"user"`
	Password string `koanf:"password"`
	// Token for token auth. Optional; never logged.
	Token string `koanf:"token"`
	// TLS verifies the servers and, with cert_file and key_file,
	// authenticates the bridge to servers that require client certificates
	// (verify: true). Setting any of its keys requires TLS, as a tls:// URL
	// does.
	TLS NATSTLS `koanf:"tls"`
	// PingInterval is how often the client pings the server, a duration: a
	// connection that leaves max_pings_outstanding pings in a row
	// unanswered is taken as dead (stale) and the client reconnects, so a
	// link that went silent without a reset (a lost NAT or load-balancer
	// entry, a frozen host) is noticed between ping_interval ×
	// max_pings_outstanding and one ping_interval more after it died:
	// 9 to 12 s with the defaults (nats.go's own default, 2m × 2, took 4 to
	// 6 minutes). Applies to every connection the bridge makes (sinks,
	// checkpoints, control plane, fleet). Default 3s; in a sink's block,
	// the bridge's nats.ping_interval.
	PingInterval time.Duration `koanf:"ping_interval"`
	// MaxPingsOutstanding is how many pings may wait for their answer
	// before the connection is taken as dead, a count (see ping_interval):
	// a healthy server must answer within ping_interval ×
	// max_pings_outstanding (9 s with the defaults), however busy. Default
	// 3; in a sink's block, the bridge's nats.max_pings_outstanding.
	MaxPingsOutstanding int `koanf:"max_pings_outstanding"`
}

// The defaults of NATSClient's ping_interval and max_pings_outstanding.
const (
	DefaultNATSPingInterval        = 3 * time.Second
	DefaultNATSMaxPingsOutstanding = 3
)

// NATSTLS is a NATS client's TLS. Files are PEM, read at start (a file
// that does not load is a configuration error at its key) and again at
// each reconnect, so renewed certificates apply without a restart.
type NATSTLS struct {
	// CAFile holds the CAs that sign the servers' certificates. Default:
	// the system's roots.
	CAFile string `koanf:"ca_file"`
	// CertFile is the client certificate (mutual TLS), with key_file.
	CertFile string `koanf:"cert_file"`
	// KeyFile is the private key of cert_file. Its content is never logged.
	KeyFile string `koanf:"key_file"`
	// ServerName is the name the servers' certificates must hold. Default:
	// the host of the URL connected to.
	ServerName string `koanf:"server_name"`
	// HandshakeFirst starts TLS before the server's first message, for
	// servers configured with handshake_first: true. Default false.
	HandshakeFirst bool `koanf:"handshake_first"`
	// InsecureSkipVerify accepts any server certificate: the connection is
	// encrypted but anyone on the path can impersonate the server. For
	// tests only; the bridge logs a warning at every start. Default false.
	InsecureSkipVerify bool `koanf:"insecure_skip_verify"`
}

// Enabled reports whether t sets any key, which makes TLS required.
func (t NATSTLS) Enabled() bool { return t != NATSTLS{} }

// Embedded configures the in-process nats-server. It admits only clients
// that authenticate: with nats.user and password, or nats.token, when set;
// otherwise with the nkey the bridge keeps in <data_dir>/embedded-nats.nk
// (made at the first start, mode 0600), which the bridge, its helper
// commands and `nats --nkey <data_dir>/embedded-nats.nk` use.
type Embedded struct {
	// Host to listen on. Default "127.0.0.1" (this machine only). Another
	// address requires nats.user and password, or nats.token, which the
	// embedded server then requires of every client.
	Host string `koanf:"host"`
	// Port to listen on; -1 picks a free one. Default 4222.
	Port int `koanf:"port"`
	// StoreDir for JetStream. Default "<data_dir>/nats".
	StoreDir string `koanf:"store_dir"`
	// SyncAlways makes JetStream fsync every write (sync_interval: always).
	SyncAlways bool `koanf:"sync_always"`
}

// Plugin is a source: its type and its own config block.
type Plugin struct {
	// Type is the registered plugin type, e.g. "pgoutput".
	Type string `koanf:"type"`
	// Config is the plugin's own block, decoded by the plugin.
	Config map[string]any `koanf:"config"`
}

// Sink is a sink: framework keys (type, batch, retry) and the plugin's block.
type Sink struct {
	// Type is the registered sink type, e.g. "nats_jetstream".
	Type string `koanf:"type"`
	// Batch bounds batches handed to the sink.
	Batch Batch `koanf:"batch"`
	// Retry is the backoff curve for failed writes.
	Retry Retry `koanf:"retry"`
	// Config is the plugin's own block, decoded by the plugin.
	Config map[string]any `koanf:"config"`
}

// Batch bounds a batch.
type Batch struct {
	// MaxChanges per batch. Default 1000, or the sink type's own
	// (nats_jetstream: 4096, its max_pending). With several sinks on one
	// source the smallest value applies.
	MaxChanges int `koanf:"max_changes"`
	// MaxWait is how long the first change of a partial batch waits for
	// more before the batch is written (an age, not a gap between
	// changes), when the source has more at hand (a large transaction's
	// next part, a backlog); a change that arrives alone is written at
	// once. Default 1ms. With several sinks on one source the largest value
	// applies.
	MaxWait time.Duration `koanf:"max_wait"`
}

// Retry is an exponential backoff with jitter.
type Retry struct {
	// Initial delay. Default 100ms.
	Initial time.Duration `koanf:"initial"`
	// Max delay. Default 10s.
	Max time.Duration `koanf:"max"`
}

// Route sends matching changes to sinks.
type Route struct {
	// Name identifies the route in message ids, metrics and errors: a
	// named route's messages carry Nats-Msg-Id "<position>@<name>", so one
	// change published by several routes, into one stream too, is one
	// message per route for JetStream's dedupe and the resume scan. Letters,
	// digits, '_' and '-', unique among the routes. Required with continue;
	// optional otherwise (an unnamed route's ids have no suffix). Renaming a
	// route changes its ids: do it after a clean stop, not across a crash.
	Name string `koanf:"name"`
	// Continue lets a change this route takes (its match and its filter)
	// go on to the routes after it, each publishing it with its own
	// subject, format and shaping (fan-out: one table to a masked stream and
	// to a KV mirror of the whole row). Default false: the first route that
	// takes a change is its only one. Needs name. Postgres is acknowledged a
	// change only when every route's sinks hold it.
	Continue bool `koanf:"continue"`
	// Match selects changes; an empty match matches everything.
	Match Match `koanf:"match"`
	// Sinks are names of entries under sinks. At least one.
	Sinks []string `koanf:"sinks"`
	// Subject is a Go template over .Source .Schema .Table .Op .Prefix,
	// .Key.<column> and .Col.<column> (the row as published: masked values,
	// no excluded columns) and .Out.<key> (the transform's result).
	// Default "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"; logical messages
	// render with Schema "_message" and Table their prefix.
	Subject string `koanf:"subject"`
	// SchemaSubject is the subject of the schema change events and DDL
	// events of the tables the route takes (schemas.enabled, schemas.ddl;
	// docs/schemas.md), a Go template over .Source .Schema .Table and .Op
	// ("schema" or "ddl"; .Table "_" for a DDL command on no table); row
	// values render as "_". Default: the route's subject rendered so, which
	// puts each event on its table's subject, in order with its changes.
	SchemaSubject string `koanf:"schema_subject"`
	// OnSchemaChange says what a breaking change of the shape of a table
	// the route carries does (a column dropped or retyped, the key changed,
	// NOT NULL dropped, a modifier widened; schemas.enabled;
	// docs/schemas.md): "continue" (the default) publishes the event and
	// goes on; "pause" pauses the source before the transaction of the
	// first change under the new shape, with the reason recorded, until
	// the operator resumes it (bridge resume), which lets that version
	// through; "dead_letter" publishes the event and the table's changes
	// from then on to the route's dead_letter_subject instead of its
	// subjects, the other tables going on, until the operator resumes the
	// source (bridge resume), which accepts the version: the table's next
	// changes go to the route's subject again, after the event announced
	// there. dead_letter is refused on a route to a sink that files changes
	// by key rather than subject (nats_kv).
	OnSchemaChange string `koanf:"on_schema_change"`
	// DeadLetterSubject is where on_schema_change: dead_letter puts a held
	// table's event and changes, a Go template over .Source .Schema .Table
	// and .Op (row values render as "_"). Default: the subject the change
	// would have, with "_dead_letter" inserted as its second token
	// ("cdc.shop.public.orders" → "cdc._dead_letter.shop.public.orders").
	DeadLetterSubject string `koanf:"dead_letter_subject"`
	// Format of the payload: native, debezium or cloudevents. Default "native".
	Format string `koanf:"format"`
	// Debezium sets what the debezium format adds to Debezium's default
	// change event value (docs/formats.md#debezium): Kafka Connect's
	// schemas.enable=true envelope, the message key, tombstones. Only with
	// format: debezium.
	Debezium DebeziumFormat `koanf:"debezium"`
	// Filter is a CEL expression over the change as committed (variables
	// op, schema, table, source, before, after, key, commit_time, xid),
	// e.g. `op != "delete" && after.status in ["paid", "shipped"]`. The
	// route takes only the changes it is true for (reading a row the change
	// does not have, such as after of a delete, counts as false); a change
	// it rejects is tried against the routes after it. Empty: every change
	// the match takes. See docs/shaping.md.
	Filter string `koanf:"filter"`
	// Columns choose the columns the route publishes: for each table, the
	// first entry whose tables match it applies. Key columns are always
	// published (an include list need not name them; an exclude list must
	// not).
	Columns []Columns `koanf:"columns"`
	// Mask replaces column values before they are published: redact (null,
	// and the column is listed as masked), hash (HMAC-SHA256 with hash_key,
	// hex) or truncate (the first N characters). For each column, the first
	// entry that names it for the table applies.
	Mask []Mask `koanf:"mask"`
	// Transform is a CEL expression producing the payload's body as a map,
	// over the same variables as filter but with the row as published
	// (columns chosen, values masked), e.g. `after.payload` for an outbox
	// table. It replaces the whole payload in the native and debezium
	// formats, and the data of a cloudevents event. Empty: the format's
	// payload.
	Transform string `koanf:"transform"`
	// WASMFilter is a WebAssembly module that filters the route's changes
	// after filter, on the change as published (columns left out and
	// masked values never reach it): its function returns 1 to take a
	// change, 0 to reject it (the change is tried against the routes after
	// this one, as with filter). See docs/plugins.md.
	WASMFilter WASM `koanf:"wasm_filter"`
	// WASMTransform is a WebAssembly module that builds the payload's body
	// instead of transform (set one of them): its function returns a JSON
	// object, or drops the change. See docs/plugins.md.
	WASMTransform WASM `koanf:"wasm_transform"`
}

// WASM names a WebAssembly module (contract version 1, docs/plugins.md)
// and the limits of each call. An error in a call (a trap, the timeout,
// memory beyond the cap, an error result) stops the source's pipeline at
// that change, as a failing CEL expression does: nothing from it on is
// acknowledged to Postgres.
type WASM struct {
	// Module is the path of the .wasm file (relative to the bridge's
	// working directory). Required when the block is set.
	Module string `koanf:"module"`
	// SHA256 is the module's sha256 sum in hex (`sha256sum m.wasm`), quoted:
	// a module that differs is refused. Required with module.
	SHA256 string `koanf:"sha256"`
	// Function is the export to call. Default "filter" for wasm_filter,
	// "transform" for wasm_transform.
	Function string `koanf:"function"`
	// Timeout bounds one call; a call past it stops the pipeline. Default 1s:
	// a bound on a runaway module, not a latency budget.
	Timeout time.Duration `koanf:"timeout"`
	// MaxMemoryMiB caps the memory of each instance of the module, in MiB
	// (at most 4096). Default 64.
	MaxMemoryMiB int `koanf:"max_memory_mib"`
}

// Set reports whether w names a module (any key set).
func (w WASM) Set() bool { return w != WASM{} }

// DebeziumFormat are the options of a route's debezium format.
type DebeziumFormat struct {
	// SchemasEnable writes each value as Kafka Connect's JSON converter
	// does with schemas.enable=true: {"schema": {...}, "payload": {...}},
	// the schema describing the payload, its before and after built from
	// the columns of the table's version in the schema registry (the
	// change's shape), as Debezium Server's JSON format writes it unless
	// debezium.format.value.schemas.enable=false. Default false: the bare
	// payload.
	SchemasEnable bool `koanf:"schemas_enable"`
	// Key publishes Debezium's message key (the key columns, as Debezium's
	// key struct; with schemas_enable, in the schema envelope too):
	// "none" (the default; Debezium Server's NATS JetStream sink publishes
	// the value only, on the subject its destination names) or "header":
	// in the Debezium-Key header of each message, JSON.
	Key string `koanf:"key"`
	// TombstonesOnDelete follows each delete with a tombstone, as
	// Debezium's tombstones.on.delete does on Kafka: a message with an
	// empty payload on the delete's subject (and its Debezium-Key header
	// with key: header), for streams that keep the last message per
	// subject. Default false (Debezium Server's NATS sinks drop
	// tombstones).
	TombstonesOnDelete bool `koanf:"tombstones_on_delete"`
}

// Columns chooses the columns a route publishes from some tables: one of
// include and exclude.
type Columns struct {
	// Tables as "schema.table" globs; empty means every table the route takes.
	Tables []string `koanf:"tables"`
	// Include lists the columns to publish; the key columns are published too.
	Include []string `koanf:"include"`
	// Exclude lists the columns to leave out; a key column cannot be left out.
	Exclude []string `koanf:"exclude"`
}

// Mask replaces the values of some columns of some tables.
type Mask struct {
	// Tables as "schema.table" globs; empty means every table the route takes.
	Tables []string `koanf:"tables"`
	// Redact publishes these columns as null and lists them as masked. Not
	// for key columns.
	Redact []string `koanf:"redact"`
	// Hash publishes these columns as the lowercase hex HMAC-SHA256 of
	// their value keyed with hash_key: the same value gives the same hash,
	// so joins still work. Key columns may be hashed.
	Hash []string `koanf:"hash"`
	// HashKey is the secret key of hash, at least 16 bytes; required with
	// hash. Never logged. Use a ${VAR} reference rather than the key itself.
	HashKey string `koanf:"hash_key"`
	// Truncate publishes the first N characters of these text columns (N
	// bytes of bytea ones), by column name: {notes: 20}. Not for key columns.
	Truncate map[string]int `koanf:"truncate"`
}

// Match selects changes.
type Match struct {
	// Sources by name; empty means all.
	Sources []string `koanf:"sources"`
	// Tables as "schema.table" globs (path.Match syntax); empty means all.
	Tables []string `koanf:"tables"`
	// Ops: insert, update, delete, truncate, message, read, control,
	// schema (schema change events), ddl (DDL events); empty means all. A route listing control carries the bridge's control
	// messages (resync) for its sources; see docs/operations.md.
	Ops []string `koanf:"ops"`
}

// Schemas configures the schema registry: every shape of every table a
// source streams, in a JetStream KV bucket, a schema change event before
// the first change under each new shape, and the Bridge-Schema-Version
// header on every row change.
type Schemas struct {
	// Enabled turns the registry, the events and the header on. Default
	// false.
	Enabled bool `koanf:"enabled"`
	// Bucket is the registry's JetStream KV bucket. Default "bridge_schemas".
	Bucket string `koanf:"bucket"`
	// Replicas of the bucket when the bridge creates it. Default 1.
	Replicas int `koanf:"replicas"`
	// DDL publishes DDL events: the text of each DDL command, which the
	// event trigger that `bridge setup ddl` installs writes into the WAL
	// (a logical message with the prefix "bridge.ddl"), in WAL order at
	// its own position, routed by the table it concerns like a schema
	// change event (docs/schemas.md#ddl-events). Needs the trigger, not
	// the registry (schemas.enabled). Default false: those messages are
	// dropped.
	DDL bool `koanf:"ddl"`
}

// Checkpoint configures the KV checkpoint store.
type Checkpoint struct {
	// Bucket is the JetStream KV bucket. Default "bridge_checkpoints".
	Bucket string `koanf:"bucket"`
	// Interval between checkpoint writes. Default 1s.
	Interval time.Duration `koanf:"interval"`
	// Replicas of the bucket when the bridge creates it. Default 1.
	Replicas int `koanf:"replicas"`
	// ConfirmDelay keeps the position confirmed to Postgres (the slot's
	// confirmed_flush_lsn) this long behind the checkpoint: a checkpoint is
	// confirmed only once it is ConfirmDelay old. Set it above the NATS
	// servers' sync_interval (default 2m) when JetStream does not fsync
	// every write, so a NATS machine crash that loses unsynced messages
	// and checkpoints finds the WAL still in the slot and replays it.
	// Postgres keeps that much more WAL. Default 0 (confirm at once; right
	// with sync_interval: always).
	ConfirmDelay time.Duration `koanf:"confirm_delay"`
	// OwnerTimeout lets a standby (another `bridge run` with the same
	// configuration, outside a fleet) take a source over from an owner
	// that stalled without closing its connection (a long GC pause, a
	// stopped VM, a network partition) instead of waiting for Postgres to
	// drop its walsender (wal_sender_timeout, 60s by default). The
	// instance streaming a source rewrites a heartbeat (key
	// "<name>.<source>.owner" in the checkpoint bucket) every
	// OwnerTimeout/4; a standby that finds the slot held by the walsender
	// the heartbeat names, and sees the heartbeat unchanged for
	// OwnerTimeout on its own clock, ends that walsender
	// (pg_terminate_backend) and takes the slot. The standby's role must be
	// the owner's role (or a member of it) or a member of
	// pg_signal_backend. Set it on every instance, above the longest stall
	// a healthy owner may have (e.g. 10s); the longer of the owner's and
	// the standby's applies. A fleet (`run --fleet`) needs none: the
	// member holding a source's lease ends a former holder's walsender at
	// once. Default 0 (off: a standby waits for Postgres to drop the
	// walsender); else at least 1s.
	OwnerTimeout time.Duration `koanf:"owner_timeout"`
}

// Shutdown bounds shutdown.
type Shutdown struct {
	// Timeout for each goodbye (drain, final checkpoint, status). Default 5s.
	Timeout time.Duration `koanf:"timeout"`
}

// Log configures logging.
type Log struct {
	// Level: debug, info, warn, error. Default info.
	Level string `koanf:"level"`
	// Format: text, json, or auto (text on a terminal). Default auto.
	Format string `koanf:"format"`
}

// Telemetry configures traces and metrics. The standard OTEL_* variables
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME,
// OTEL_TRACES_EXPORTER=none, OTEL_SDK_DISABLED) win over these keys when set.
type Telemetry struct {
	// Tracing configures the OpenTelemetry traces of changes.
	Tracing Tracing `koanf:"tracing"`
	// Metrics configures what /metrics reports.
	Metrics Metrics `koanf:"metrics"`
}

// Tracing configures a span per change, child of a span per transaction,
// exported with OTLP.
type Tracing struct {
	// Enabled turns tracing on or off. Default: on when an exporter endpoint
	// is configured (Endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp;
	// otherwise off, at no cost.
	Enabled *bool `koanf:"enabled"`
	// Endpoint is the OTLP collector's base URL, like
	// OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318" (http/protobuf,
	// "/v1/traces" is appended) or "http://collector:4317" (grpc); https
	// uses TLS. Default: the exporter's (localhost).
	Endpoint string `koanf:"endpoint"`
	// Protocol is "http/protobuf" or "grpc". Default "http/protobuf".
	Protocol string `koanf:"protocol"`
	// SampleRatio is the fraction of transactions traced (0 to 1), unless
	// the writer's trace context decides (parent-based). Default 1.
	SampleRatio float64 `koanf:"sample_ratio"`
	// ContextPrefix is the prefix of the logical message
	// (pg_logical_emit_message) whose content, a W3C traceparent or a JSON
	// object {"traceparent": "...", "tracestate": "..."}, makes the
	// transaction's spans children of the writer's trace. Such messages are
	// consumed, not published, unless the first route that matches them
	// lists message in match.ops. Default "traceparent"; "" turns it off.
	ContextPrefix string `koanf:"context_prefix"`
}

// Metrics configures what /metrics reports.
type Metrics struct {
	// SlotPollInterval is how often each Postgres source's slot (retained
	// WAL, wal_status) and WAL end are read on a regular connection. Default
	// 10s.
	SlotPollInterval time.Duration `koanf:"slot_poll_interval"`
}

// HTTP configures the HTTP server of /metrics, /livez, /readyz and the
// web console.
type HTTP struct {
	// Listen is the address to serve on. Default "127.0.0.1:8080"; ""
	// disables the server.
	Listen string `koanf:"listen"`
	// MaxCheckpointAge is how long delivered changes may wait for their
	// checkpoint before /readyz fails. Default 1m.
	MaxCheckpointAge time.Duration `koanf:"max_checkpoint_age"`
	// TLS serves HTTPS with a certificate read from files and reloaded on
	// SIGHUP or when the files change; with client_ca_file, only clients
	// presenting a certificate signed by that CA connect (mutual TLS).
	TLS ServerTLS `koanf:"tls"`
	// Token, when set, is required on /metrics as "Authorization: Bearer
	// <token>" (Prometheus: authorization.credentials_file); /livez and
	// /readyz stay open. A secret: never logged; read it from a file with
	// ${file:/run/secrets/metrics_token}.
	Token string `koanf:"token"`
	// AllowPublic lets a listen address other than loopback serve /metrics
	// without http.token or http.tls.client_ca_file. Without it such a
	// configuration is refused. Default false.
	AllowPublic bool `koanf:"allow_public"`
	// Console serves the web console at /console/ (docs/operations.md):
	// each source's state, lag and slot, the sinks, snapshots, a live tail
	// and the pause, resume and snapshot buttons. On a loopback address it
	// is open to the machine's users; beyond loopback it is served only
	// behind serve.auth (jwt or proxy), the authentication of `bridge
	// serve`, and is otherwise left off with a warning. Default true.
	Console bool `koanf:"console"`
	// AllowedHosts are the names, besides localhost and loopback
	// addresses, that requests may carry in their Host header (any port):
	// "bridge.internal", or ".example.com" for example.com and every name
	// below it. On a loopback listen address any other Host is refused
	// with 403, so that a web page whose name is re-pointed at 127.0.0.1
	// (DNS rebinding) cannot read or press anything; beyond loopback, when
	// set, only these names, loopback names and IP addresses are served.
	// Default none.
	AllowedHosts []string `koanf:"allowed_hosts"`
}

// ServerTLS is the certificate of an HTTPS listener (http.tls, serve.tls),
// reloaded on SIGHUP and when a file changes; a file that fails to load at
// reload keeps the previous certificate. All PEM.
type ServerTLS struct {
	// CertFile is the server's certificate chain, leaf first. Set with
	// key_file; empty serves plain HTTP.
	CertFile string `koanf:"cert_file"`
	// KeyFile is the private key of cert_file.
	KeyFile string `koanf:"key_file"`
	// ClientCAFile, when set, requires every client to present a
	// certificate signed by one of its CAs (mutual TLS). Needs cert_file.
	ClientCAFile string `koanf:"client_ca_file"`
}

// Serve configures `bridge serve`, the feeds HTTP server (docs/feeds.md);
// `bridge run` ignores it. A flag named after a key, with dashes
// (--max-conns for max_conns), overrides the key when given.
type Serve struct {
	// Listen is the HTTP address of the feeds, /metrics, /livez and /readyz.
	// Default "127.0.0.1:8090".
	Listen string `koanf:"listen"`
	// Stream is the JetStream stream the bridge's nats_jetstream sink
	// writes. Default "CDC".
	Stream string `koanf:"stream"`
	// Route, when set, names the route (routes[].name) whose messages the
	// feeds serve, for a stream several routes write (continue); the
	// stream's other messages match no feed. Empty: every message, for a
	// stream one route writes. The feeds read the native format: the route
	// must have it.
	Route string `koanf:"route"`
	// Where is a condition ANDed with every request's filter, replayed
	// history included, in the JSON form of a feeds condition written as
	// YAML, e.g. {eq: [tenant_id, 42]} or {and: [{eq: [tenant_id, 42]},
	// {ne: [status, secret]}]}. Empty adds none. Quote timestamps.
	Where map[string]any `koanf:"where"`
	// Tables, when set, are the only "schema.table" names (not globs) a
	// request may read; a request naming none reads all of them. Empty: every
	// table.
	Tables []string `koanf:"tables"`
	// MaxConns bounds the feed requests (long-polls and SSE streams) in
	// progress; beyond it requests get 503 with Retry-After. Default 10000.
	MaxConns int `koanf:"max_conns"`
	// MaxPerClient bounds the feed requests in progress per client (with
	// JWTs the token's sub, or the token itself when it has none, whatever
	// headers it sends; else the client_header value; else the remote IP);
	// beyond it requests get 429 with Retry-After. Default 100.
	MaxPerClient int `koanf:"max_per_client"`
	// ClientHeader names the request header identifying a client for
	// max_per_client, e.g. one an authenticating proxy sets; without a JWT
	// key it makes serve.auth.mode proxy, which trusts the header only on a
	// loopback serve.listen or with serve.tls.client_ca_file. With JWTs the
	// token names the client, never this header. Default "" (the remote
	// IP).
	ClientHeader string `koanf:"client_header"`
	// Hold is the default and longest long-poll wait. Default 20s.
	Hold time.Duration `koanf:"hold"`
	// KeepAlive is the interval of SSE keep-alive comments. Default 15s.
	KeepAlive time.Duration `koanf:"keep_alive"`
	// WriteTimeout bounds each SSE write; a client that does not take an
	// event within it is disconnected and resumes with Last-Event-ID.
	// Default 10s.
	WriteTimeout time.Duration `koanf:"write_timeout"`
	// MaxLag is how many stream messages an SSE client may fall behind the
	// stream's head before it is disconnected as slow. Default 100000.
	MaxLag uint64 `koanf:"max_lag"`
	// WindowTxns bounds the transactions kept in memory to serve resumes
	// without reading the stream. Default 100000.
	WindowTxns int `koanf:"window_txns"`
	// WindowBytes bounds the memory of that window: the changes kept and
	// their encodings, in bytes. A change whose payload (a payload stored
	// in a large_payload_bucket included) is larger than half of it is not
	// served. Default 67108864 (64 MiB).
	WindowBytes int64 `koanf:"window_bytes"`
	// MaxProjections bounds the distinct column sets (columns=) in use at
	// once: each keeps its own encoding of the changes it serves (counted
	// in the window's memory). A request for one more gets 503 with
	// Retry-After while every one is in use; a set no request uses is
	// dropped after projection_idle. Default 1000.
	MaxProjections int `koanf:"max_projections"`
	// MaxColumns bounds the distinct columns a request's columns= may
	// name; beyond it the server answers 400. Default 256.
	MaxColumns int `koanf:"max_columns"`
	// ProjectionIdle is how long a column set no request uses is kept for
	// the next request asking for it. Default 1m.
	ProjectionIdle time.Duration `koanf:"projection_idle"`
	// TokenSecret, when set, signs every resume token the server hands out
	// (HMAC-SHA256), and a token without a valid signature (forged, changed,
	// or from before the secret was set) gets 400: a client can then only
	// resume from a position it was given. At least 32 bytes; the same on
	// every process behind one load balancer; changing it refuses the
	// tokens clients hold. A secret: never logged; read it from a file
	// with ${file:/run/secrets/token_secret}. Default "" (tokens are
	// unsigned positions).
	TokenSecret string `koanf:"token_secret"`
	// TLS serves the feeds over HTTPS (see http.tls).
	TLS ServerTLS `koanf:"tls"`
	// Auth decides who may read which rows (docs/security.md). A listen
	// address other than loopback needs it, or serve.client_header behind
	// an authenticating proxy, or auth.mode: none.
	Auth ServeAuth `koanf:"auth"`
	// MaxHeaderBytes bounds a request's line and headers; beyond it the
	// server answers 431. Default 65536.
	MaxHeaderBytes int `koanf:"max_header_bytes"`
	// MaxQueryBytes bounds a request's query string (filters included);
	// beyond it the server answers 414. Default 16384.
	MaxQueryBytes int `koanf:"max_query_bytes"`
	// MaxFilterDepth bounds how deeply a request's where may nest and, or
	// and not; beyond it the server answers 400. Default 16.
	MaxFilterDepth int `koanf:"max_filter_depth"`
	// ReadHeaderTimeout bounds the time a client may take to send its
	// request's headers (and the TLS handshake); a slower client is
	// disconnected. Default 10s.
	ReadHeaderTimeout time.Duration `koanf:"read_header_timeout"`
	// IdleTimeout closes a kept-alive connection without a request for this
	// long. Default 2m.
	IdleTimeout time.Duration `koanf:"idle_timeout"`
	// AllowedHosts are the names, besides localhost and loopback
	// addresses, that requests may carry in their Host header (any port):
	// "feeds.internal", or ".example.com" for example.com and every name
	// below it. On a loopback listen address any other Host is refused
	// with 403 (DNS rebinding protection); beyond loopback, when set, only
	// these names, loopback names and IP addresses are served. Default
	// none.
	AllowedHosts []string `koanf:"allowed_hosts"`
}

// ServeAuth authenticates `bridge serve`'s callers and limits what each
// may read (docs/security.md).
type ServeAuth struct {
	// Mode is jwt (bearer JWTs verified here, with hs256_secret, jwks_file
	// or jwks_url), proxy (an authenticating proxy in front sets
	// serve.client_header; a request without it gets 401) or none (no
	// authentication; needed to serve a listen address other than loopback
	// without either). Default: jwt when a key is set, else proxy when
	// serve.client_header is set, else none.
	Mode string `koanf:"mode"`
	// HS256Secret verifies HS256 tokens: at least 32 bytes. A secret: never
	// logged; read it from a file with ${file:/run/secrets/jwt_secret}.
	HS256Secret string `koanf:"hs256_secret"`
	// JWKSFile is a JSON Web Key Set verifying RS256, ES256 (and the other
	// RSA, ECDSA and EdDSA algorithms) tokens by their kid; reloaded when the
	// file changes or on SIGHUP.
	JWKSFile string `koanf:"jwks_file"`
	// JWKSURL is the identity provider's JSON Web Key Set, fetched at start
	// and refreshed hourly and when a token names an unknown kid (at most
	// every 5 minutes). https only, except on loopback.
	JWKSURL string `koanf:"jwks_url"`
	// Issuer, when set, must equal the token's iss claim.
	Issuer string `koanf:"issuer"`
	// Audience, when set, must be one of the token's aud claim.
	Audience string `koanf:"audience"`
	// Leeway is the clock skew allowed when checking exp, nbf and iat.
	// Default 30s.
	Leeway time.Duration `koanf:"leeway"`
	// TablesClaim names the claim listing the "schema.table" names the
	// caller may read (a JSON array of strings, or one string of names
	// separated by spaces or commas). A request for another table gets 403;
	// a token without the claim reads nothing. Empty: every table served.
	TablesClaim string `koanf:"tables_claim"`
	// Where is a condition over the token's claims ANDed with every
	// request's filter, e.g. {eq: [tenant_id, "{{.claims.tenant_id}}"]}. A
	// value that is exactly one {{.claims.<name>}} takes the claim's JSON
	// value (number, string, boolean; an array for in and contains);
	// other templates render to a string. A claim can only ever be a value,
	// never a column or a condition. A token missing a claim it uses gets 403.
	Where map[string]any `koanf:"where"`
	// QueryToken accepts the token in the access_token query parameter as
	// well, for browsers' EventSource, which cannot set headers. Query
	// strings end up in proxies' access logs and browser history: only with
	// serve.tls or on loopback (a TLS-terminating proxy on the same host);
	// the web console's listener accepts it only over http.tls or on
	// loopback too. Default false.
	QueryToken bool `koanf:"query_token"`
	// ScopeClaim names the claim holding the caller's scopes: a string of
	// scopes separated by spaces (OAuth's "scope") or a JSON array of
	// strings ("scp", "roles"). The web console's overview needs the scope
	// bridge:status or bridge:control, its pause, resume and snapshot
	// buttons bridge:control (and a sub, which is recorded as who acted).
	// The feeds need neither. Default "scope".
	ScopeClaim string `koanf:"scope_claim"`
	// ScopeHeader names the header in which the authenticating proxy
	// (mode proxy) sends the caller's scopes, separated by spaces or
	// commas: the console's overview needs bridge:status or
	// bridge:control, its buttons bridge:control. Without it the console
	// shows proxy-authenticated callers nothing. The proxy must set it
	// and strip it from what clients send, like serve.client_header.
	// Default "" (none).
	ScopeHeader string `koanf:"scope_header"`
}

// ConfigSource names a shared, versioned configuration kept in NATS.
type ConfigSource struct {
	// KV is "bucket/key": a JetStream KV entry holding YAML in the form of
	// this file (sources, sinks, routes, ...), read through this file's
	// nats section and layered over this file (its keys win; BRIDGE_*
	// variables and flags win over both). `bridge run` watches the key and
	// reloads when it changes; a version that fails validation is refused
	// whole and the running configuration goes on. The entry cannot itself
	// set config, nor what is each machine's own: name, data_dir, nats,
	// http, serve, telemetry, and in a source or sink where it connects,
	// with what credentials, or what it runs or writes (dsn, url, urls,
	// context, creds, nkey_seed_file, user, password, token, tls,
	// spill_dir, command, args, env, sha256, and any sink of type plugin).
	// It never reads this machine's files or environment: a ${file:...} in
	// it is refused, and so is a ${VAR} (or ${VAR:-default}) whose VAR
	// kv_env does not list. Default "" (none).
	KV string `koanf:"kv"`
	// KVEnv lists the environment variables the config.kv entry may
	// reference with ${VAR} or ${VAR:-default}, each expanded with this
	// process's environment (per-process values: REGION, POD_NAME).
	// Whoever can write the entry reads every variable listed here on
	// every bridge (in a subject, say), so list nothing secret: a secret
	// goes in this file, under the key that needs it, which the entry
	// then leaves out. Only this file, BRIDGE_CONFIG__KV_ENV and flags can
	// set it, never the entry. Default empty: the entry references no
	// variable.
	KVEnv []string `koanf:"kv_env"`
	// Watch makes `bridge run` reload the configuration when the file
	// changes (written, replaced, re-linked as Kubernetes does with a
	// ConfigMap) and when the config.kv entry gets a new revision. SIGHUP
	// and the reload endpoint reload it either way. Default true.
	Watch bool `koanf:"watch"`
}

// KVLocation splits config.kv into its bucket and key; ok is false when
// config.kv is not set.
func (c ConfigSource) KVLocation() (bucket, key string, ok bool) {
	bucket, key, ok = strings.Cut(c.KV, "/")
	return bucket, key, ok && c.KV != ""
}
