package config

import (
	"cmp"
	"fmt"
	"net"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"
)

// nameRE is the syntax of the bridge name and of source and sink names.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Accepted values of the enumerated framework keys.
var (
	unroutedValues       = []string{"drop", "error"}
	onSchemaChangeValues = []string{"continue", "pause", "dead_letter"}
	debeziumKeyValues    = []string{"none", "header"}
	opValues             = []string{"insert", "update", "delete", "truncate", "message", "read", "control", "schema", "ddl"}
	logLevelValues       = []string{"debug", "info", "warn", "error"}
	logFormatValues      = []string{"auto", "text", "json"}
)

// kvKeyRE is the syntax of a JetStream KV key.
var kvKeyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

// headerRE is the syntax of an HTTP header name (RFC 9110 token).
var headerRE = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")

// maxReplicas is the most replicas a JetStream KV bucket can have.
const maxReplicas = 5

// sampleSubject holds the fields a route's subject template renders, with
// sample values; validation executes each template with it so that a
// misspelt field fails at load time rather than on the first change.
var sampleSubject = map[string]string{
	"Source": "source", "Schema": "public", "Table": "table", "Op": "insert", "Prefix": "prefix",
}

// rowRef finds the row values a subject template reads: {{.Col.x}},
// {{.Key.x}}, and the transform's {{.Out.x}}.
var rowRef = regexp.MustCompile(`\.(?:Col|Key|Out)\.([A-Za-z_][A-Za-z0-9_]*)`)

// Validate checks the framework part of c: names, required keys, enums,
// positive durations and sizes, route references, subject templates, table
// globs and the serve section. It does not check plugin types, formats,
// plugin `config:` blocks or serve.where's condition (the runtime and the
// plugins do); a zero Serve (a Config built in code for `bridge run`) is not
// checked. It returns every problem at once, as Errors (in the order of the
// file for a Config from Load, else by path), or nil. Load calls it; call it
// yourself on a Config built in code.
func (c *Config) Validate() error {
	errs := c.validate(nil)
	c.origin.blame(errs)
	c.origin.order(errs)
	return errs.err()
}

