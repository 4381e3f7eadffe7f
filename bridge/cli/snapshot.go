package cli

// `bridge snapshot`: ask the running bridge (through the checkpoint bucket)
// for a snapshot of some tables, and follow its progress.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sources"
)

func newSnapshotCommand(load func(...app.Option) (*config.Config, *app.App, error), printErrs func(error) error, stdout io.Writer) *cobra.Command {
	var source, tables, progress, where string
	var wait, follow bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Snapshot tables into the stream while the bridge runs (read changes, consistent with the stream)",
		Long: `Ask the bridge to read the current rows of tables into the stream as "read"
changes, in chunks between watermarks, so that rows changed meanwhile are never
published older than their latest change (docs/snapshots.md). The request goes
to the checkpoint bucket; a running bridge takes it within snapshot.request_poll,
a stopped one at its next start. --where reads only the rows matching its
conditions (column op literal, joined with AND; never SQL: docs/snapshots.md).
The instance holding the source takes the request on its control endpoint
(bridge.<name>.snapshot.<source>) and checks it against its running
configuration; when none holds it, the command checks it and queues it in the
bucket itself. With --wait (the default) the command follows the progress: a
bar per table on a terminal, plain lines otherwise. --follow only follows the
snapshot running now, such as the initial one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch progress {
			case "auto", "bar", "plain", "none":
			default:
				return usageError{fmt.Errorf("--progress must be auto, bar, plain or none, got %q", progress)}
			}
			var list []string
			for _, t := range strings.Split(tables, ",") {
				if t = strings.TrimSpace(t); t == "" {
					continue
				}
				list = append(list, t)
			}
			if follow && (len(list) > 0 || where != "") {
				return usageError{errors.New("--follow watches the running snapshot; it takes no --tables nor --where")}
			}
			if _, err := sources.ParseWhere(where); err != nil {
				return usageError{fmt.Errorf("--where: %w", err)}
			}
			cfg, a, err := load()
			if err != nil {
				return printErrs(err)
			}
			if source == "" {
				if len(cfg.Sources) != 1 {
					return usageError{fmt.Errorf("--source is required: the config has %d sources (%s)", len(cfg.Sources), strings.Join(slices.Sorted(maps.Keys(cfg.Sources)), ", "))}
				}
				source = slices.Sorted(maps.Keys(cfg.Sources))[0]
			}
			if _, ok := cfg.Sources[source]; !ok {
				return usageError{fmt.Errorf("--source %q is not in the config (sources: %s)", source, strings.Join(slices.Sorted(maps.Keys(cfg.Sources)), ", "))}
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			ne, err := status.FindNATS(cfg)
			if err != nil {
				return fmt.Errorf("the snapshot request goes through NATS: %w", err)
			}
			conn := natsconn.Env(ne)
			nc, err := natsconn.Connect(conn, "bridge "+cfg.Name+" snapshot", nats.Timeout(5*time.Second))
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			if _, err := checkpoint.Open(ctx, js, cfg.Checkpoint.Bucket, cfg.Checkpoint.Replicas); err != nil {
				return err
			}
			kv, err := js.KeyValue(ctx, cfg.Checkpoint.Bucket)
			if err != nil {
				return fmt.Errorf("opening checkpoint bucket %q: %w", cfg.Checkpoint.Bucket, err)
			}
			if follow {
				st, _, err := snapshot.Load(ctx, kv, cfg.Name, source)
				if err != nil {
					return err
				}
				if st.Current == nil {
					last := "none"
					if st.Last != nil {
						last = st.Last.ID + " (" + st.Last.Reason + ")"
					}
					fmt.Fprintf(stdout, "no snapshot running on source %s; last: %s\n", source, last)
					return nil
				}
				fmt.Fprintf(stdout, "following snapshot %s (%s) of source %s\n", st.Current.ID, st.Current.Reason, source)
				return followSnapshot(ctx, kv, cfg.Name, source, st.Current.ID, stdout, progress)
			}
			// Through the instance holding the source, which checks the
			// request against its running configuration; else directly.
			path := "control endpoint " + control.SourceSubject(cfg.Name, control.ActionSnapshot, source)
			cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
			r, err := control.NewClient(nc, cfg.Name).Snapshot(cctx, source, control.SnapshotRequest{Tables: list, Where: where})
			cancel()
			id, covered := r.ID, r.Tables
			switch {
			case err == nil:
			case fallsBack(err):
				path = fmt.Sprintf("direct: %v", err)
				// Refused here rather than queued: the bridge would refuse
				// it when it takes it, maybe much later.
				if id, covered, err = a.RequestSnapshot(ctx, js, source, list, where); err != nil {
					return fmt.Errorf("snapshot of source %s refused: %w", source, err)
				}
			default:
				return fmt.Errorf("snapshot of source %s: %w", source, err)
			}
			what := "every table of the source (" + strings.Join(covered, ", ") + ")"
			if len(list) > 0 {
				what = strings.Join(covered, ", ")
			}
			if where != "" {
				what += " where " + where
			}
			fmt.Fprintf(stdout, "snapshot %s requested for %s (source %s; path: %s)\n", id, what, source, path)
			if running, slot := streaming(ctx, cfg, source); !running {
				fmt.Fprintf(stdout, "no bridge is streaming source %s now (slot %s is inactive): the snapshot starts when `bridge run` does\n", source, slot)
				if wait {
					fmt.Fprintln(stdout, "waiting for it; Ctrl-C stops waiting, the request stays queued")
				}
			}
			if !wait {
				return nil
			}
			return followSnapshot(ctx, kv, cfg.Name, source, id, stdout, progress)
		},
	}
	cmd.Flags().StringVar(&source, "source", "", "source to snapshot (needed when the config has several)")
	cmd.Flags().StringVar(&tables, "tables", "", "comma-separated schema.table list (a bare name is public's); empty: every table the source streams")
	cmd.Flags().StringVar(&where, "where", "", "read only the rows matching these conditions: column op literal, joined with AND (e.g. \"tenant_id = 42 AND created_at >= '2024-01-01'\")")
	cmd.Flags().BoolVar(&follow, "follow", false, "request nothing: follow the running snapshot (e.g. the initial one) until it is checkpointed")
	cmd.Flags().BoolVar(&wait, "wait", true, "follow the progress until the snapshot is checkpointed")
	cmd.Flags().StringVar(&progress, "progress", "auto", "progress display: auto (bars on a terminal, else lines), bar, plain or none")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up waiting after this long (0: never)")
	return cmd
}

// followSnapshot polls the snapshot state until run id finished, showing
// its durable progress.
func followSnapshot(ctx context.Context, kv jetstream.KeyValue, bridge, source, id string, w io.Writer, mode string) error {
	if mode == "auto" {
		mode = "plain"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	bars := map[string]*progressbar.ProgressBar{}
	lastLine := time.Time{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	started := map[string]time.Time{}
	for {
		st, _, err := snapshot.Load(ctx, kv, bridge, source)
		if err != nil {
			return err
		}
		var run *snapshot.Run
		finished := false
		switch {
		case st.Current != nil && st.Current.ID == id:
			run = st.Current
		case st.Last != nil && st.Last.ID == id:
			run, finished = st.Last, true
		}
		if run != nil {
			for _, t := range run.Tables {
				switch mode {
				case "bar":
					b := bars[t.Table]
					if b == nil {
						max := t.Estimate
						if max <= 0 {
							max = -1
						}
						b = progressbar.NewOptions64(max, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(t.Table),
							progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("rows"),
							progressbar.OptionSetPredictTime(true), progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
						bars[t.Table] = b
					}
					_ = b.Set64(t.Rows)
					if t.Done {
						_ = b.Finish()
					}
				case "plain":
					if time.Since(lastLine) < 2*time.Second && !finished {
						continue
					}
					if _, ok := started[t.Table]; !ok && t.Started != nil {
						started[t.Table] = *t.Started
					}
					perS, eta := 0.0, "unknown"
					if t.Started != nil {
						var left time.Duration
						if perS, left = t.Progress(time.Now()); left >= 0 {
							eta = left.Truncate(time.Second).String()
						}
					}
					fmt.Fprintf(w, "%s: %d/%d rows, %.0f rows/s, eta %s, done %t\n", t.Table, t.Rows, t.Estimate, perS, eta, t.Done)
				}
			}
			if mode == "plain" && (time.Since(lastLine) >= 2*time.Second || finished) {
				lastLine = time.Now()
			}
		}
		if finished {
			if run.Error != "" {
				return fmt.Errorf("snapshot %s %s: %s", id, run.Outcome(), run.Error)
			}
			var rows int64
			for _, t := range run.Tables {
				rows += t.Rows
			}
			fmt.Fprintf(w, "snapshot %s complete: %d tables, %d rows\n", id, len(run.Tables), rows)
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("snapshot %s not complete before --timeout; it goes on in the bridge", id)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// streaming reports whether a walsender streams source's slot, and the
// slot's name; true when that cannot be told (not a Postgres source, or the
// query failed), so that nothing misleading is printed.
func streaming(ctx context.Context, cfg *config.Config, source string) (bool, string) {
	src, ok := pgslot.SourceOf(source, cfg.Sources[source])
	if !ok {
		return true, ""
	}
	row, err := pgslot.ReadOnce(ctx, src, "bridge:snapshot")
	if err != nil {
		return true, src.Slot
	}
	return row.Active, src.Slot
}
