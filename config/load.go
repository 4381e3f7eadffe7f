package config

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix starts the name of every environment variable that overrides a
// key of bridge.yaml.
const EnvPrefix = "BRIDGE_"

// Per-entry defaults, filled into each sink and route that lacks the key.
const (
	defaultMaxChanges   = 1000
	defaultMaxWait      = time.Millisecond
	defaultRetryInitial = 100 * time.Millisecond
	defaultRetryMax     = 10 * time.Second
	defaultSubject      = "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"
	defaultFormat       = "native"
)

// defaults is the bottom layer of every Load, keyed by dotted path. The
// embedded store_dir default depends on data_dir and is filled in after the
// layers are merged, like the per-sink and per-route defaults.
func defaults() map[string]any {
	return map[string]any{
		"data_dir":                   "./data",
		"nats.embedded.host":         "127.0.0.1",
		"nats.embedded.port":         4222,
		"nats.ping_interval":         DefaultNATSPingInterval,
		"nats.max_pings_outstanding": DefaultNATSMaxPingsOutstanding,
		"unrouted":                   "drop",
		"checkpoint.bucket":          "bridge_checkpoints",
		"checkpoint.interval":        time.Second,
		"checkpoint.replicas":        1,
		"schemas.bucket":             "bridge_schemas",
		"schemas.replicas":           1,
		"shutdown.timeout":           5 * time.Second,
		"log.level":                  "info",
		"log.format":                 "auto",

		"telemetry.tracing.sample_ratio":       1.0,
		"telemetry.tracing.protocol":           "http/protobuf",
		"telemetry.tracing.context_prefix":     "traceparent",
		"telemetry.metrics.slot_poll_interval": 10 * time.Second,
		"http.listen":                          "127.0.0.1:8080",
		"http.max_checkpoint_age":              time.Minute,
		"http.console":                         true,
		"config.watch":                         true,

		"serve.listen":          "127.0.0.1:8090",
		"serve.stream":          "CDC",
		"serve.max_conns":       10000,
		"serve.max_per_client":  100,
		"serve.hold":            20 * time.Second,
		"serve.keep_alive":      15 * time.Second,
		"serve.write_timeout":   10 * time.Second,
		"serve.max_lag":         100000,
		"serve.window_txns":     100000,
		"serve.window_bytes":    64 << 20,
		"serve.max_projections": 1000,
		"serve.max_columns":     256,
		"serve.projection_idle": time.Minute,

		"serve.max_header_bytes":    65536,
		"serve.max_query_bytes":     16384,
		"serve.max_filter_depth":    16,
		"serve.read_header_timeout": 10 * time.Second,
		"serve.idle_timeout":        2 * time.Minute,
		"serve.auth.leeway":         30 * time.Second,
		"serve.auth.scope_claim":    "scope",
	}
}

// Option configures Load.
type Option func(*options)

type options struct {
	environ   func() []string
	overrides []map[string]any
	batch     func(sinkType string) Batch
	doc       *document
}

// document is a configuration layered over the file (WithDocument).
type document struct {
	name string
	b    []byte
}

// docLines offsets the lines of a WithDocument document in the order of
// problems, so that they come after the file's.
const docLines = 1 << 20

// WithDocument layers the YAML text b over the file, under the layers of
// the environment and the overrides: it is how the entry config.kv names
// reaches the config. name says where b comes from in messages ("kv
// bridge_config/shop revision 7"). b may not set config (the source of b
// itself); its keys merge as the file's do. Its strings are interpolated,
// except that b may not read this machine's secrets: a ${file:...} is an
// error at its key, and so is a ${VAR} or ${VAR:-default} whose VAR
// config.kv_env (of the other layers) does not list.
func WithDocument(name string, b []byte) Option {
	return func(o *options) { o.doc = &document{name: name, b: b} }
}

// WithBatchDefaults gives each sink's batch keys defaults by the sink's type:
// for a sink of type t, the non-zero fields of defaults(t) replace the
// framework's (max_changes 1000, max_wait 1ms). A key any layer sets still
// wins. The bridge passes its sink registry's (sinks.BatchDefaults), so that
// a plugin can ask for the batch size it works best with.
func WithBatchDefaults(defaults func(sinkType string) Batch) Option {
	return func(o *options) { o.batch = defaults }
}

