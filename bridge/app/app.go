package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/bridge/retry"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/bridge/telemetry"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

// Defaults for a Config built in code, where zero values stand for them.
const (
	defaultSlotPoll         = 10 * time.Second
	defaultMaxCheckpointAge = time.Minute
)

// Option changes how an App is built.
type Option func(*App)

// WithSinks uses reg instead of sinks.Default.
func WithSinks(reg *sinks.Registry) Option { return func(a *App) { a.sinkReg = reg } }

// WithSources uses reg instead of sources.Default.
func WithSources(reg *sources.Registry) Option { return func(a *App) { a.srcReg = reg } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(a *App) { a.log = l } }

// WithTracerProvider makes the App trace with tp instead of building a
// provider from bridge.yaml's telemetry.tracing section and the OTEL_*
// variables. The App does not shut tp down. The trace context prefix still
// comes from telemetry.tracing.context_prefix.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(a *App) { a.tp = tp }
}

// ConfigOptions returns what config.Load needs to load a config for an App
// built with opts: the batch defaults of its sink types (sinks.Plugin.Batch,
// through config.WithBatchDefaults). Without them every sink gets the
// framework's batch defaults.
func ConfigOptions(opts ...Option) []config.Option {
	sinkReg, _ := Registries(opts...)
	return []config.Option{config.WithBatchDefaults(sinks.BatchDefaults(sinkReg))}
}

// Registries returns the plugin registries opts choose (sinks.Default and
// sources.Default otherwise), for what needs the plugins before a config
// is loaded, such as `bridge plugins`.
func Registries(opts ...Option) (*sinks.Registry, *sources.Registry) {
	a := &App{sinkReg: sinks.Default, srcReg: sources.Default, snapChecks: make(chan struct{}, 1)}
	for _, o := range opts {
		o(a)
	}
	return a.sinkReg, a.srcReg
}

// App is a configured bridge: one pipeline per source.
type App struct {
	cfg     *config.Config
	sinkReg *sinks.Registry
	srcReg  *sources.Registry
	log     *slog.Logger
	run     string
	// snapChecks lets one snapshot check at a time open its connection to
	// the source (checkSnapshot): a burst of requests on the control
	// plane waits in line instead of taking the database's connections.
	snapChecks chan struct{}

	embedded *natsembed.Server
	conn     natsconn.Conn // the nats section, resolved; set by startNATS
	nc       *nats.Conn
	ne       sinks.NATSEnv       // the NATS settings sinks get (Start)
	js       jetstream.JetStream // over nc (Start)
	store    *checkpoint.Store

	// The pipelines, one runner per source (runners.go), which reloads
	// add, rebuild and remove (reload.go); guarded by mu.
	mu      sync.Mutex
	runners map[string]*runner
	cur     *config.Config // the configuration in effect since the last reload; nil: cfg
	rev     string         // its revision (config.Revision)

	reloading sync.Mutex // one reload at a time
	cfgPath   string     // WithConfigFile: where Reload reads the config
	cfgOpts   []config.Option
	cfgFrom   string          // where cfg was read ("file bridge.yaml", "kv b/k revision 3")
	cfgHash   [32]byte        // of the file's bytes, to skip watch events that change nothing
	kvRev     uint64          // the config.kv revision cfg comes from
	runCtx    context.Context // Run's; reloads start runners under it
	fatal     func(error)     // stops Run with a runner's fatal error
	endRun    func()          // stops Run without an error
	ctl       *controlService // control.go
	fleet     *fleetState     // fleet.go: WithFleet
	started   time.Time

	// Telemetry.
	tp         trace.TracerProvider // WithTracerProvider, or built by Start when tracing is on
	tpShutdown func(context.Context) error
	ctxPrefix  string // trace context message prefix; "" when tracing is off
	metrics    *telemetry.Metrics
	httpSrv    *http.Server
	httpAddr   string
	bgCancel   context.CancelFunc
	bg         sync.WaitGroup
	snapCol    *snapshot.Collector
	dropAddr   func() // removes the embedded server's address from data_dir

	// The web console (console.go): its sample interval, and its sampler,
	// which Run starts.
	consoleEvery time.Duration
	consoleRun   func()
}

