package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/bridge/telemetry"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/buildinfo"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

// A runner is one source's pipeline with what it owns: its sink
// connections, its telemetry, its snapshot runtime and its slot poller.
// Runners come and go with reloads (reload.go).
type runner struct {
	source string
	typ    string
	p      *pipeline.Pipeline
	sinks  []sinks.Sink
	pipe   *telemetry.Pipe
	snap   *snapshot.Manager
	gauge  *pgslot.Gauge
	// sinkNames are the sinks its routes reach; streams the JetStream
	// streams among them ("sink: stream"), for status.
	sinkNames, streams []string
	// built is the fingerprint of the configuration it was built from
	// (fingerprint): a reload rebuilds the runner when it changes, and
	// only swaps its router otherwise.
	built string

	cancel  context.CancelFunc // stops the pipeline and the poller at once
	done    chan struct{}      // closed when the pipeline and the poller ended
	err     error              // the pipeline's error, valid after done
	removed atomic.Bool        // stopped on purpose: its error stops nothing else
}

// routerFor compiles cfg's routes as source's pipeline sees them: only the
// sinks they can send its changes to (config.RouteSinks), which the
// pipeline connects to. The routes of other sources keep their place (the
// YAML paths in errors stay right) without sinks.
func routerFor(cfg *config.Config, source, ctxPrefix string, log *slog.Logger) (*route.Router, []string, error) {
	used := cfg.RouteSinks(source)
	idx := make(map[string]int, len(used))
	for i, n := range used {
		idx[n] = i
	}
	view := *cfg
	view.Routes = make([]config.Route, len(cfg.Routes))
	for i, r := range cfg.Routes {
		if len(r.Match.Sources) > 0 && !slices.Contains(r.Match.Sources, source) {
			r.Sinks = nil
		}
		view.Routes[i] = r
	}
	opts := []route.Option{route.WithLogger(log.With("source", source))}
	if cfg.DataDir != "" {
		opts = append(opts, route.WithWASMCache(filepath.Join(cfg.DataDir, "wasm"))) // a restart does not compile modules again
	}
	r, err := route.New(&view, idx, ctxPrefix, opts...)
	return r, used, err
}

// fingerprint identifies what source's runner is built from, besides its
// routes: the source, the sinks it writes to, and the keys every pipeline
// reads. Equal fingerprints: a reload only swaps the router.
func fingerprint(cfg *config.Config, source string) string {
	used := cfg.RouteSinks(source)
	sk := make(map[string]config.Sink, len(used))
	for _, n := range used {
		sk[n] = cfg.Sinks[n]
	}
	b, _ := json.Marshal(struct {
		Source     config.Plugin
		Sinks      map[string]config.Sink
		Checkpoint config.Checkpoint
		Schemas    config.Schemas
		Shutdown   config.Shutdown
		Metrics    config.Metrics
	}{cfg.Sources[source], sk, cfg.Checkpoint, cfg.Schemas, cfg.Shutdown, cfg.Telemetry.Metrics})
	return string(b)
}