// WithEnv makes Load take environment variables, for BRIDGE_* overrides and
// ${VAR} interpolation alike, from environ ("NAME=value" entries, as
// os.Environ returns them) instead of os.Environ. Tests use it to stay off
// the process environment.
func WithEnv(environ func() []string) Option {
	return func(o *options) { o.environ = environ }
}

// WithOverrides layers m over the file and the environment; it is how the
// command line's flags reach the config. Keys are dotted paths
// ("checkpoint.interval", "sources.shop.config.dsn"), values may also be
// nested maps. String values are read as YAML scalars, like BRIDGE_* values;
// other values (an int, a time.Duration) are used as they are; nil values are
// ignored. With several WithOverrides the later wins.
func WithOverrides(m map[string]any) Option {
	return func(o *options) { o.overrides = append(o.overrides, m) }
}

// Load reads the bridge config. It merges, each layer over the previous:
//
//  1. defaults (see the Config fields; each sink's batch and retry, each
//     route's subject and format, and nats.embedded.store_dir
//     ("<data_dir>/nats") are defaulted after merging, so that they apply to
//     sinks and routes from any layer);
//  2. the YAML file at path, unless path is ""; after parsing, every string
//     value is interpolated, so a variable's value or a file's content can
//     never inject YAML: ${VAR} is VAR's value (an error naming the key's
//     path and VAR when VAR is unset), ${VAR:-default} is default when VAR
//     is unset or empty, ${file:PATH} is the content of the file at PATH
//     (relative to the working directory) without its trailing newlines (an
//     error naming the key's path and the file when it cannot be read, or
//     is larger than 1 MiB; the content is never quoted), $$ is a literal $,
//     and any other $ is an error; a value holding a reference that expands
//     to a plain number or boolean becomes one (port: "${NATS_PORT:-4222}"
//     is an int), which a string field still receives as its text;
//  3. BRIDGE_* environment variables: the name after the prefix is
//     lowercased and split at double underscores
//     (BRIDGE_SOURCES__SHOP__CONFIG__DSN sets sources.shop.config.dsn), and
//     the value is read as a YAML scalar ("500" is an int, "true" a bool, all
//     else a string); values are not interpolated, since the shell has
//     already expanded them;
//  4. WithOverrides maps, in order.
//
// A null value counts as absent, so it never overrides a default. Maps merge
// key by key; lists are replaced whole. A value read as a number or boolean
// from the environment, an override or an interpolation still decodes into
// a string field as its original text.
//
// Lists from the environment: a variable sets a whole list of plain values
// (strings, numbers, durations), here or in a plugin's block, as its items
// separated by commas and trimmed (BRIDGE_SERVE__TABLES=public.a,public.b),
// or as a YAML flow list when an item holds a comma ([a, "b,c"]); an empty
// value is an empty list. A list of mappings (routes, say) cannot come from
// a variable, nor can single list items (BRIDGE_ROUTES__0__SUBJECT): both are
// errors that say to write the list in the file.
//
// Which variables are read: one whose first level is a top-level key
// (name, data_dir, nats, sources, sinks, routes, unrouted, checkpoint,
// shutdown, log, telemetry, http, serve) is decoded strictly, like the file.
// One that is not, but looks like a typo of a key, is an error that names
// the key meant: a single underscore where levels need two
// (BRIDGE_CHECKPOINT_INTERVAL: did you mean BRIDGE_CHECKPOINT__INTERVAL?), or
// a first level one edit away from a top-level key (BRIDGE_SINK__MAIN__TYPE).
// Any other is ignored, so that the variables Kubernetes sets for a Service
// named bridge (BRIDGE_SERVICE_HOST, BRIDGE_PORT_8080_TCP, ...) never stop
// the bridge; Config.IgnoredEnv lists them.
//
// The merged tree is decoded strictly into Config (unknown keys, wrong types
// and bad durations are errors at their YAML path; plugin `config:` blocks
// stay raw for Config.Decoder) and validated (see Config.Validate). Every
// such problem, interpolation and environment errors included, is returned
// at once as Errors, in the order of the file (see Config.Problems), each
// at a key a variable set naming the variable, together with the partially
// decoded Config (so a caller can report further problems at once with
// Config.Problems; it must not run it). A file that cannot be read is
// returned as a wrapped error (errors.Is(err, fs.ErrNotExist) works); one
// that does not parse, holds a key twice or is not a mapping, as
// *SyntaxError values joined, each at its line.
func Load(path string, opts ...Option) (*Config, error) {
	o := options{environ: os.Environ}
	for _, opt := range opts {
		opt(&o)
	}
	return load(path, o)
}