// New validates cfg against the registries and builds the App without any
// network I/O. Every problem is reported at once, each naming its YAML path.
func New(cfg *config.Config, opts ...Option) (*App, error) {
	a := &App{cfg: cfg, sinkReg: sinks.Default, srcReg: sources.Default, run: checkpoint.NewEpoch(), rev: cfg.Revision(), cfgFrom: "the configuration given",
		snapChecks: make(chan struct{}, 1)}
	for _, o := range opts {
		o(a)
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if err := a.check(cfg); err != nil {
		return nil, err
	}
	if err := a.checkFleet(cfg); err != nil {
		return nil, err
	}
	return a, nil
}

// check validates cfg against the registries, as New and Reload do,
// without network I/O: every problem at once, each naming its YAML path.
func (a *App) check(cfg *config.Config) error {
	var errs []error
	// Build one throwaway instance of everything to validate plugin blocks.
	names := sortedKeys(cfg.Sources)
	for _, n := range names {
		if _, err := a.newSourceFrom(cfg, n); err != nil {
			errs = append(errs, err)
		}
	}
	sinkIndex := map[string]int{}
	accepted := map[string]sinks.SubjectSet{} // routes must stay within these
	blind := map[string]bool{}                // sinks that file changes by key, not subject
	for i, n := range sortedKeys(cfg.Sinks) {
		sinkIndex[n] = i
		s, err := a.newSinkFrom(cfg, n, sinks.NATSEnv{})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sl, ok := s.(sinks.SubjectLimiter); ok {
			if set, ok := sl.AcceptedSubjects(); ok {
				accepted[n] = set
			}
		}
		if sb, ok := s.(sinks.SubjectBlind); ok && sb.SubjectBlind() {
			blind[n] = true
		}
		// Throwaway: a sink that started something (a plugin's process)
		// stops it again; one that did nothing has nothing to close.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Close(ctx)
		cancel()
	}
	if _, err := route.New(cfg, sinkIndex, ""); err != nil {
		errs = append(errs, err)
	} else if err := route.CheckSubjects(cfg, accepted); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkDeadLetterSinks(cfg, blind)...)
	if cfg.Config.KV != "" && cfg.NATS.RunsEmbedded() {
		errs = append(errs, &config.FieldError{Path: "config.kv", Msg: "needs nats.url: the shared configuration lives on a NATS server every bridge reaches, not on an embedded one"})
	}
	errs = append(errs, telemetry.Validate(cfg)...)
	errs = append(errs, serve.Validate(cfg)...) // serve.where, serve.auth, serve.tls
	errs = append(errs, validateHTTP(cfg)...)   // http.tls
	if n := cfg.NATS; n.URL != "" || n.Context != "" {
		errs = append(errs, natsconn.Check("nats", n.URL, n.NATSClient, time.Now())...) // nats.context, the files of nats.creds, nats.tls...
	}
	return errors.Join(errs...)
}

// checkDeadLetterSinks refuses a route with on_schema_change: dead_letter
// to a sink that files changes by key rather than subject (blind): the
// held table's changes would land in it as if accepted.
func checkDeadLetterSinks(cfg *config.Config, blind map[string]bool) []error {
	var errs []error
	for i, rc := range cfg.Routes {
		if rc.OnSchemaChange != "dead_letter" {
			continue
		}
		for _, n := range rc.Sinks {
			if !blind[n] {
				continue
			}
			errs = append(errs, &config.FieldError{Path: fmt.Sprintf("routes[%d].on_schema_change", i), Msg: fmt.Sprintf(
				"dead_letter sets a held table's changes aside on another subject, but sink %q (%s) files changes by their row's key, not their subject: it would take them as if accepted; use pause for this route, or give %q a route of its own with on_schema_change: pause",
				n, cfg.Sinks[n].Type, n)})
		}
	}
	return errs
}

