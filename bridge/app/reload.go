package app

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/reload"
)

// Hot reconfiguration: Reload reads the configuration again and applies
// it, or refuses it whole, while the pipelines stream.

// WithConfigFile tells the App the file its configuration was loaded from
// (with LoadConfig or config.Load) and the options it was loaded with, so
// that Reload can read it again: on the reload endpoint, on SIGHUP, and,
// with config.watch, when the file or the config.kv entry changes. Without
// it the App cannot reload.
func WithConfigFile(path string, opts ...config.Option) Option {
	return func(a *App) { a.cfgPath, a.cfgOpts, a.cfgFrom = path, opts, "file "+path }
}

// LoadConfig loads the configuration at path with opts (config.Load), and,
// when it sets config.kv, the KV entry it names layered over the file
// (config.WithDocument), read through the file's nats section. It returns
// the Config, where it came from ("file bridge.yaml", "file bridge.yaml +
// kv bucket/key revision 7") and the entry's revision (0 without one).
// Errors are config.Load's (a partial Config with config.Errors), or the
// entry's (unreachable, missing) as config.Errors at config.kv.
func LoadConfig(ctx context.Context, path string, opts ...config.Option) (*config.Config, string, uint64, error) {
	cfg, err := config.Load(path, opts...)
	if cfg == nil || cfg.Config.KV == "" {
		return cfg, "file " + path, 0, err
	}
	// The file alone may well be incomplete (no sources): its problems
	// are judged with the entry layered over it.
	bucket, key, _ := cfg.Config.KVLocation()
	doc, rev, err := fetchConfig(ctx, cfg, bucket, key)
	if err != nil {
		return cfg, "", 0, config.Errors{&config.FieldError{Path: "config.kv", Msg: err.Error()}}
	}
	name := fmt.Sprintf("kv %s/%s revision %d", bucket, key, rev)
	cfg, err = config.Load(path, append(append([]config.Option{}, opts...), config.WithDocument(name, doc))...)
	return cfg, "file " + path + " + " + name, rev, err
}

// fetchConfig reads the config.kv entry through cfg's nats section.
func fetchConfig(ctx context.Context, cfg *config.Config, bucket, key string) ([]byte, uint64, error) {
	if cfg.NATS.RunsEmbedded() {
		return nil, 0, errors.New("needs nats.url (or nats.context): the shared configuration lives on a NATS server every bridge reaches, not on an embedded one")
	}
	conn, err := natsconn.Resolve("nats", cfg.NATS.URL, cfg.NATS.NATSClient)
	if err != nil {
		return nil, 0, err
	}
	nc, err := natsconn.Connect(conn, "bridge "+cfg.Name+" config", nats.Timeout(5*time.Second))
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s/%s: %w", bucket, key, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return readConfigEntry(ctx, js, bucket, key)
}

func readConfigEntry(ctx context.Context, js jetstream.JetStream, bucket, key string) ([]byte, uint64, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, 0, fmt.Errorf("bucket %q does not exist: create it and put the configuration in it (nats kv add %s; nats kv put %s %s \"$(cat shared.yaml)\")", bucket, bucket, bucket, key)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("opening bucket %q: %w", bucket, err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("bucket %q has no key %q (or it was deleted): put the configuration there (nats kv put %s %s \"$(cat shared.yaml)\")", bucket, key, bucket, key)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading key %q of bucket %q: %w", key, bucket, err)
	}
	return e.Value(), e.Revision(), nil
}

// ReloadResult says what a Reload did.
type ReloadResult struct {
	// Revision is the configuration revision in effect after the reload,
	// Previous the one before; equal when nothing changed.
	Revision, Previous string
	// Changes are what the reload did, one line each.
	Changes []string
}

// errCannotReload marks a reload that cannot be done at all (the App has
// no file to read, a key that needs a restart changed, the App stops).
var errCannotReload = errors.New("reload refused")

// restartOnly are the sections a reload cannot change: what the process
// set up once (the NATS connection and the embedded server, the HTTP
// listener, tracing, logging, the checkpoint bucket, the source of the
// configuration).
func restartOnly(old, cur *config.Config) []string {
	var out []string
	same := func(key string, a, b any) {
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			out = append(out, key)
		}
	}
	same("name", old.Name, cur.Name)
	same("data_dir", old.DataDir, cur.DataDir)
	same("nats", old.NATS, cur.NATS)
	same("checkpoint.bucket", old.Checkpoint.Bucket, cur.Checkpoint.Bucket)
	same("checkpoint.replicas", old.Checkpoint.Replicas, cur.Checkpoint.Replicas)
	same("http", old.HTTP, cur.HTTP)
	same("telemetry.tracing", old.Telemetry.Tracing, cur.Telemetry.Tracing)
	same("log", old.Log, cur.Log)
	same("config", old.Config, cur.Config)
	return out
}