func load(path string, o options) (*Config, error) {
	l := loader{texts: map[string]string{}, vars: map[string]string{}, fromEnv: map[string]string{}, hints: map[string]string{}, overridden: map[string]bool{}}
	for _, kv := range o.environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			l.vars[k] = v
		}
	}

	k := koanf.New(".")
	if err := k.Load(confmap.Provider(defaults(), "."), nil); err != nil {
		return nil, fmt.Errorf("loading defaults: %w", err)
	}
	var lines map[string]int
	if path != "" {
		b, err := file.Provider(path).ReadBytes()
		if err != nil {
			return nil, fmt.Errorf("reading config file: %w", err)
		}
		m, ls, err := parseFile(path, b)
		if err != nil {
			return nil, err
		}
		lines = ls
		l.interpolate("", m, l.resolver())
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("merging config file %s: %w", path, err)
		}
	}
	if d := o.doc; d != nil {
		m, ls, err := parseFile(d.name, d.b)
		if err != nil {
			return nil, err
		}
		if _, ok := m["config"]; ok {
			l.errs.add("config", "%s sets config, the source of the configuration: only the local file may; remove it from %s", d.name, d.name)
			delete(m, "config")
		}
		l.refuseLocalKeys(d.name, m, func(sink string) string { return k.String("sinks." + sink + ".type") })
		if lines == nil {
			lines = map[string]int{}
		}
		for p, n := range ls {
			lines[p] = docLines + n // its value wins
		}
		// The variables it may read are config.kv_env's, which only the
		// other layers set (it cannot set config): load them alone.
		without := o
		without.doc = nil
		var allowed []string
		if c, _ := load(path, without); c != nil {
			allowed = c.Config.KVEnv
		}
		l.interpolate("", m, l.docResolver(d.name, allowed))
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("merging %s: %w", d.name, err)
		}
	}
	envp := env.Provider(".", env.Opt{Prefix: EnvPrefix, TransformFunc: l.envKey, EnvironFunc: o.environ})
	if err := k.Load(envp, nil); err != nil {
		return nil, fmt.Errorf("loading %s* environment variables: %w", EnvPrefix, err)
	}
	for _, m := range o.overrides {
		typed := map[string]any{}
		for key, v := range m {
			l.markOverridden(key, v)
			for k := range l.fromEnv { // an override replaces what the environment set
				if k == key || strings.HasPrefix(k, key+".") {
					delete(l.fromEnv, k)
				}
			}
			if v = l.typeOverride(key, v); v != nil {
				typed[key] = v
			}
		}
		if err := k.Load(confmap.Provider(typed, "."), nil); err != nil {
			return nil, fmt.Errorf("loading overrides: %w", err)
		}
	}

	raw := k.Raw()
	setEntryDefaults(raw, o.batch)
	slices.Sort(l.ignored)
	cfg := &Config{origin: &origin{lines: lines, env: l.fromEnv, overridden: l.overridden, hints: l.hints, ignored: l.ignored}}
	if len(l.texts) > 0 {
		cfg.texts = l.texts
	}
	d := decoder{texts: l.texts, env: l.fromEnv}
	d.decode("", raw, reflect.ValueOf(cfg).Elem())
	errs := append(l.errs, d.errs...)
	errs = append(errs, cfg.validate(errs)...)
	cfg.origin.blame(errs)
	cfg.origin.order(errs)
	if err := errs.err(); err != nil {
		// The partial Config lets tools such as `bridge validate` report
		// plugin and route problems in the same pass (Config.Problems).
		return cfg, err
	}
	return cfg, nil
}

// loader holds the state of one Load.
type loader struct {
	vars  map[string]string // the environment, for interpolation
	texts map[string]string // see Config.texts
	errs  Errors            // interpolation and environment problems
	// fromEnv maps keys set through BRIDGE_* variables to the variable.
	fromEnv map[string]string
	// hints maps a variable that sets no known key to the one it probably
	// meant (see underscoreHint).
	hints map[string]string
	// ignored lists the variables that name no key (see envKey).
	ignored []string
	// overridden holds the keys WithOverrides set.
	overridden map[string]bool
	// files caches the files ${file:PATH} references read.
	files map[string]fileRef
}