func (a *App) newSource(name string) (sources.Source, error) { return a.newSourceFrom(a.cfg, name) }

func (a *App) newSourceFrom(cfg *config.Config, name string) (sources.Source, error) {
	sc := cfg.Sources[name]
	p, err := a.srcReg.Lookup(sc.Type)
	if err != nil {
		return nil, &config.FieldError{Path: "sources." + name + ".type", Msg: err.Error()}
	}
	path := "sources." + name + ".config"
	env := sources.Env{Name: name, Logger: a.log.With("source", name)}
	if a.ctxPrefix != "" {
		env.MessagePrefixes = []string{a.ctxPrefix}
	}
	env.MessagePrefixes = append(env.MessagePrefixes, sources.SnapshotPrefix) // snapshot watermarks
	env.MessagePrefixes = append(env.MessagePrefixes, cdc.DDLPrefix)          // DDL events (bridge setup ddl)
	return p.New(cfg.Decoder(path, sc.Config), env)
}

func (a *App) newSinkFrom(cfg *config.Config, name string, ne sinks.NATSEnv) (sinks.Sink, error) {
	sc := cfg.Sinks[name]
	p, err := a.sinkReg.Lookup(sc.Type)
	if err != nil {
		return nil, &config.FieldError{Path: "sinks." + name + ".type", Msg: err.Error()}
	}
	path := "sinks." + name + ".config"
	return p.New(cfg.Decoder(path, sc.Config), sinks.Env{Name: name, Logger: a.log.With("sink", name), NATS: ne})
}

// NATSURL returns the URL of the NATS server in use (embedded, configured,
// or nats.context's); valid after Start.
func (a *App) NATSURL() string {
	if a.embedded != nil {
		return a.embedded.URL()
	}
	if a.conn.URL != "" {
		return a.conn.URL
	}
	return a.cfg.NATS.URL
}

// Pipelines returns the pipelines, one per source, sorted by source name;
// valid after Start. A reload may replace them.
func (a *App) Pipelines() []*pipeline.Pipeline {
	var out []*pipeline.Pipeline
	for _, r := range a.runnerList() {
		out = append(out, r.p)
	}
	return out
}

// HTTPAddr returns the address the /metrics server listens on ("" when
// http.listen is empty); valid after Start.
func (a *App) HTTPAddr() string { return a.httpAddr }

// Gatherer returns the App's metrics registry (what /metrics serves); valid
// after Start.
func (a *App) Gatherer() prometheus.Gatherer {
	if a.metrics == nil {
		return prometheus.NewRegistry()
	}
	return a.metrics.Registry()
}

// Start starts the /metrics server, tracing and the embedded NATS server
// when needed, opens the checkpoint store and builds the pipelines. Call
// Close when it fails.
func (a *App) Start(ctx context.Context) error {
	a.metrics = telemetry.NewMetrics()
	if err := a.startHTTP(); err != nil {
		return err
	}
	if err := a.startTracing(ctx); err != nil {
		return err
	}
	ne, err := a.startNATS(false)
	if err != nil {
		return err
	}
	store, js, err := a.openCheckpoints(ctx, ne)
	if err != nil {
		return err
	}
	a.started = time.Now()
	if a.fleet != nil {
		a.js, a.store = js, store
		return a.startFleetMode(ctx, ne) // fleet.go: runners come with leases
	}
	return a.buildPipelines(ctx, js, store, ne, "")
}