// Reload reads the configuration again (WithConfigFile) and applies it
// while the pipelines stream, or refuses it whole and changes nothing:
//
//   - a configuration with problems is refused with all of them
//     (config.Errors, each at its YAML path), as `bridge validate` reports;
//   - one changing a key only a restart applies (name, data_dir, nats,
//     checkpoint.bucket and replicas, http, telemetry.tracing, log,
//     config) is refused, naming the keys;
//   - otherwise a source whose source block, sinks (those its routes
//     reach, and their blocks), checkpoint, shutdown or slot poll keys
//     changed is drained at a transaction boundary and rebuilt; a removed
//     source is drained and stopped (its slot and checkpoint stay); an
//     added one starts; every other source takes the new routes from its
//     next transaction.
//
// The new revision is recorded with each checkpoint from then on. One
// reload runs at a time; ctx bounds the drains.
func (a *App) Reload(ctx context.Context) (ReloadResult, error) {
	a.reloading.Lock()
	defer a.reloading.Unlock()
	a.mu.Lock()
	prev := a.rev
	a.mu.Unlock()
	res := ReloadResult{Revision: prev, Previous: prev}
	if a.cfgPath == "" {
		return res, fmt.Errorf("%w: the bridge was not started from a file it can read again", errCannotReload)
	}
	if a.runCtx == nil || a.runCtx.Err() != nil {
		return res, fmt.Errorf("%w: the bridge is not running", errCannotReload)
	}
	raw, _ := os.ReadFile(a.cfgPath)
	cfg, from, kvRev, err := LoadConfig(ctx, a.cfgPath, a.cfgOpts...)
	if err != nil {
		var ferrs config.Errors
		if cfg != nil && errors.As(err, &ferrs) {
			err = cfg.Problems(err, a.check(cfg))
		}
		return res, err
	}
	if err := a.check(cfg); err != nil {
		return res, cfg.Problems(err)
	}
	if keys := restartOnly(a.cfg, cfg); len(keys) > 0 {
		return res, fmt.Errorf("%w: %s changed, and only a restart applies %s; nothing was applied (restart the bridge, or change %s back)",
			errCannotReload, strings.Join(keys, ", "), pronoun(keys), pronoun(keys))
	}
	rev := cfg.Revision()
	a.mu.Lock()
	a.cfgFrom, a.kvRev, a.cfgHash = from, kvRev, sha256.Sum256(raw)
	a.mu.Unlock()
	if rev == prev {
		return res, nil
	}

	// Build everything new first: a failure changes nothing.
	type plan struct {
		old, new *runner
	}
	var plans []plan
	var swaps []*runner
	fail := func(err error) (ReloadResult, error) {
		for _, pl := range plans {
			if pl.new != nil {
				pl.new.closeSinks(a)
			}
		}
		return res, err
	}
	a.mu.Lock()
	running := make(map[string]*runner, len(a.runners))
	for k, v := range a.runners {
		running[k] = v
	}
	a.mu.Unlock()
	for _, src := range sortedKeys(running) {
		if _, ok := cfg.Sources[src]; !ok {
			plans = append(plans, plan{old: running[src]})
		}
	}
	for _, src := range sortedKeys(cfg.Sources) {
		r, ok := running[src]
		if !ok && a.fleet != nil {
			continue // in a fleet, a new source starts where its lease is taken
		}
		if ok && r.built == fingerprint(cfg, src) {
			swaps = append(swaps, r)
			continue
		}
		nr, err := a.buildRunner(ctx, cfg, rev, src)
		if err != nil {
			return fail(fmt.Errorf("building source %q: %w", src, err))
		}
		plans = append(plans, plan{old: r, new: nr})
	}
	swapTo := map[string]*route.Router{}
	for _, r := range swaps {
		router, _, err := routerFor(cfg, r.source, a.ctxPrefix, a.log)
		if err != nil {
			return fail(err)
		}
		swapTo[r.source] = router
	}

	// Apply: swap routers, drain what goes or is rebuilt, start what comes.
	for _, r := range swaps {
		r.p.SetRouter(swapTo[r.source], rev)
	}
	if len(swaps) > 0 {
		res.Changes = append(res.Changes, fmt.Sprintf("routes of revision %s apply from the next transaction of %s", rev, sourceList(swaps)))
	}
	for _, pl := range plans {
		switch {
		case pl.new == nil:
			pl.old.stop(ctx, a)
			a.mu.Lock()
			delete(a.runners, pl.old.source)
			a.mu.Unlock()
			res.Changes = append(res.Changes, fmt.Sprintf("source %s removed: drained at checkpoint %s; its replication slot and checkpoint are kept (drop the slot when the source is gone for good: Postgres keeps its WAL)",
				pl.old.source, pl.old.p.Checkpointed()))
		case pl.old != nil:
			pl.old.stop(ctx, a)
			res.Changes = append(res.Changes, fmt.Sprintf("source %s restarted with its new configuration from checkpoint %s", pl.new.source, pl.old.p.Checkpointed()))
		default:
			res.Changes = append(res.Changes, fmt.Sprintf("source %s added", pl.new.source))
		}
		if pl.new != nil {
			pl.new.show(a)
			a.mu.Lock()
			a.runners[pl.new.source] = pl.new
			a.mu.Unlock()
			pl.new.start(a, a.runCtx, cfg, a.runnerEnded)
		}
	}
	a.mu.Lock()
	a.cur, a.rev = cfg, rev
	a.mu.Unlock()
	res.Revision = rev
	return res, nil
}