// validate returns the problems of c, leaving out any at a path that known
// already covers (see Errors.covers).
func (c *Config) validate(known Errors) Errors {
	var errs Errors
	add := func(p, format string, args ...any) {
		if !known.covers(p) {
			errs.add(p, format, args...)
		}
	}
	// A reference into a section that could not be decoded follows from
	// that problem: say so, and let it print after it.
	broken := func(section string) bool {
		return slices.ContainsFunc(known, func(e *FieldError) bool { return e.Path == section })
	}
	sinksBroken, sourcesBroken := broken("sinks"), broken("sources")
	addAfter := func(cause, p, format string, args ...any) {
		if !known.covers(p) {
			errs = append(errs, &FieldError{Path: p, Msg: fmt.Sprintf(format, args...), cause: cause})
		}
	}

	switch {
	case c.Name == "":
		add("name", "must be set")
	case !nameRE.MatchString(c.Name):
		add("name", "must match %s, got %q", nameRE, c.Name)
	}
	if c.Config.KV != "" {
		bucket, key, ok := c.Config.KVLocation()
		switch {
		case !ok || bucket == "" || key == "":
			add("config.kv", "must be \"bucket/key\", got %q", c.Config.KV)
		case !nameRE.MatchString(bucket):
			add("config.kv", "bucket %q must match %s", bucket, nameRE)
		case !kvKeyRE.MatchString(key):
			add("config.kv", "key %q must match %s (a JetStream KV key)", key, kvKeyRE)
		}
	}
	for i, name := range c.Config.KVEnv {
		if !isVarName(name) {
			add(indexPath("config.kv_env", i), "%q is not a variable name: a letter or _, then letters, digits and _ (the NAME of ${NAME})", name)
		}
	}
	checkPositive(add, "checkpoint.interval", c.Checkpoint.Interval)
	checkPositive(add, "shutdown.timeout", c.Shutdown.Timeout)
	if c.Checkpoint.ConfirmDelay < 0 {
		add("checkpoint.confirm_delay", "must be >= 0, got %s", c.Checkpoint.ConfirmDelay)
	}
	if d := c.Checkpoint.OwnerTimeout; d != 0 && d < time.Second {
		add("checkpoint.owner_timeout", "must be 0 (off) or at least 1s, got %s", d)
	}
	checkOneOf(add, "unrouted", c.Unrouted, unroutedValues)
	checkOneOf(add, "log.level", c.Log.Level, logLevelValues)
	checkOneOf(add, "log.format", c.Log.Format, logFormatValues)
	switch {
	case c.Checkpoint.Bucket == "":
		add("checkpoint.bucket", "must be set")
	case !nameRE.MatchString(c.Checkpoint.Bucket):
		add("checkpoint.bucket", "must match %s, got %q", nameRE, c.Checkpoint.Bucket)
	}
	if r := c.Checkpoint.Replicas; r < 1 || r > maxReplicas {
		add("checkpoint.replicas", "must be between 1 and %d, got %d", maxReplicas, r)
	}
	if c.Schemas.Enabled || c.Schemas.Bucket != "" {
		switch {
		case c.Schemas.Bucket == "":
			add("schemas.bucket", "must be set")
		case !nameRE.MatchString(c.Schemas.Bucket):
			add("schemas.bucket", "must match %s, got %q", nameRE, c.Schemas.Bucket)
		case c.Schemas.Bucket == c.Checkpoint.Bucket:
			add("schemas.bucket", "must differ from checkpoint.bucket (%q)", c.Checkpoint.Bucket)
		}
		if r := c.Schemas.Replicas; r < 1 || r > maxReplicas {
			add("schemas.replicas", "must be between 1 and %d, got %d", maxReplicas, r)
		}
	}
	c.NATS.validate(add)

	c.HTTP.validate(add)
	if !reflect.ValueOf(c.Serve).IsZero() { // a Config built in code without a serve section
		c.Serve.validate(add)
	}

	if len(c.Sources) == 0 {
		add("sources", "at least one source is required")
	}
	for _, name := range sortedKeys(c.Sources) {
		p := joinPath("sources", name)
		if !nameRE.MatchString(name) {
			add(p, "name must match %s", nameRE)
		}
		if c.Sources[name].Type == "" {
			add(p+".type", "must be set")
		}
	}
	for _, name := range sortedKeys(c.Sinks) {
		p, s := joinPath("sinks", name), c.Sinks[name]
		if !nameRE.MatchString(name) {
			add(p, "name must match %s", nameRE)
		}
		if s.Type == "" {
			add(p+".type", "must be set")
		}
		if s.Batch.MaxChanges <= 0 {
			add(p+".batch.max_changes", "must be > 0, got %d", s.Batch.MaxChanges)
		}
		checkPositive(add, p+".batch.max_wait", s.Batch.MaxWait)
		checkPositive(add, p+".retry.initial", s.Retry.Initial)
		checkPositive(add, p+".retry.max", s.Retry.Max)
		if s.Retry.Initial > 0 && s.Retry.Max > 0 && s.Retry.Initial > s.Retry.Max {
			add(p+".retry.initial", "must be <= retry.max (%s), got %s", s.Retry.Max, s.Retry.Initial)
		}
	}

	named := map[string]int{}
	for i, r := range c.Routes {
		p := indexPath("routes", i)
		if r.OnSchemaChange != "" {
			checkOneOf(add, p+".on_schema_change", r.OnSchemaChange, onSchemaChangeValues)
		}
		if r.DeadLetterSubject != "" && r.OnSchemaChange != "dead_letter" {
			add(p+".dead_letter_subject", "is used by on_schema_change: dead_letter only; set that, or drop dead_letter_subject")
		}
		if d := r.Debezium; d != (DebeziumFormat{}) {
			if r.Format != "debezium" {
				add(p+".debezium", "applies to format: debezium only, and the route's format is %q", cmp.Or(r.Format, "native"))
			}
			if d.Key != "" {
				checkOneOf(add, p+".debezium.key", d.Key, debeziumKeyValues)
			}
		}
		switch {
		case r.Name == "" && r.Continue:
			add(p+".name", "must be set with continue: true: the name tells this route's messages from the other routes' of the same change (e.g. name: %s)", suggestRouteName(r))
		case r.Name == "":
		case !nameRE.MatchString(r.Name):
			add(p+".name", "must match ^[A-Za-z0-9_-]+$, got %q", r.Name)
		default:
			if j, dup := named[r.Name]; dup {
				add(p+".name", "%q is also the name of routes[%d]; names must be unique", r.Name, j)
			} else {
				named[r.Name] = i
			}
		}
		if len(r.Sinks) == 0 {
			add(p+".sinks", "at least one sink is required")
		}
		for j, name := range r.Sinks {
			if _, ok := c.Sinks[name]; !ok && sinksBroken {
				addAfter("sinks", indexPath(p+".sinks", j), "no sink named %q: the sinks section could not be read (see above)", name)
			} else if !ok {
				add(indexPath(p+".sinks", j), "no sink named %q (defined: %s)", name, listOrNone(sortedKeys(c.Sinks)))
			}
		}
		for j, name := range r.Match.Sources {
			if _, ok := c.Sources[name]; !ok && sourcesBroken {
				addAfter("sources", indexPath(p+".match.sources", j), "no source named %q: the sources section could not be read (see above)", name)
			} else if !ok {
				add(indexPath(p+".match.sources", j), "no source named %q (defined: %s)", name, listOrNone(sortedKeys(c.Sources)))
			}
		}
		for j, glob := range r.Match.Tables {
			if msg := checkTableGlob(glob); msg != "" {
				add(indexPath(p+".match.tables", j), "%s", msg)
			}
		}
		for j, op := range r.Match.Ops {
			if !slices.Contains(opValues, op) {
				add(indexPath(p+".match.ops", j), "unknown op %q (known: %s)", op, strings.Join(opValues, ", "))
			}
		}
		if msg := checkSubject(r.Subject); msg != "" {
			add(p+".subject", "%s", msg)
		}
		validateShaping(add, p, r)
		validateWASM(add, p+".wasm_filter", r.WASMFilter)
		validateWASM(add, p+".wasm_transform", r.WASMTransform)
		if r.Transform != "" && r.WASMTransform.Set() {
			add(p+".wasm_transform", "set transform or wasm_transform, not both: each builds the whole body")
		}
	}
	if c.Serve.Route != "" {
		if i, ok := named[c.Serve.Route]; !ok {
			add("serve.route", "no route named %q (named routes: %s); set routes[].name on the route whose messages the feeds serve", c.Serve.Route, listOrNone(sortedKeys(named)))
		} else if f := c.Routes[i].Format; f != "" && f != "native" {
			add("serve.route", "route %q publishes the %s format, and the feeds read the native format; serve a route of format native (a second route with continue: true and a name of its own can publish the same changes natively into the same stream)", c.Serve.Route, f)
		}
	}
	return errs
}

