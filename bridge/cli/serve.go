package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/reload"
)

// serveOverrides returns the serve keys set by the flags given on cmd's
// command line (cobra's Changed; a flag left out keeps the file's value),
// for config.WithOverrides, and the flag that set each key. Flags are
// named after their keys with dashes. --where is not among them: it
// replaces serve.where after loading, where an override would merge with
// the file's mapping.
func serveOverrides(cmd *cobra.Command, v config.Serve, tables string) (map[string]any, map[string]string) {
	var list []any // --tables "": every table
	for _, t := range strings.Split(tables, ",") {
		if t = strings.TrimSpace(t); t != "" {
			list = append(list, t)
		}
	}
	vals := map[string]any{
		"listen": v.Listen, "stream": v.Stream, "tables": append([]any{}, list...),
		"max-conns": v.MaxConns, "max-per-client": v.MaxPerClient, "client-header": v.ClientHeader,
		"hold": v.Hold, "keep-alive": v.KeepAlive, "write-timeout": v.WriteTimeout,
		"max-lag": v.MaxLag, "window-txns": v.WindowTxns, "window-bytes": v.WindowBytes,
	}
	over, flags := map[string]any{}, map[string]string{}
	for name, val := range vals {
		if cmd.Flags().Changed(name) {
			key := "serve." + strings.ReplaceAll(name, "-", "_")
			over[key], flags[key] = val, name
		}
	}
	return over, flags
}

// blameFlags adds the flag's name to each configuration problem at a key
// a flag set, so that a bad flag value is not sought in bridge.yaml.
func blameFlags(err error, flags map[string]string) {
	switch e := err.(type) {
	case interface{ Unwrap() []error }: // config.Errors, errors.Join
		for _, sub := range e.Unwrap() {
			blameFlags(sub, flags)
		}
	case *config.FieldError:
		for key, name := range flags {
			if e.Path == key || strings.HasPrefix(e.Path, key+"[") {
				e.Msg += " (set by flag --" + name + ")"
				return
			}
		}
	}
}

// serveSections are the top-level keys of bridge.yaml that `bridge serve`
// reads: its own section, the NATS connection (an embedded server's
// address file lives in data_dir), logging, the shutdown timeout, the
// bridge's name and where the configuration comes from.
var serveSections = []string{"serve", "nats", "data_dir", "log", "shutdown", "name", "config"}

// splitServeProblems splits the problems config.Load found into those in
// serveSections, which stop `bridge serve`, and the rest, which it does
// not read: a feeds server on a host of its own shares bridge.yaml with
// the bridge but not the database's credentials, so an unset ${PG_DSN}
// in sources must not stop it. Errors other than config.Errors (a file
// that does not parse) are kept whole.
func splitServeProblems(err error) (kept error, ignored []string) {
	var ferrs config.Errors
	if err == nil || !errors.As(err, &ferrs) {
		return err, nil
	}
	var keep config.Errors
	for _, fe := range ferrs {
		top, _, _ := strings.Cut(fe.Path, ".")
		top, _, _ = strings.Cut(top, "[")
		if slices.Contains(serveSections, top) || fe.Path == "" {
			keep = append(keep, fe)
		} else {
			ignored = append(ignored, fe.Path)
		}
	}
	if len(keep) == 0 {
		return nil, ignored
	}
	return keep, ignored
}

// serveWarnings returns what `bridge serve` warns about at start for its
// configuration s listening on listen (the effective serve.listen): doors
// that only a listener other machines reach opens.
func serveWarnings(s config.Serve, listen string) []string {
	if config.IsLoopback(listen) {
		return nil
	}
	var out []string
	if s.EffectiveMode() == config.AuthNone {
		out = append(out, "serving every row without authentication to every machine that reaches serve.listen (serve.auth.mode: none)")
	}
	if s.TokenSecret == "" {
		out = append(out, "resume tokens are unsigned (serve.token_secret is not set): a caller can write one for any position, "+
			"the stream's start included, and read the history the stream holds through its own filter; "+
			"set serve.token_secret (32 bytes or more, the same on every process) to refuse tokens this server did not hand out")
	}
	return out
}

