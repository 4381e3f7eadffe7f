package cli

// `bridge plugin test <executable>` and the configured plugins that
// `bridge plugins` lists: both through sinks.Exec, which sink types that
// run executables (type plugin) register, so this package knows none of
// them by name; and the routes' WebAssembly modules, which it lists too.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/wasm"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// execType returns the registered sink type that runs executables.
func execType(reg *sinks.Registry) (string, *sinks.Exec) {
	for _, t := range reg.Types() {
		if p, _ := reg.Lookup(t); p.Exec != nil {
			return t, p.Exec
		}
	}
	return "", nil
}

func newPluginCommand(stdout io.Writer, opts []app.Option) *cobra.Command {
	plugin := &cobra.Command{
		Use:   "plugin",
		Short: "Work with out-of-process sink plugins (docs/plugins.md)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var block string
	test := &cobra.Command{
		Use:   "test <executable> [-- args...]",
		Short: "Run the sink conformance suite against a plugin executable",
		Long: `Run the sink conformance suite (sinks/sinktest, the one every compiled-in sink
passes) against a plugin executable: config round trip, idempotent Connect and
Close, ordered delivery, partial failure and a failure during a write (when the
plugin serves Break and Heal), Close under a short deadline, replay. The plugin
must serve bridge.plugin.v1.Conformance's Read so that the suite can read back
what it wrote. Exit status 0 when every case passes, 1 otherwise.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sinkReg, _ := app.Registries(opts...)
			_, ex := execType(sinkReg)
			if ex == nil {
				return errors.New("no sink type of this binary runs plugins: build it with the standard plugins (plugins/)")
			}
			var cfg map[string]any
			if block != "" {
				if err := yaml.Unmarshal([]byte(block), &cfg); err != nil {
					return usageError{fmt.Errorf("--plugin-config: not a YAML or JSON mapping: %w", err)}
				}
			}
			ok, err := ex.Test(args[0], args[1:], cfg)
			if err != nil {
				return err
			}
			if !ok {
				fmt.Fprintf(stdout, "plugin %s failed the conformance suite\n", args[0])
				return reported{fmt.Errorf("plugin %s failed the conformance suite", args[0])}
			}
			fmt.Fprintf(stdout, "plugin %s passed the conformance suite\n", args[0])
			return nil
		},
	}
	test.Flags().StringVar(&block, "plugin-config", "", `the plugin's own config block, YAML or JSON (what bridge.yaml's sinks.<name>.config.config holds), e.g. '{"path": "/tmp/t.jsonl"}'`)
	plugin.AddCommand(test)
	return plugin
}

// printConfiguredPlugins lists what the config at path runs of its own:
// the sinks whose type runs an executable, starting each to describe it,
// and the routes' WebAssembly modules, loading each as a run does. A
// missing file lists nothing.
func printConfiguredPlugins(stdout io.Writer, path string, opts []app.Option) error {
	cfg, _, _, err := app.LoadConfig(context.Background(), path, app.ConfigOptions(opts...)...)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil && cfg == nil {
		return err
	}
	sinkReg, _ := app.Registries(opts...)
	if typ, ex := execType(sinkReg); ex != nil {
		var names []string
		for n, s := range cfg.Sinks {
			if s.Type == typ {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		fmt.Fprintf(stdout, "configured plugins (%s):\n", path)
		if len(names) == 0 {
			fmt.Fprintln(stdout, "  none")
		}
		for _, n := range names {
			s := cfg.Sinks[n]
			cmdline, _ := json.Marshal(s.Config["command"])
			line, err := ex.Describe(cfg.Decoder("sinks."+n+".config", s.Config), sinks.Env{Name: n})
			if err != nil {
				fmt.Fprintf(stdout, "  %s: %s: error: %v\n", n, cmdline, oneLine(err))
				continue
			}
			fmt.Fprintf(stdout, "  %s: %s: %s\n", n, cmdline, line)
		}
	}
	printConfiguredWASM(stdout, path, cfg)
	return nil
}

// printConfiguredWASM lists the routes' wasm_filter and wasm_transform
// modules of cfg (read from path), each loaded as a run loads it (its sum
// checked, compiled, its imports and exports checked, one instance
// started), with its limits or what is wrong with it.
func printConfiguredWASM(stdout io.Writer, path string, cfg *config.Config) {
	fmt.Fprintf(stdout, "configured WebAssembly modules (%s):\n", path)
	n := 0
	for i, r := range cfg.Routes {
		for _, b := range []struct {
			key  string
			kind wasm.Kind
			w    config.WASM
		}{{"wasm_filter", wasm.Filter, r.WASMFilter}, {"wasm_transform", wasm.Transform, r.WASMTransform}} {
			if !b.w.Set() {
				continue
			}
			n++
			at := fmt.Sprintf("routes[%d].%s", i, b.key)
			m, err := wasm.Load(context.Background(), b.kind, wasm.Config{At: at, Module: b.w.Module, SHA256: b.w.SHA256,
				Function: b.w.Function, Timeout: b.w.Timeout, MaxMemory: int64(b.w.MaxMemoryMiB) << 20,
				CacheDir: wasmCache(cfg)})
			if err != nil {
				fmt.Fprintf(stdout, "  %s: %q: error: %v\n", at, b.w.Module, oneLine(err))
				continue
			}
			how := ""
			if m.Interpreted() {
				how = ", interpreted (this process may not map executable memory: MemoryDenyWriteExecute)"
			}
			fmt.Fprintf(stdout, "  %s: %q: %s, contract v1, sha256 matches, timeout %s per call, at most %d MiB per instance%s\n",
				at, b.w.Module, m.Function(), m.Timeout(), m.MaxMemory()>>20, how)
		}
	}
	if n == 0 {
		fmt.Fprintln(stdout, "  none")
	}
}

// wasmCache returns the compile cache a run of cfg keeps its modules in
// (bridge/app) when a run made it already, so that listing them compiles
// nothing again; "" (in memory) otherwise: a listing creates no directory.
func wasmCache(cfg *config.Config) string {
	if cfg.DataDir == "" {
		return ""
	}
	dir := filepath.Join(cfg.DataDir, "wasm")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return ""
	}
	return dir
}

func oneLine(err error) string {
	var es config.Errors
	if errors.As(err, &es) && len(es) > 0 {
		return es[0].Error()
	}
	return err.Error()
}