// suggestRouteName proposes a name for r in an error message.
func suggestRouteName(r Route) string {
	if len(r.Sinks) > 0 && nameRE.MatchString(r.Sinks[0]) {
		return r.Sinks[0]
	}
	return "events"
}

// minHashKey is the shortest hash_key accepted, in bytes.
const minHashKey = 16

// validateShaping adds the problems of a route's columns and mask that
// need no catalog: one of include and exclude, a column under one mask,
// the hash key, positive truncations. The filter and transform compile
// in the route package, the columns are checked against each table
// there, and against the catalog by `bridge validate --connect`.
func validateShaping(add func(p, format string, args ...any), p string, r Route) {
	checkNames := func(lp string, names []string) {
		seen := map[string]bool{}
		for k, n := range names {
			switch {
			case n == "":
				add(indexPath(lp, k), "must be a column name, got an empty string")
			case seen[n]:
				add(indexPath(lp, k), "column %q is listed twice", n)
			}
			seen[n] = true
		}
	}
	checkTables := func(tp string, globs []string) {
		for k, glob := range globs {
			if msg := checkTableGlob(glob); msg != "" {
				add(indexPath(tp, k), "%s", msg)
			}
		}
	}
	for j, c := range r.Columns {
		cp := indexPath(p+".columns", j)
		checkTables(cp+".tables", c.Tables)
		switch {
		case len(c.Include) > 0 && len(c.Exclude) > 0:
			add(cp, "set include or exclude, not both")
		case len(c.Include) == 0 && len(c.Exclude) == 0:
			add(cp, "set include (the columns to publish, besides the key) or exclude (the columns to leave out)")
		}
		checkNames(cp+".include", c.Include)
		checkNames(cp+".exclude", c.Exclude)
	}
	for j, m := range r.Mask {
		mp := indexPath(p+".mask", j)
		checkTables(mp+".tables", m.Tables)
		if len(m.Redact)+len(m.Hash)+len(m.Truncate) == 0 {
			add(mp, "set redact, hash or truncate: the columns to mask")
		}
		checkNames(mp+".redact", m.Redact)
		checkNames(mp+".hash", m.Hash)
		for k, n := range m.Hash {
			if slices.Contains(m.Redact, n) {
				add(indexPath(mp+".hash", k), "column %q is under redact too: a column has one mask", n)
			}
		}
		for _, n := range sortedKeys(m.Truncate) {
			tp := joinPath(mp+".truncate", n)
			if slices.Contains(m.Redact, n) || slices.Contains(m.Hash, n) {
				add(tp, "column %q is under redact or hash too: a column has one mask", n)
			}
			if m.Truncate[n] <= 0 {
				add(tp, "must be > 0 (the characters kept), got %d", m.Truncate[n])
			}
		}
		switch {
		case len(m.Hash) > 0 && m.HashKey == "":
			add(mp+".hash_key", "must be set with hash: the secret key of the HMAC, at least %d bytes, e.g. ${MASK_HASH_KEY} holding the output of `openssl rand -hex 32`", minHashKey)
		case m.HashKey != "" && len(m.HashKey) < minHashKey:
			add(mp+".hash_key", "must be at least %d bytes, got %d: use a random key, e.g. the output of `openssl rand -hex 32`", minHashKey, len(m.HashKey))
		}
	}
}