// startNATS returns the NATS setting the App uses: nats.url, or the
// embedded server, which it starts here when nats.url is empty. A `bridge
// run` records the embedded server's address in data_dir for the helper
// commands. helper is true for a helper command (resync) that starts the
// embedded server only because no bridge runs, and says so.
//
// The embedded server listens on nats.embedded.host (127.0.0.1 unless
// set) and admits only clients that authenticate: with nats.user and
// password, or nats.token, those (config.Validate refuses a host beyond
// loopback without them); otherwise the user key in data_dir
// (natsembed.UserKey, made at the first start), which the App's own
// connections and sinks use, and the helper commands find
// (status.FindNATS).
func (a *App) startNATS(helper bool) (sinks.NATSEnv, error) {
	nc := a.cfg.NATS
	conn, err := natsconn.Resolve("nats", nc.URL, nc.NATSClient)
	if err != nil {
		return sinks.NATSEnv{}, err
	}
	ne := sinks.NATSEnv{URL: conn.URL, NATSClient: nc.NATSClient}
	if ne.URL != "" {
		conn.Warn(a.log)
		a.conn = conn
		return ne, nil
	}
	store := nc.Embedded.StoreDir
	if store == "" {
		store = filepath.Join(a.cfg.DataDir, "nats")
	}
	warn, err := natsembed.PrepareDataDir(a.cfg.DataDir)
	if err != nil {
		return ne, err
	}
	if warn != "" {
		a.log.Warn(warn)
	}
	so := natsembed.Options{Host: nc.Embedded.Host, Port: nc.Embedded.Port, StoreDir: store, SyncAlways: nc.Embedded.SyncAlways,
		User: nc.User, Password: nc.Password, Token: nc.Token}
	auth := "nats.user and password"
	if nc.User == "" && nc.Token != "" {
		auth = "nats.token"
	}
	if nc.User == "" && nc.Token == "" {
		key, pub, replaced, err := natsembed.UserKey(a.cfg.DataDir)
		if err != nil {
			return ne, fmt.Errorf("data_dir: %w", err)
		}
		if replaced != "" {
			a.log.Warn("replaced the embedded NATS server's key: clients holding the old one must read the new one", "key", key, "why", replaced)
		}
		so.UserNKey = pub
		conn.NKeySeedFile, ne.NKeySeedFile = key, key
		auth = "the key in " + key + " (nats --nkey " + key + ")"
	}
	srv, err := natsembed.Start(so)
	if err != nil {
		return ne, fmt.Errorf("starting embedded NATS (nats.embedded in bridge.yaml; store %s): %w", store, err)
	}
	a.embedded = srv
	ne.URL = srv.URL()
	conn.URL = ne.URL
	a.conn = conn
	reach := "this machine only (loopback; nats.embedded.host)"
	if host := srv.Options().Host; !config.IsLoopback(net.JoinHostPort(host, "0")) {
		reach = "other machines too (" + host + "; clients must authenticate with nats.user and password or nats.token)"
	}
	if helper {
		a.log.Info("started the embedded NATS server for this command: no bridge is running", "url", ne.URL, "store_dir", store, "reachable_from", reach, "clients_authenticate_with", auth)
		return ne, nil
	}
	if a.dropAddr, err = natsembed.WriteAddr(a.cfg.DataDir, srv); err != nil {
		return ne, fmt.Errorf("data_dir: %w", err)
	}
	a.log.Info("embedded NATS server started", "url", ne.URL, "store_dir", store, "reachable_from", reach, "clients_authenticate_with", auth)
	return ne, nil
}

// buildPipelines builds a runner per source (only source, when not "");
// Run starts them, with their slot pollers.
func (a *App) buildPipelines(ctx context.Context, js jetstream.JetStream, store *checkpoint.Store, ne sinks.NATSEnv, only string) error {
	a.js, a.store, a.ne = js, store, ne
	a.mu.Lock()
	if a.runners == nil {
		a.runners = map[string]*runner{}
	}
	a.mu.Unlock()
	for _, srcName := range sortedKeys(a.cfg.Sources) {
		if only != "" && srcName != only {
			continue
		}
		r, err := a.buildRunner(ctx, a.cfg, a.rev, srcName)
		if err != nil {
			return err
		}
		r.show(a)
		a.mu.Lock()
		a.runners[srcName] = r
		a.mu.Unlock()
	}
	return nil
}

