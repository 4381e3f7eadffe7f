package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/buildinfo"
)

// Main runs the bridge command line and exits with its status: 0 on
// success, 1 on errors (including every validation error), 2 on usage errors.
// A custom binary calls it from main after blank-importing its plugins.
// It first tunes the Go runtime's memory settings (TuneRuntime).
func Main(opts ...app.Option) {
	TuneRuntime()
	os.Exit(Execute(os.Args[1:], os.Stdout, os.Stderr, opts...))
}

// Execute runs the command line with args and returns the exit status: 0
// on success, 1 on failures, 2 on usage errors. Every error is printed
// once, to stderr: a command prints what it reports itself (a
// configuration's problem list, the log of `bridge run`); Execute prints
// the others as one "bridge: ..." line with the fix, or with where to read
// the usage.
func Execute(args []string, stdout, stderr io.Writer, opts ...app.Option) int {
	root := NewCommand(stdout, stderr, opts...)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	printError(stderr, cmd, err)
	if isUsage(err) {
		return 2
	}
	return 1
}

// NewCommand builds the cobra command tree.
func NewCommand(stdout, stderr io.Writer, opts ...app.Option) *cobra.Command {
	var cfgPath, logLevel string
	root := &cobra.Command{
		Use:           "bridge",
		Short:         "Stream committed PostgreSQL changes into NATS, exactly once, in commit order",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	// An unknown command is a usage error; "bridge" alone prints the help.
	root.SuggestionsMinimumDistance = 2
	root.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		return unknownCommand(cmd, args[0])
	}
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	root.PersistentFlags().StringVarP(&cfgPath, "config", "c", "bridge.yaml", "path to bridge.yaml")
	root.PersistentFlags().StringVar(&logLevel, "log-level", "", "override log.level (debug, info, warn, error)")

	// loadWith reads bridge.yaml with co layered over it and builds the App;
	// on failure the error lists every problem found, framework, plugin and
	// route alike. load is loadWith without extra config options.
	loadOpts := func(co []config.Option) []config.Option {
		lo := app.ConfigOptions(opts...)
		if logLevel != "" {
			lo = append(lo, config.WithOverrides(map[string]any{"log.level": logLevel}))
		}
		return append(lo, co...)
	}
	loadWith := func(co []config.Option, extra ...app.Option) (*config.Config, *app.App, error) {
		// With config.kv, the shared entry is layered over the file.
		cfg, _, _, err := app.LoadConfig(context.Background(), cfgPath, loadOpts(co)...)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, missingConfig{path: cfgPath, err: err}
		}
		var ferrs config.Errors
		if err != nil && (cfg == nil || !errors.As(err, &ferrs)) {
			return nil, nil, err
		}
		a, aerr := app.New(cfg, append(append([]app.Option{}, opts...), extra...)...)
		if err == nil && aerr == nil {
			return cfg, a, nil
		}
		return nil, nil, mergeErrs(cfg, err, aerr)
	}
	load := func(extra ...app.Option) (*config.Config, *app.App, error) { return loadWith(nil, extra...) }
	printErrs := func(err error) error {
		if errors.As(err, new(missingConfig)) {
			return err // one line, printed by Execute
		}
		fmt.Fprintf(stderr, "%s: invalid configuration:\n", cfgPath)
		for _, line := range errorLines(err) {
			fmt.Fprintf(stderr, "  %s\n", line)
		}
		return reported{err}
	}

	var fleetName string
	var fleetLease time.Duration
	run := &cobra.Command{
		Use:   "run",
		Short: "Stream changes until SIGTERM or SIGINT",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := load()
			if err != nil {
				return printErrs(err)
			}
			log := NewLogger(cfg.Log, stderr)
			if ignored := cfg.IgnoredEnv(); len(ignored) > 0 {
				log.Debug("ignored environment variables that name no key of bridge.yaml", "variables", ignored)
			}
			if n, cpus := TuneProcs(cfg.NATS.RunsEmbedded()); n > 0 { // runtime.go
				log.Info("running goroutines on one CPU at a time: the process may use at most 2, which on such a machine it shares with Postgres or nats-server; set GOMAXPROCS to choose",
					"gomaxprocs", n, "cpus", cpus)
			}
			// WithConfigFile: the reload endpoint, SIGHUP and config.watch
			// read it again.
			_, a, err := load(app.WithLogger(log), app.WithConfigFile(cfgPath, loadOpts(nil)...), app.WithFleet(fleetName, fleetLease))
			if err != nil {
				return printErrs(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			// Exporter failures go to our log, redacted, not to stderr.
			otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
				log.Warn("telemetry", "err", config.Redact(err.Error()))
			}))
			if err := a.Start(ctx); err != nil {
				a.Close()
				if ctx.Err() != nil {
					log.Info("stopped before the bridge was running", "why", context.Cause(ctx))
					return nil
				}
				log.Error("start failed", "err", err)
				return reported{err} // logged
			}
			log.Info("bridge running", "name", cfg.Name, "version", buildinfo.String(), "nats", config.Redact(a.NATSURL()))
			err = a.Run(ctx)
			if err != nil {
				log.Error("bridge stopped", "err", err)
				return reported{err} // logged
			}
			log.Info("bridge stopped")
			return nil
		},
	}
	run.Flags().StringVar(&fleetName, "fleet", "", "share the configuration's sources with the other processes run with this fleet name (docs/fleet.md)")
	run.Flags().DurationVar(&fleetLease, "fleet-lease", 0, "with --fleet: how long a source's lease lasts unrenewed (default 5s): the other members take a dead member's sources over once its leases are 3/4 of it old")
	validate := newValidateCommand(load, printErrs, stdout, &cfgPath, opts) // validate.go: --connect checks the servers
	plugins := &cobra.Command{
		Use:   "plugins",
		Short: "List the compiled-in sources and sinks with their config keys, and the configured plugin executables and WebAssembly modules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sinkReg, srcReg := app.Registries(opts...)
			fmt.Fprintln(stdout, "sources:")
			for _, t := range srcReg.Types() {
				p, _ := srcReg.Lookup(t)
				printPlugin(stdout, t, p.Doc, p.Config)
			}
			fmt.Fprintln(stdout, "sinks:")
			for _, t := range sinkReg.Types() {
				p, _ := sinkReg.Lookup(t)
				printPlugin(stdout, t, p.Doc, p.Config)
				// The framework's batch keys, where the type has defaults of its own.
				if p.Batch.MaxChanges > 0 {
					fmt.Fprintf(stdout, "      (framework) batch.max_changes (int, default %d)\n", p.Batch.MaxChanges)
				}
				if p.Batch.MaxWait > 0 {
					fmt.Fprintf(stdout, "      (framework) batch.max_wait (duration, default %s)\n", p.Batch.MaxWait)
				}
			}
			fmt.Fprintf(stdout, "formats: %s\n", strings.Join(format.Names(), ", "))
			return printConfiguredPlugins(stdout, cfgPath, opts) // plugin.go
		},
	}
	ver := &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(stdout, "bridge %s\n", buildinfo.String())
		},
	}
	var output string
	var statusTimeout time.Duration
	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "Show each source's state, slot, checkpoint, streams and lag; works while the bridge is down",
		Long: `Show, for each source: its replication slot (exists, active, confirmed flush,
retained WAL, wal_status), its checkpoint (LSN, epoch, age) from the KV bucket,
the JetStream streams its routes reach (messages, last sequence), and the lag in
bytes between the server's WAL end and the checkpoint. The running instances of
the bridge answer on its control endpoint (bridge.<name>.status) with each
source's state (streaming, paused, standby, retrying...), last error and
configuration revision; when none answers, the state is unknown and the output
says so ("via"). Exits 1 when a query failed. With nats.url empty it connects
to the embedded server of the running bridge.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return usageError{fmt.Errorf("--output must be text or json, got %q", output)}
			}
			cfg, _, err := load()
			if err != nil {
				return printErrs(err)
			}
			rep := status.Query(cmd.Context(), cfg)
			replies, cerr := askStatus(cmd.Context(), cfg, statusTimeout) // control.go
			rep.Merge(control.Subject(cfg.Name, control.ActionStatus), replies, cerr)
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				status.Print(stdout, rep)
			}
			if !rep.OK {
				return errors.New("some queries failed")
			}
			return nil
		},
	}
	statusCmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json (stable field names)")
	statusCmd.Flags().DurationVar(&statusTimeout, "timeout", 5*time.Second, "how long to wait for the bridge's instances to answer")
	var resyncSource, resyncReason string
	var resyncWait time.Duration
	var resyncDirect bool
	resync := &cobra.Command{
		Use:   "resync",
		Short: "Start a new epoch and publish a resync message, so consumers re-read",
		Long: `Publish a resync control message for a source under a new epoch and