// validateWASM adds the problems of a wasm_filter or wasm_transform block
// at p that need no file: the route package loads the module (the file,
// its sum, its exports).
func validateWASM(add func(p, format string, args ...any), p string, w WASM) {
	if !w.Set() {
		return
	}
	if w.Module == "" {
		add(p+".module", "must be set: the path of the .wasm file")
	}
	if !sha256RE.MatchString(w.SHA256) {
		if w.SHA256 == "" {
			m := w.Module
			if m == "" {
				m = "<module>"
			}
			add(p+".sha256", "must be set: the module's sum, from `sha256sum %s`, quoted", m)
		} else {
			add(p+".sha256", "must be 64 hex digits (the output of `sha256sum`), got %q", w.SHA256)
		}
	}
	if w.Function != "" && !exportRE.MatchString(w.Function) {
		add(p+".function", "must be the name of an export, got %q", w.Function)
	}
	if w.Timeout < 0 {
		add(p+".timeout", "must be > 0, got %s", w.Timeout)
	}
	if w.MaxMemoryMiB < 0 || w.MaxMemoryMiB > 4096 {
		add(p+".max_memory_mib", "must be between 1 and 4096 (MiB), got %d", w.MaxMemoryMiB)
	}
}

var (
	sha256RE = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	exportRE = regexp.MustCompile(`^[A-Za-z_$][A-Za-z0-9_$.]*$`)
)