func sourceList(rs []*runner) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.source
	}
	if len(names) == 1 {
		return "source " + names[0]
	}
	return "sources " + strings.Join(names, ", ")
}

func pronoun(keys []string) string {
	if len(keys) == 1 {
		return "it"
	}
	return "them"
}

// current returns the configuration in effect; a.mu held.
func (a *App) current() *config.Config {
	if a.cur != nil {
		return a.cur
	}
	return a.cfg
}

// reloadLogged reloads for why and logs the outcome.
func (a *App) reloadLogged(ctx context.Context, why string) {
	res, err := a.Reload(ctx)
	switch {
	case err != nil:
		a.log.Error("configuration refused; the running configuration goes on", "why", why, "revision", res.Previous, "problems", errorLines(err))
	case res.Revision == res.Previous:
		a.log.Info("configuration reloaded: nothing changed", "why", why, "revision", res.Revision)
	default:
		a.log.Info("configuration reloaded", "why", why, "revision", res.Revision, "previous", res.Previous, "changes", res.Changes)
	}
}

// errorLines returns the lines of err's text, without blank ones.
func errorLines(err error) []string {
	var out []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// watchConfig starts what reloads the configuration while Run runs:
// SIGHUP always, and with config.watch the file and the config.kv entry.
func (a *App) watchConfig(ctx context.Context) {
	if a.cfgPath == "" {
		return
	}
	hup := reload.OnSIGHUP(ctx) // beside the TLS listeners' own: each subscriber gets every SIGHUP
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.reloadLogged(ctx, "SIGHUP")
			}
		}
	}()
	if !a.cfg.Config.Watch {
		return
	}
	if raw, err := os.ReadFile(a.cfgPath); err == nil {
		a.mu.Lock()
		if a.cfgHash == ([32]byte{}) {
			a.cfgHash = sha256.Sum256(raw)
		}
		a.mu.Unlock()
	}
	err := reload.Watch(ctx, a.log, []string{a.cfgPath}, nil, func() {
		raw, err := os.ReadFile(a.cfgPath)
		if err != nil {
			return // being replaced; the next event reads it
		}
		a.mu.Lock()
		same := a.cfgHash == sha256.Sum256(raw)
		a.mu.Unlock()
		if !same {
			a.reloadLogged(ctx, "the file changed")
		}
	})
	if err != nil {
		a.log.Warn("cannot watch the configuration file; SIGHUP and the reload endpoint still reload it", "file", a.cfgPath, "err", err)
	}
	if bucket, key, ok := a.cfg.Config.KVLocation(); ok && a.js != nil {
		go a.watchConfigKV(ctx, bucket, key)
	}
}

// watchConfigKV reloads when the config.kv entry gets a revision other
// than the one in effect, until ctx ends; a watch that fails is restarted.
func (a *App) watchConfigKV(ctx context.Context, bucket, key string) {
	for ctx.Err() == nil {
		kv, err := a.js.KeyValue(ctx, bucket)
		var w jetstream.KeyWatcher
		if err == nil {
			w, err = kv.Watch(ctx, key)
		}
		if err != nil {
			a.log.Warn("cannot watch config.kv; retrying", "bucket", bucket, "key", key, "err", err)
		} else {
			for e := range w.Updates() {
				if e == nil {
					continue
				}
				a.mu.Lock()
				seen := e.Revision() == a.kvRev
				a.mu.Unlock()
				if !seen {
					a.reloadLogged(ctx, fmt.Sprintf("config.kv %s/%s revision %d", bucket, key, e.Revision()))
				}
			}
			_ = w.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