// buildRunner builds source's runner from cfg (rev its revision) without
// starting it: new sink instances, its router, its snapshot runtime and
// observer. It needs Start's NATS connection and checkpoint store.
func (a *App) buildRunner(ctx context.Context, cfg *config.Config, rev, srcName string) (*runner, error) {
	log := a.log.With("source", srcName)
	router, used, err := routerFor(cfg, srcName, a.ctxPrefix, a.log)
	if err != nil {
		return nil, err
	}
	r := &runner{source: srcName, typ: cfg.Sources[srcName].Type, built: fingerprint(cfg, srcName), done: make(chan struct{}),
		sinkNames: append([]string{}, used...), streams: []string{}}
	var ps []pipeline.Sink
	for _, sn := range used {
		if stream, _ := cfg.Sinks[sn].Config["stream"].(string); stream != "" && cfg.Sinks[sn].Type == "nats_jetstream" {
			r.streams = append(r.streams, sn+": "+stream)
		}
		s, err := a.newSinkFrom(cfg, sn, a.ne)
		if err != nil {
			r.closeSinks(a)
			return nil, err
		}
		r.sinks = append(r.sinks, s)
		ps = append(ps, pipeline.Sink{Name: sn, Sink: s, Batch: cfg.Sinks[sn].Batch})
	}
	snap, err := a.newSnapshots(ctx, cfg, srcName, log)
	if err != nil {
		r.closeSinks(a)
		return nil, err
	}
	r.snap = snap
	if _, polled := pgslot.SourceOf(srcName, cfg.Sources[srcName]); polled {
		r.gauge = &pgslot.Gauge{}
	}
	var tracer trace.Tracer
	if a.tp != nil {
		tracer = a.tp.Tracer(telemetry.Instrumentation, trace.WithInstrumentationVersion(buildinfo.String()))
	}
	var reg *schema.Registry
	if cfg.Schemas.Enabled {
		if reg, err = schema.Open(ctx, a.js, cfg.Schemas.Bucket, cfg.Schemas.Replicas); err != nil {
			r.closeSinks(a)
			return nil, fmt.Errorf("schemas.bucket: %w", err)
		}
	}
	r.pipe = a.metrics.NewPipe(srcName, used, tracer, a.ctxPrefix, r.gauge, log)
	r.p = pipeline.New(pipeline.Config{
		Bridge: cfg.Name, Source: srcName,
		NewSource: func() (sources.Source, error) { return a.newSourceFrom(cfg, srcName) },
		Sinks:     ps, Router: router, ConfigRev: rev, Store: a.store,
		Interval: cfg.Checkpoint.Interval, ConfirmDelay: cfg.Checkpoint.ConfirmDelay, Shutdown: cfg.Shutdown.Timeout,
		Run: a.run, Snapshots: snap, Schemas: reg, Slot: r.gauge, Observer: r.pipe, Log: log,
		Lease: a.lease(srcName), OwnerTimeout: cfg.Checkpoint.OwnerTimeout,
	})
	return r, nil
}

// show makes r visible to /metrics and /readyz.
func (r *runner) show(a *App) {
	a.metrics.Add(r.pipe, r.p)
	if r.snap != nil {
		a.snapCol.Add(r.snap)
	}
}

// hide removes r from /metrics and /readyz.
func (r *runner) hide(a *App) {
	a.metrics.Remove(r.pipe)
	if r.snap != nil {
		a.snapCol.Remove(r.snap)
	}
}

// start runs r's pipeline, and its slot poller when it has one, under
// parent; ended is told when the pipeline returns.
func (r *runner) start(a *App, parent context.Context, cfg *config.Config, ended func(*runner)) {
	ctx, cancel := context.WithCancel(parent)
	r.cancel = cancel
	var wg sync.WaitGroup
	if r.gauge != nil {
		pgsrc, _ := pgslot.SourceOf(r.source, cfg.Sources[r.source])
		every := cfg.Telemetry.Metrics.SlotPollInterval
		if every <= 0 {
			every = defaultSlotPoll
		}
		name, log := r.source, a.log.With("source", r.source)
		wg.Add(1)
		go func() {
			defer wg.Done()
			pgslot.Poll(ctx, r.gauge, name, pgsrc, every, log, func() { a.metrics.SlotPollFailed(name) })
		}()
	}
	go func() {
		r.err = r.p.Run(ctx)
		cancel() // the poller too
		wg.Wait()
		close(r.done)
		ended(r)
	}()
}

// stop drains r at a transaction boundary within ctx, else stops it at
// once, and closes its sinks. Its checkpoint is where the next owner of
// the source starts.
func (r *runner) stop(ctx context.Context, a *App) {
	r.removed.Store(true)
	if err := r.p.Drain(ctx); err != nil {
		a.log.Warn("draining took too long; stopping the pipeline now (the next run resumes from its checkpoint)", "source", r.source, "err", err)
	}
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
	r.hide(a)
	r.closeSinks(a)
}

func (r *runner) closeSinks(a *App) {
	d := a.cfg.Shutdown.Timeout
	for _, s := range r.sinks {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_ = s.Close(ctx)
		cancel()
	}
	r.sinks = nil
}

// runnerList returns the runners sorted by source.
func (a *App) runnerList() []*runner {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*runner, 0, len(a.runners))
	for _, n := range sortedKeys(a.runners) {
		out = append(out, a.runners[n])
	}
	return out
}

// runnerOf returns source's runner, or an error naming the sources.
func (a *App) runnerOf(source string) (*runner, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.runners[source]
	if !ok {
		return nil, fmt.Errorf("no source named %q in the running configuration (sources: %v)", source, sortedKeys(a.runners))
	}
	return r, nil
}