// validate adds the problems of the serve section. serve.where is parsed
// by the bridge package, which knows the feeds condition syntax.
func (s *Serve) validate(add func(p, format string, args ...any)) {
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		add("serve.listen", "must be host:port such as 127.0.0.1:8090, or :8090 for every interface, got %q", s.Listen)
	}
	switch {
	case s.Stream == "":
		add("serve.stream", "must be set: the stream the nats_jetstream sink writes")
	case strings.ContainsAny(s.Stream, " \t\r\n.*>/\\") || len(s.Stream) > 255:
		add("serve.stream", "%q is not a valid stream name: no spaces, '.', '*', '>', '/' or '\\', at most 255 bytes", s.Stream)
	}
	for i, t := range s.Tables {
		schema, table, ok := strings.Cut(t, ".")
		if !ok || schema == "" || table == "" || strings.Contains(table, ".") || strings.ContainsAny(t, "*?[] ") {
			add(indexPath("serve.tables", i), "must be a schema.table name such as public.orders (globs are not supported), got %q", t)
		}
	}
	if s.MaxConns <= 0 {
		add("serve.max_conns", "must be > 0, got %d", s.MaxConns)
	}
	if s.MaxPerClient <= 0 {
		add("serve.max_per_client", "must be > 0, got %d", s.MaxPerClient)
	}
	if s.ClientHeader != "" && !headerRE.MatchString(s.ClientHeader) {
		add("serve.client_header", "must be an HTTP header name such as X-Client-Id, or empty for the remote IP, got %q", s.ClientHeader)
	}
	checkPositive(add, "serve.hold", s.Hold)
	checkPositive(add, "serve.keep_alive", s.KeepAlive)
	checkPositive(add, "serve.write_timeout", s.WriteTimeout)
	if s.MaxLag == 0 {
		add("serve.max_lag", "must be > 0, got 0")
	}
	if s.WindowTxns <= 0 {
		add("serve.window_txns", "must be > 0, got %d", s.WindowTxns)
	}
	if s.WindowBytes < 1<<20 {
		add("serve.window_bytes", "must be at least 1048576 (1 MiB), got %d", s.WindowBytes)
	}
	if s.MaxProjections <= 0 {
		add("serve.max_projections", "must be > 0, got %d", s.MaxProjections)
	}
	if s.MaxColumns <= 0 {
		add("serve.max_columns", "must be > 0, got %d", s.MaxColumns)
	}
	checkPositive(add, "serve.projection_idle", s.ProjectionIdle)
	if s.TokenSecret != "" && len(s.TokenSecret) < minHS256Secret {
		add("serve.token_secret", "must be at least %d bytes (256 bits), got %d; generate one with `openssl rand -base64 48`", minHS256Secret, len(s.TokenSecret))
	}
	if s.MaxHeaderBytes < minHeaderBytes {
		add("serve.max_header_bytes", "must be >= %d, got %d", minHeaderBytes, s.MaxHeaderBytes)
	}
	if s.MaxQueryBytes <= 0 {
		add("serve.max_query_bytes", "must be > 0, got %d", s.MaxQueryBytes)
	}
	if s.MaxFilterDepth <= 0 {
		add("serve.max_filter_depth", "must be > 0, got %d", s.MaxFilterDepth)
	}
	checkPositive(add, "serve.read_header_timeout", s.ReadHeaderTimeout)
	checkPositive(add, "serve.idle_timeout", s.IdleTimeout)
	checkServerTLS(add, "serve.tls", s.TLS)
	checkAllowedHosts(add, "serve.allowed_hosts", s.AllowedHosts)
	s.validateAuth(add)
}

// minHeaderBytes is the smallest serve.max_header_bytes: room for a
// request line, a bearer token and the usual headers.
const minHeaderBytes = 4096

func checkPositive(add func(p, format string, args ...any), p string, d time.Duration) {
	if d <= 0 {
		add(p, "must be > 0, got %s", d)
	}
}

func checkOneOf(add func(p, format string, args ...any), p, v string, allowed []string) {
	if !slices.Contains(allowed, v) {
		add(p, "must be one of %s, got %q", strings.Join(allowed, ", "), v)
	}
}

// checkTableGlob returns what is wrong with a "schema.table" glob, or "".
func checkTableGlob(glob string) string {
	if _, err := path.Match(glob, ""); err != nil {
		return fmt.Sprintf("invalid glob %q: %v", glob, err)
	}
	schema, table, ok := strings.Cut(glob, ".")
	if !ok || schema == "" || table == "" || strings.Contains(table, ".") {
		return fmt.Sprintf("must be a schema.table glob such as public.* or *.orders, got %q", glob)
	}
	return ""
}

// checkSubject returns what is wrong with a subject template, or "": it must
// parse, render with the documented fields, and render a publishable NATS
// subject (non-empty tokens, no spaces, no wildcards).
func checkSubject(subject string) string {
	if subject == "" {
		return "must be set"
	}
	tmpl, err := template.New("subject").Option("missingkey=error").Parse(subject)
	if err != nil {
		return err.Error()
	}
	// .Key.x and .Col.x read row values: give every column named a sample.
	data := map[string]any{}
	for k, v := range sampleSubject {
		data[k] = v
	}
	row := map[string]string{}
	for _, m := range rowRef.FindAllStringSubmatch(subject, -1) {
		row[m[1]] = "v"
	}
	data["Key"], data["Col"], data["Out"] = row, row, row
	var b strings.Builder
	if err := tmpl.Execute(&b, data); err != nil {
		return fmt.Sprintf("%v (fields: .Source .Schema .Table .Op .Prefix .Key.<column> .Col.<column> .Out.<key>)", err)
	}
	for _, tok := range strings.Split(b.String(), ".") {
		if tok == "" || strings.ContainsAny(tok, " \t\r\n*>") {
			return fmt.Sprintf("renders %q, which is not a valid NATS subject (dot-separated non-empty tokens, no spaces or wildcards)", b.String())
		}
	}
	return ""
}

// listOrNone joins names with commas, or returns "none".
func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
