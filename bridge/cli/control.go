package cli

// The commands that talk to running bridges through their control
// endpoints (bridge/control): status's running state, pause, resume,
// resync, snapshot, reload, each falling back to the bucket or Postgres
// when no bridge answers, and saying which path it took.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
)

// dialNATS connects to cfg's NATS server for a helper command (nats.url,
// or the embedded server of the running bridge).
func dialNATS(cfg *config.Config, what string) (*nats.Conn, error) {
	ne, err := status.FindNATS(cfg)
	if err != nil {
		return nil, err
	}
	conn := natsconn.Env(ne)
	// Permission errors are read from the connection (control.Client);
	// not printed here.
	nc, err := natsconn.Connect(conn, "bridge "+cfg.Name+" "+what, nats.Timeout(5*time.Second), nats.MaxReconnects(0),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		return nil, err
	}
	return nc, nil
}

// askStatus asks the bridge's instances for their status within timeout.
// An error says why none answered.
func askStatus(ctx context.Context, cfg *config.Config, timeout time.Duration) ([]control.StatusReply, error) {
	nc, err := dialNATS(cfg, "status")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return control.NewClient(nc, cfg.Name).Status(ctx)
}

// fallsBack reports whether err means that no bridge answered, so that the
// command may act directly; any other error (a permission refused, a
// bridge's refusal) is the command's error.
func fallsBack(err error) bool {
	var ce *control.Error
	var pe *control.PermissionError
	return errors.Is(err, control.ErrNoAnswer) && !errors.As(err, &ce) && !errors.As(err, &pe)
}

// sourceArg returns the source a command names: its argument, or the only
// source of cfg.
func sourceArg(cfg *config.Config, args []string) (string, error) {
	names := slices.Sorted(maps.Keys(cfg.Sources))
	switch {
	case len(args) == 1:
		if _, ok := cfg.Sources[args[0]]; !ok {
			return "", usageError{fmt.Errorf("source %q is not in the configuration (sources: %s)", args[0], strings.Join(names, ", "))}
		}
		return args[0], nil
	case len(names) == 1:
		return names[0], nil
	}
	return "", usageError{fmt.Errorf("name the source: the configuration has %d (%s)", len(names), strings.Join(names, ", "))}
}

// newPauseCommand returns `bridge pause` (pause true) or `bridge resume`.
func newPauseCommand(load func(...app.Option) (*config.Config, *app.App, error), printErrs func(error) error, stdout io.Writer, pause bool) *cobra.Command {
	var reason string
	var wait time.Duration
	use, short, long := "pause [source]", "Pause a source at a transaction boundary; its slot is kept", `Pause a source: the bridge holding it ends its run at the next transaction
boundary, saves a last checkpoint and closes the replication connection. The
slot is kept, so Postgres keeps the WAL written meanwhile (bridge status shows
how much); every change committed while paused is streamed after resume. The
pause is recorded in the checkpoint bucket, so a restarted bridge or a standby
honours it too.

The request goes to the control endpoint bridge.<name>.pause.<source>, which the
instance holding the source answers. When no instance holds it (none runs, or
none streams it now), the pause is recorded in the bucket directly and running
bridges follow it.`
	if !pause {
		use, short, long = "resume [source]", "Resume a paused source", `Resume a paused source: the pause recorded in the checkpoint bucket is cleared,
and the bridge streams every change committed meanwhile, exactly once, from its
checkpoint.

The request goes to the control endpoint bridge.<name>.resume.<source>, which the
instance that paused the source answers. When none does (it was restarted, or
none runs), the pause is cleared in the bucket directly and running bridges
follow it.`
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, _, err := load()
			if err != nil {
				return printErrs(err)
			}
			source, err := sourceArg(cfg, args)
			if err != nil {
				return err
			}
			nc, err := dialNATS(cfg, cmd.Name())
			if err != nil {
				return fmt.Errorf("the %s goes through NATS: %w", cmd.Name(), err)
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), wait+10*time.Second)
			defer cancel()
			c := control.NewClient(nc, cfg.Name)
			subject := control.SourceSubject(cfg.Name, cmd.Name(), source)
			var r control.SourceReply
			if pause {
				r, err = c.Pause(ctx, source, control.PauseRequest{Reason: reason, By: "bridge pause", Wait: wait.String()})
			} else {
				r, err = c.Resume(ctx, source, control.ResumeRequest{By: "bridge resume", Wait: wait.String()})
			}
			if err == nil {
				printSourceReply(stdout, r, subject)
				return nil
			}
			if !fallsBack(err) {
				return fmt.Errorf("%s of source %s: %w", cmd.Name(), source, err)
			}
			// No instance holds the source: record the order directly.
			js, err2 := jetstream.New(nc)
			if err2 != nil {
				return err2
			}
			store, err2 := checkpoint.Open(ctx, js, cfg.Checkpoint.Bucket, cfg.Checkpoint.Replicas)
			if err2 != nil {
				return fmt.Errorf("%s of source %s: %w", cmd.Name(), source, err2)
			}
			key := checkpoint.ControlKey(cfg.Name, source)
			if err2 := store.SetControl(ctx, key, checkpoint.Control{Paused: pause, Reason: reason, By: "bridge " + cmd.Name() + " (direct)"}); err2 != nil {
				return fmt.Errorf("%s of source %s: %w", cmd.Name(), source, err2)
			}
			what := "paused: running bridges stop it at their next transaction boundary, and a starting one does not stream it"
			if !pause {
				what = "resumed: running bridges stream it again at once"
			}
			fmt.Fprintf(stdout, "source %s %s (path: direct; %v; recorded in bucket %s, key %s)\n", source, what, err, cfg.Checkpoint.Bucket, key)
			return nil
		},
	}
	if pause {
		cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the pause")
	}
	waitHelp := "how long the bridge may take to reach a transaction boundary"
	if !pause {
		waitHelp = "how long the bridge may take to stream the source again"
	}
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, waitHelp)
	return cmd
}