func (l *loader) lookup(name string) (string, bool) {
	v, ok := l.vars[name]
	return v, ok
}

// fileRef is a file read by a ${file:PATH} reference.
type fileRef struct {
	content string
	err     error
}

// readFile returns the content of the file at path for a ${file:PATH}
// reference, reading each file once per Load, so that every key naming it
// gets the same content.
func (l *loader) readFile(path string) (string, error) {
	f, ok := l.files[path]
	if !ok {
		f.content, f.err = readFileRef(path)
		if l.files == nil {
			l.files = map[string]fileRef{}
		}
		l.files[path] = f
	}
	return f.content, f.err
}

// resolver resolves the references of the file: every variable, every
// file.
func (l *loader) resolver() resolver { return resolver{env: l.lookup, file: l.readFile} }

// docResolver resolves the references of a document from NATS (name, e.g.
// "kv bridge_config/shop revision 7"; WithDocument): whoever can write the
// entry must not read this machine's secrets through it, in a value the
// bridge publishes (a subject) or sends elsewhere (a URL). So it refuses
// every ${file:...}, and every variable but those allowed (config.kv_env);
// each refusal names the document and says where the value belongs.
func (l *loader) docResolver(name string, allowed []string) resolver {
	r := l.resolver()
	r.refuse = func(v string, file bool) error {
		if file {
			return fmt.Errorf("%s may not read files (${file:...}): whoever can write that entry would read this machine's files through it; "+
				"set this key in the local file, where ${file:...} works, and leave it out of the entry", name)
		}
		if slices.Contains(allowed, v) {
			return nil
		}
		return fmt.Errorf("%s may not read environment variable %s (${%s}): whoever can write that entry would read it on every bridge; "+
			"set this key in the local file or a %s* variable and leave it out of the entry, or, if %s holds no secret, list it in config.kv_env of the local file",
			name, v, v, EnvPrefix, v)
	}
	return r
}

// interpolate expands, in place, every string in the tree v found at path
// with r, recording errors, and drops null values from maps.
func (l *loader) interpolate(path string, v any, r resolver) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if e == nil {
				delete(x, k)
				continue
			}
			x[k] = l.interpolate(joinPath(path, k), e, r)
		}
	case map[any]any: // a mapping with non-string keys
		m := make(map[string]any, len(x))
		for k, e := range x {
			key := fmt.Sprint(k)
			if k == nil {
				key = "null" // as written: e.g. serve.where: {null: deleted_at}
			}
			m[key] = e
		}
		return l.interpolate(path, m, r)
	case []any:
		for i, e := range x {
			x[i] = l.interpolate(indexPath(path, i), e, r)
		}
	case string:
		s, substituted, err := expand(x, r)
		if err != nil {
			l.errs.add(path, "%v", err)
			return x
		}
		if substituted {
			return l.typed(path, s)
		}
		return s
	}
	return v
}

// typed reads s, the text of the value at path, as a YAML scalar, and
// records the text when the value is not a string.
func (l *loader) typed(path, s string) any {
	v := scalar(s)
	if _, ok := v.(string); !ok {
		l.texts[path] = s
	} else {
		delete(l.texts, path)
	}
	return v
}

// markOverridden records the keys an override of value v at path sets: path
// itself, or the keys inside v when it is a mapping.
func (l *loader) markOverridden(path string, v any) {
	m, ok := v.(map[string]any)
	if !ok {
		l.overridden[path] = true
		return
	}
	for k, e := range m {
		l.markOverridden(joinPath(path, k), e)
	}
}