checkpoint that epoch at the same position; the bridge streams on from there
under the new producer id. Consumers that follow control messages re-read their
state.

When a running bridge holds the source, it does this itself through its control
endpoint (bridge.<name>.resync.<source>): its run ends at a transaction
boundary, and the resync happens while it still holds the slot. Otherwise the
command does it directly, which it refuses while a bridge streams from the
source's slot, or while the embedded NATS server of a running bridge answers;
with nats.url empty it then starts the embedded server on its store for the time
of the command. --direct skips the control endpoint.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := load()
			if err != nil {
				return printErrs(err)
			}
			src := resyncSource
			if src == "" && len(cfg.Sources) == 1 {
				src = slices.Sorted(maps.Keys(cfg.Sources))[0]
			}
			if src == "" {
				return usageError{fmt.Errorf("--source is required when the configuration has %d sources (%s)", len(cfg.Sources), strings.Join(slices.Sorted(maps.Keys(cfg.Sources)), ", "))}
			}
			if _, ok := cfg.Sources[src]; !ok {
				return usageError{fmt.Errorf("--source %q is not in the configuration (sources: %s)", src, strings.Join(slices.Sorted(maps.Keys(cfg.Sources)), ", "))}
			}
			// Through the bridge holding the source, when one does.
			if !resyncDirect {
				handled, err := resyncVia(cmd.Context(), cfg, src, resyncReason, resyncWait, stdout) // control.go
				if handled || err != nil {
					return err
				}
			}
			_, a, err := load(app.WithLogger(NewLogger(cfg.Log, stderr)))
			if err != nil {
				return printErrs(err)
			}
			defer a.Close()
			producer, err := a.Resync(cmd.Context(), src, resyncReason)
			if err != nil {
				return fmt.Errorf("resync of source %s: %w", src, err)
			}
			fmt.Fprintf(stdout, "source %s: resync published; new producer %s (path: direct)\n", src, producer)
			return nil
		},
	}
	resync.Flags().StringVar(&resyncSource, "source", "", "the source to resync (default: the only one)")
	resync.Flags().StringVar(&resyncReason, "reason", "", "text added to the message's reason")
	resync.Flags().DurationVar(&resyncWait, "wait", 30*time.Second, "how long a running bridge may take to reach a transaction boundary")
	resync.Flags().BoolVar(&resyncDirect, "direct", false, "do not ask a running bridge: resync directly (refused while a bridge streams the source)")
	root.AddCommand(run, validate, statusCmd, plugins, newPluginCommand(stdout, opts), ver, resync)
	root.AddCommand(newPauseCommand(load, printErrs, stdout, true), newPauseCommand(load, printErrs, stdout, false)) // control.go
	// reload needs only the bridge's name and NATS settings: the running
	// bridges judge the rest, and report its problems.
	loadLoose := func() (*config.Config, error) {
		cfg, _, _, err := app.LoadConfig(context.Background(), cfgPath, loadOpts(nil)...)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, missingConfig{path: cfgPath, err: err}
		}
		var ferrs config.Errors
		if err != nil && (cfg == nil || cfg.Name == "" || !errors.As(err, &ferrs)) {
			return nil, printErrs(err)
		}
		return cfg, nil
	}
	root.AddCommand(newReloadCommand(loadLoose, stdout))
	root.AddCommand(newFleetCommand(loadLoose, stdout))          // fleet.go
	root.AddCommand(newSchemaCommand(loadLoose, stdout))         // the schema registry: schema.go
	root.AddCommand(newSetupCommand(loadLoose, stdout))          // bridge setup ddl: setup.go
	root.AddCommand(newSnapshotCommand(load, printErrs, stdout)) // snapshot.go
	// serve reads the configuration only, and judges only its sections.
	loadConfig := func(co []config.Option) (*config.Config, error) {
		cfg, _, _, err := app.LoadConfig(context.Background(), cfgPath, loadOpts(co)...)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, missingConfig{path: cfgPath, err: err}
		}
		return cfg, err
	}
	root.AddCommand(serveCommand(loadConfig, printErrs, stderr)) // feeds over HTTP: serve.go
	usageArgs(root)
	return root
}