// serveCommand is `bridge serve`: the feeds HTTP server over the stream
// the bridge writes, configured by bridge.yaml's serve section and flags
// that override it, with the NATS connection of bridge.yaml. Problems in
// the sections it does not read (sources, sinks, routes, ...) are logged
// and ignored; `bridge validate` reports them.
func serveCommand(load func([]config.Option) (*config.Config, error), printErrs func(error) error, stderr io.Writer) *cobra.Command {
	var fv config.Serve
	var where, tables string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve filtered feeds of the change stream over HTTP (long-poll and SSE)",
		Long: `Serve filtered feeds of a JetStream change stream over HTTP: GET /v1/feed
(long-poll, or server-sent events with Accept: text/event-stream or sse=1),
GET /v1/position, /livez, /readyz and Prometheus metrics on /metrics. Reads
the stream with one consumer, whatever the number of clients; needs no
replication slot. Configured by bridge.yaml's serve section; a flag given on
the command line overrides its key. NATS comes from bridge.yaml's nats
section. Of bridge.yaml it reads serve, nats, data_dir, log, shutdown, name
and config: a problem elsewhere (sources, sinks, routes, http) is logged and
ignored, and bridge validate reports it. See docs/feeds.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var flagWhere *feeds.Cond
			if where != "" {
				c, err := feeds.ParseCond([]byte(where))
				if err != nil {
					return usageError{fmt.Errorf("--where: %w", err)}
				}
				flagWhere = &c
			}
			over, flags := serveOverrides(cmd, fv, tables)
			cfg, err := load([]config.Option{config.WithOverrides(over)})
			err, ignored := splitServeProblems(err)
			if err != nil {
				blameFlags(err, flags)
				return printErrs(err)
			}
			log := NewLogger(cfg.Log, stderr)
			if len(ignored) > 0 {
				log.Info("ignoring problems in sections of the configuration that serve does not read (bridge validate reports them)", "keys", strings.Join(ignored, ", "))
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			sc, fc, err := serve.FromConfig(ctx, cfg.Serve, log)
			if err != nil {
				return printErrs(err)
			}
			if cmd.Flags().Changed("where") {
				sc.Where = flagWhere // --where "" serves without a condition
			}
			ne, err := status.FindNATS(cfg)
			if err != nil {
				return err
			}
			conn := natsconn.Env(ne)
			conn.Warn(log)
			nc, err := natsconn.Connect(conn, "bridge "+cfg.Name+" serve", nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), natsconn.Events(log))
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return fmt.Errorf("opening JetStream: %w", err)
			}
			startCtx, startCancel := context.WithTimeout(ctx, time.Minute)
			fs, err := feeds.New(startCtx, js, fc)
			startCancel()
			if err != nil {
				return fmt.Errorf("serve.stream: %w", err)
			}
			defer fs.Close()
			fsrv := serve.New(fs, sc, log)
			srv := fsrv.HTTPServer()
			ln, err := net.Listen("tcp", sc.Listen)
			if err != nil {
				return fmt.Errorf("serve.listen: listening on %s: %w (choose another address with serve.listen or --listen)", sc.Listen, err)
			}
			if err := fsrv.Watch(ctx, reload.OnSIGHUP(ctx)); err != nil {
				return err
			}
			scheme := "http"
			if sc.TLS != nil {
				scheme = "https"
			}
			auth := cfg.Serve.EffectiveMode()
			log.Info("serving feeds and /metrics", "listen", ln.Addr().String(), "scheme", scheme, "auth", auth, "stream", fc.Stream, "position", fs.Position().String())
			for _, w := range serveWarnings(cfg.Serve, sc.Listen) {
				log.Warn(w, "listen", sc.Listen)
			}
			errc := make(chan error, 1)
			go func() { errc <- fsrv.Serve(srv, ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, scancel := context.WithTimeout(context.Background(), cfg.Shutdown.Timeout)
			defer scancel()
			fs.Close() // ends every Next, so long-polls and streams return
			return srv.Shutdown(sctx)
		},
	}
	// Flags without defaults of their own: one given on the command line
	// overrides its serve key; bridge.yaml and its defaults supply the rest.
	fl := cmd.Flags()
	fl.StringVar(&fv.Listen, "listen", "", "HTTP address to listen on; overrides serve.listen (default 127.0.0.1:8090)")
	fl.StringVar(&fv.Stream, "stream", "", "JetStream stream the bridge writes; overrides serve.stream (default CDC)")
	fl.StringVar(&where, "where", "", `condition ANDed with every request's, JSON (e.g. {"eq":["tenant_id",42]}); replaces serve.where, "" for none`)
	fl.StringVar(&tables, "tables", "", `comma-separated schema.table names requests may read; overrides serve.tables, "" for all`)
	fl.IntVar(&fv.MaxConns, "max-conns", 0, "feed requests in progress before 503; overrides serve.max_conns (default 10000)")
	fl.IntVar(&fv.MaxPerClient, "max-per-client", 0, "feed requests in progress per client before 429; overrides serve.max_per_client (default 100)")
	fl.StringVar(&fv.ClientHeader, "client-header", "", "request header naming the client for the per-client limit; overrides serve.client_header (default the remote IP)")
	fl.DurationVar(&fv.Hold, "hold", 0, "long-poll wait (default and maximum); overrides serve.hold (default 20s)")
	fl.DurationVar(&fv.KeepAlive, "keep-alive", 0, "interval of SSE keep-alive comments; overrides serve.keep_alive (default 15s)")
	fl.DurationVar(&fv.WriteTimeout, "write-timeout", 0, "SSE write deadline before a slow client is disconnected; overrides serve.write_timeout (default 10s)")
	fl.Uint64Var(&fv.MaxLag, "max-lag", 0, "stream messages an SSE client may fall behind before it is disconnected; overrides serve.max_lag (default 100000)")
	fl.IntVar(&fv.WindowTxns, "window-txns", 0, "transactions kept in memory for resumes; overrides serve.window_txns (default 100000)")
	fl.Int64Var(&fv.WindowBytes, "window-bytes", 0, "bytes of changes and encodings kept in memory for resumes; a payload over half of it is not served; overrides serve.window_bytes (default 67108864)")
	return cmd
}