// typeOverride reads the string values of an override found at path as YAML
// scalars, recursing into maps and lists, and drops nils from maps.
func (l *loader) typeOverride(path string, v any) any {
	switch x := v.(type) {
	case string:
		return l.typed(path, x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if e = l.typeOverride(joinPath(path, k), e); e != nil {
				out[k] = e
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = l.typeOverride(indexPath(path, i), e)
		}
		return out
	default:
		return v
	}
}

// setEntryDefaults fills the defaults that depend on the merged tree: each
// sink's batch (batch(type)'s non-zero fields, when batch is not nil, over
// the framework's) and retry, each route's subject and format, and the
// embedded store_dir. A key that is present, or a section that is not a
// mapping (a decoding error to come), is left alone.
func setEntryDefaults(raw map[string]any, batch func(sinkType string) Batch) {
	if sinks, ok := raw["sinks"].(map[string]any); ok {
		for name, s := range sinks {
			if s == nil {
				s = map[string]any{}
				sinks[name] = s
			}
			if m, ok := s.(map[string]any); ok {
				b := Batch{MaxChanges: defaultMaxChanges, MaxWait: defaultMaxWait}
				if typ, ok := m["type"].(string); ok && batch != nil {
					own := batch(typ)
					if own.MaxChanges > 0 {
						b.MaxChanges = own.MaxChanges
					}
					if own.MaxWait > 0 {
						b.MaxWait = own.MaxWait
					}
				}
				setDefault(m, b.MaxChanges, "batch", "max_changes")
				setDefault(m, b.MaxWait, "batch", "max_wait")
				setDefault(m, defaultRetryInitial, "retry", "initial")
				setDefault(m, defaultRetryMax, "retry", "max")
			}
		}
	}
	if routes, ok := raw["routes"].([]any); ok {
		for i, r := range routes {
			if r == nil {
				r = map[string]any{}
				routes[i] = r
			}
			if m, ok := r.(map[string]any); ok {
				setDefault(m, defaultSubject, "subject")
				setDefault(m, defaultFormat, "format")
			}
		}
	}
	if dir, ok := raw["data_dir"].(string); ok {
		setDefault(raw, filepath.Join(dir, "nats"), "nats", "embedded", "store_dir")
	}
}

// setDefault sets the value at the path keys below m to v unless it is
// present, creating absent (or null) intermediate mappings.
func setDefault(m map[string]any, v any, keys ...string) {
	for _, k := range keys[:len(keys)-1] {
		next, present := m[k]
		if !present || next == nil {
			next = map[string]any{}
			m[k] = next
		}
		sub, ok := next.(map[string]any)
		if !ok {
			return
		}
		m = sub
	}
	if cur, present := m[keys[len(keys)-1]]; !present || cur == nil {
		m[keys[len(keys)-1]] = v
	}
}

// refuseLocalKeys reports and removes from a config.kv entry's map m the
// keys it may not set: what is the machine's own (who it is, where its
// state lives, its NATS connection, its listeners and their secrets, where
// its telemetry goes) and, in a source's or sink's config, where it
// connects, with which credentials, and what it runs or writes on the
// machine, and any key of a sink of type plugin. Whoever can write the
// entry decides what every bridge publishes and where; with these it would
// also run programs on every machine (a plugin sink's command), or send a
// machine's credentials, merged from its file, to a host of its choosing
// (a new url or dsn, or TLS verification off). fileType gives a sink's
// type in the layers below the entry.
func (l *loader) refuseLocalKeys(name string, m map[string]any, fileType func(sink string) string) {
	localSections := [...]string{"name", "data_dir", "nats", "http", "serve", "telemetry"}
	localBlockKeys := [...]string{"dsn", "url", "urls", "context", "creds", "nkey_seed_file", "user", "password", "token", "tls",
		"spill_dir", "command", "args", "env", "sha256"}
	const why = "whoever can write that entry would %s on every bridge; set it in each machine's local file and leave it out of the entry"
	for _, sec := range localSections {
		if _, ok := m[sec]; ok {
			l.errs.add(sec, "%s sets %s, which is this machine's own: "+why, name, sec, "decide it")
			delete(m, sec)
		}
	}
	for _, kind := range []string{"sources", "sinks"} {
		blocks, _ := m[kind].(map[string]any)
		for _, b := range slices.Sorted(maps.Keys(blocks)) {
			block, _ := blocks[b].(map[string]any)
			if block == nil {
				continue
			}
			at := kind + "." + b
			if kind == "sinks" {
				typ, _ := block["type"].(string)
				if typ == "" {
					typ = fileType(b)
				}
				if typ == "plugin" {
					l.errs.add(at, "%s sets sink %q of type plugin, which runs a program: "+why, name, b, "run a program of its choosing")
					delete(blocks, b)
					continue
				}
			}
			cfg, _ := block["config"].(map[string]any)
			for _, key := range localBlockKeys {
				if _, ok := cfg[key]; ok {
					l.errs.add(at+".config."+key, "%s sets %s, where this machine connects, with what credentials, or what it runs or writes: "+why,
						name, key, "send this machine's credentials or data where it chooses")
					delete(cfg, key)
				}
			}
		}
	}
}