// openCheckpoints connects to NATS and opens the checkpoint bucket. A
// failure that may go away (NATS not up yet, a leader election) is retried
// with retry.Backoff, each attempt logged with the next delay, while
// /readyz says "starting"; a permanent one (credentials, a configuration
// the server refuses) is returned at once with its fix.
func (a *App) openCheckpoints(ctx context.Context, ne sinks.NATSEnv) (*checkpoint.Store, jetstream.JetStream, error) {
	var bo retry.Backoff
	for {
		store, js, err := a.tryCheckpoints(ctx, ne)
		if err == nil {
			if bo.Attempt() > 0 {
				a.log.Info("NATS reached", "url", config.Redact(ne.URL), "attempts", bo.Attempt()+1)
			}
			return store, js, nil
		}
		if _, permanent := retry.Permanent(err); permanent || ctx.Err() != nil {
			return nil, nil, retry.Explain(err)
		}
		d := bo.Next(err)
		a.log.Warn("cannot open the checkpoint bucket yet; retrying", "err", err, "attempt", bo.Attempt(), "in", d.String())
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("stopped while waiting for NATS: %w", ctx.Err())
		case <-time.After(d):
		}
	}
}

// tryCheckpoints is one attempt of openCheckpoints.
func (a *App) tryCheckpoints(ctx context.Context, ne sinks.NATSEnv) (*checkpoint.Store, jetstream.JetStream, error) {
	if a.nc == nil {
		c := a.conn
		c.URL = ne.URL
		conn, err := natsconn.Connect(c, "bridge "+a.cfg.Name+" checkpoints", nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
			natsconn.Events(a.log), // the pings (natsconn.Conn.Options) declare a silent link dead; say so
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				a.log.Warn("NATS async error (checkpoints)", "error", err) // a refused permission, reported apart from its request
			}))
		if err != nil {
			return nil, nil, fmt.Errorf("NATS for the checkpoints: %w", err)
		}
		a.nc = conn
	}
	js, err := jetstream.New(a.nc)
	if err != nil {
		return nil, nil, fmt.Errorf("opening JetStream: %w", err)
	}
	store, err := checkpoint.Open(ctx, js, a.cfg.Checkpoint.Bucket, a.cfg.Checkpoint.Replicas)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint.bucket: %w", err)
	}
	store.SetLogger(a.log)
	return store, js, nil
}

// startTracing sets up the tracer provider unless WithTracerProvider gave
// one: from telemetry.tracing and the OTEL_* variables, or none.
func (a *App) startTracing(ctx context.Context) error {
	if a.tp == nil {
		plan, err := telemetry.PlanTracing(a.cfg.Telemetry.Tracing, os.Getenv)
		if err != nil {
			return fmt.Errorf("telemetry.tracing: %w", err)
		}
		if !plan.Enabled {
			a.log.Debug("tracing off", "why", plan.Why)
			return nil
		}
		tp, err := telemetry.NewTracerProvider(ctx, plan, a.cfg.Name)
		if err != nil {
			return fmt.Errorf("telemetry.tracing: %w", err)
		}
		a.tp, a.tpShutdown = tp, tp.Shutdown
		endpoint := config.Redact(plan.Endpoint)
		if endpoint == "" {
			endpoint = "from OTEL_EXPORTER_OTLP_* or the exporter's default"
		}
		a.log.Info("tracing on", "why", plan.Why, "protocol", plan.Protocol, "endpoint", endpoint)
	}
	a.ctxPrefix = a.cfg.Telemetry.Tracing.ContextPrefix
	return nil
}