// errorLines returns the lines of err to print, in its order (mergeErrs and
// config.Load put problems in the order of the file), without blank lines
// or lines printed already.
func errorLines(err error) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out
}

func printPlugin(w io.Writer, typ, doc string, cfg any) {
	fmt.Fprintf(w, "  %s\t%s\n", typ, doc)
	for _, k := range ConfigKeys(cfg) {
		fmt.Fprintf(w, "      %s\n", k)
	}
}

// ConfigKeys lists a config struct's koanf keys as "key (type, default X)".
func ConfigKeys(cfg any) []string {
	v := reflect.ValueOf(cfg)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := strings.Split(f.Tag.Get("koanf"), ",")[0]
		if key == "" || key == "-" || !f.IsExported() {
			continue
		}
		fv := v.Field(i)
		typ := f.Type.String()
		if f.Type == reflect.TypeOf(time.Duration(0)) {
			typ = "duration"
		}
		def := ""
		if !fv.IsZero() {
			switch x := fv.Interface().(type) {
			case time.Duration:
				def = x.String()
			default:
				def = fmt.Sprint(x)
			}
		}
		if def != "" {
			out = append(out, fmt.Sprintf("%s (%s, default %s)", key, typ, def))
		} else {
			out = append(out, fmt.Sprintf("%s (%s)", key, typ))
		}
	}
	return out
}

// NewLogger builds the slog logger of bridge.yaml's log section: text on a
// terminal, JSON otherwise, unless the format says.
func NewLogger(l config.Log, w io.Writer) *slog.Logger {
	var lvl slog.Level
	switch strings.ToLower(l.Level) {
	case "debug":
		lvl = slog.LevelDebug
	case "warn":
		lvl = slog.LevelWarn
	case "error":
		lvl = slog.LevelError
	}
	ho := &slog.HandlerOptions{Level: lvl}
	format := l.Format
	if format == "" || format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				format = "text"
			}
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, ho))
	}
	return slog.New(slog.NewJSONHandler(w, ho))
}

// mergeErrs joins config errors with App errors, dropping App errors at a
// YAML path the config errors already cover, in the order of the file
// (config.Config.Problems).
func mergeErrs(cfg *config.Config, cfgErr, appErr error) error {
	return cfg.Problems(cfgErr, appErr)
}