// printSourceReply prints a source's state after pause or resume.
func printSourceReply(w io.Writer, r control.SourceReply, subject string) {
	s := r.Source
	fmt.Fprintf(w, "source %s %s on instance %s, checkpoint %s (path: control endpoint %s)\n", s.Name, s.State, r.Instance, s.Checkpoint, subject)
	if sl := s.Slot; sl != nil {
		act := "inactive"
		if sl.Active {
			act = "active"
		}
		fmt.Fprintf(w, "  slot %s kept (%s), retaining %d bytes of WAL (polled %s ago)\n", sl.Name, act, sl.RetainedWALBytes, time.Since(sl.PolledAt).Round(time.Second))
	}
	if s.LastError != "" && s.State != "streaming" && s.State != "paused" {
		fmt.Fprintf(w, "  last error: %s\n", s.LastError)
	}
}

// resyncVia asks the instance holding source for an operator resync;
// handled is false when none holds it (the caller resyncs directly).
func resyncVia(ctx context.Context, cfg *config.Config, source, reason string, wait time.Duration, stdout io.Writer) (bool, error) {
	nc, err := dialNATS(cfg, "resync")
	if err != nil {
		return false, nil // no NATS of a running bridge: the direct path says what it needs
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
	defer cancel()
	subject := control.SourceSubject(cfg.Name, control.ActionResync, source)
	r, err := control.NewClient(nc, cfg.Name).Resync(ctx, source, control.ResyncRequest{Reason: reason, Wait: wait.String()})
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "source %s: resync published by instance %s; new producer %s (path: control endpoint %s)\n", source, r.Instance, r.Producer, subject)
		return true, nil
	case fallsBack(err):
		fmt.Fprintf(stdout, "no running bridge holds source %s (%v): resyncing directly\n", source, err)
		return false, nil
	}
	return true, fmt.Errorf("resync of source %s: %w", source, err)
}

// newReloadCommand returns `bridge reload`.
func newReloadCommand(load func() (*config.Config, error), stdout io.Writer) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Make the running bridges read their configuration again and apply it",
		Long: `Ask every running instance of the bridge (bridge.<name>.reload) to read its
configuration again (its file, and the config.kv entry) and apply it without a
restart: sources, sinks and routes added, changed or removed. A configuration
with problems, or one changing a key only a restart applies, is refused whole,
and the running configuration goes on. New routes apply from each source's next
transaction; a changed source or sink restarts only the sources using it, each
drained at a transaction boundary. Prints each instance's answer; exits 1 when
one refused. SIGHUP does the same for one process.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := load()
			if err != nil {
				return err
			}
			nc, err := dialNATS(cfg, "reload")
			if err != nil {
				return fmt.Errorf("reload goes through NATS: %w", err)
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			subject := control.Subject(cfg.Name, control.ActionReload)
			rs, err := control.NewClient(nc, cfg.Name).Reload(ctx)
			if err != nil {
				if fallsBack(err) {
					return fmt.Errorf("no running bridge answered on %s (%w): there is nothing to reload; `bridge run` reads the configuration when it starts", subject, err)
				}
				return err
			}
			refused := 0
			for _, r := range rs {
				if r.Err != nil {
					refused++
					fmt.Fprintf(stdout, "instance %s refused the configuration: %s\n", orUnknown(r.Err.Instance), r.Err.Description)
					for _, d := range r.Err.Details {
						fmt.Fprintf(stdout, "  %s\n", d)
					}
					continue
				}
				rr := r.Reply
				if rr.Revision == rr.Previous {
					fmt.Fprintf(stdout, "instance %s: configuration %s unchanged\n", rr.Instance, rr.Revision)
					continue
				}
				fmt.Fprintf(stdout, "instance %s: configuration %s → %s\n", rr.Instance, rr.Previous, rr.Revision)
				for _, c := range rr.Changes {
					fmt.Fprintf(stdout, "  %s\n", c)
				}
			}
			fmt.Fprintf(stdout, "(path: control endpoint %s, %d instance(s) answered)\n", subject, len(rs))
			if refused > 0 {
				return reported{fmt.Errorf("%d instance(s) refused the configuration", refused)}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the bridges (a reload drains the sources it restarts)")
	return cmd
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