// Run runs every pipeline until ctx ends (nil) or one stops with a fatal
// error, which stops the others and is returned. Meanwhile it serves the
// control plane on NATS (control.go) and reloads the configuration on
// request, on SIGHUP and when it changes (reload.go). Then it closes the
// sinks, the checkpoint connection and the embedded server, each bounded
// by the shutdown timeout.
func (a *App) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var errMu sync.Mutex
	var errs []error
	a.fatal = func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
		cancel()
	}
	a.endRun = cancel
	a.runCtx = ctx
	for _, r := range a.runnerList() {
		r.start(a, ctx, a.cfg, a.runnerEnded)
	}
	a.startControl(ctx) // control.go
	a.startConsole()    // console.go
	a.watchConfig(ctx)  // reload.go
	a.runFleet(ctx)     // fleet.go
	<-ctx.Done()
	a.reloading.Lock() // no reload starts runners from here on
	a.stopControl()
	for _, r := range a.runnerList() {
		<-r.done
	}
	a.reloading.Unlock()
	a.waitFleet() // its leases released
	a.Close()
	errMu.Lock()
	defer errMu.Unlock()
	return errors.Join(errs...)
}

// runnerEnded is told that r's pipeline returned: a fatal error of a
// runner still in use stops the App, and so does the clean end of the
// last one (snapshot.mode initial_only) outside a fleet.
func (a *App) runnerEnded(r *runner) {
	if r.removed.Load() {
		return
	}
	if r.err != nil {
		a.fatal(r.err)
		return
	}
	if a.fleet != nil || a.runCtx.Err() != nil {
		return
	}
	for _, o := range a.runnerList() {
		select {
		case <-o.done:
		default:
			return // another source still streams
		}
	}
	a.log.Info("every source's pipeline has ended; stopping")
	a.endRun()
}

// Close releases everything Start opened, each goodbye bounded.
func (a *App) Close() {
	d := a.cfg.Shutdown.Timeout
	if a.bgCancel != nil {
		a.bgCancel()
		a.bg.Wait()
		a.bgCancel = nil
	}
	a.stopControl()
	for _, r := range a.runnerList() {
		r.closeSinks(a)
	}
	if a.nc != nil {
		done := make(chan struct{})
		go func() { _ = a.nc.Drain(); close(done) }()
		select {
		case <-done:
		case <-time.After(d):
			a.nc.Close()
		}
		a.nc = nil
	}
	if a.dropAddr != nil {
		a.dropAddr()
		a.dropAddr = nil
	}
	if a.embedded != nil {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_ = a.embedded.Shutdown(ctx)
		cancel()
		a.embedded = nil
	}
	if a.tpShutdown != nil {
		// Exports the spans still buffered.
		ctx, cancel := context.WithTimeout(context.Background(), d)
		if err := a.tpShutdown(ctx); err != nil {
			a.log.Warn("flushing traces", "err", err)
		}
		cancel()
		a.tpShutdown, a.tp = nil, nil
	}
	if a.httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		if err := a.httpSrv.Shutdown(ctx); err != nil {
			_ = a.httpSrv.Close()
		}
		cancel()
		a.httpSrv = nil
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// newSnapshots returns the snapshot runtime of source name in cfg, or nil
// when the source cannot snapshot.
func (a *App) newSnapshots(ctx context.Context, cfg *config.Config, name string, log *slog.Logger) (*snapshot.Manager, error) {
	src, err := a.newSourceFrom(cfg, name)
	if err != nil {
		return nil, err
	}
	sn, ok := src.(sources.Snapshotter)
	if !ok {
		return nil, nil
	}
	kv, err := a.js.KeyValue(ctx, cfg.Checkpoint.Bucket)
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint bucket %q for snapshots: %w", cfg.Checkpoint.Bucket, err)
	}
	m := snapshot.New(cfg.Name, name, kv, sn.SnapshotOptions(), log.With("run", a.run)) // which process sent and counted each chunk
	if a.snapCol == nil {
		a.snapCol = &snapshot.Collector{}
		a.metrics.Registry().MustRegister(a.snapCol)
	}
	return m, nil
}
