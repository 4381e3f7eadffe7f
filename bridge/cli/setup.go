package cli

// `bridge setup ddl`: the event trigger behind DDL events
// (docs/schemas.md#ddl-events), printed, applied or removed.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/config"
)

func newSetupCommand(load func() (*config.Config, error), stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "setup",
		Short: "Print or apply the database objects optional features need",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var apply, remove bool
	var source, fnSchema string
	var timeout time.Duration
	ddl := &cobra.Command{
		Use:   "ddl",
		Short: "Print (or apply with --apply) the event trigger that writes each DDL command into the WAL for DDL events",
		Long: `Print the SQL of two event triggers (ddl_command_end and sql_drop) whose functions write
each DDL command's text into the WAL with pg_logical_emit_message under the prefix
"bridge.ddl", one message per table the command concerns, so the bridge publishes it as a
DDL event in WAL order (schemas.ddl: true; docs/schemas.md#ddl-events).

--apply runs it on the database of the source's dsn (--source; default: the only one);
creating an event trigger needs a superuser, or the administrator role of a managed
service that allows it. --remove prints (or with --apply, runs) the SQL that removes them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sql := schema.DDLSetupSQL(fnSchema)
			if remove {
				sql = schema.DDLRemoveSQL(fnSchema)
			}
			cfg, cfgErr := load()
			if !apply {
				fmt.Fprint(stdout, sql)
				if cfgErr == nil && !remove && !cfg.Schemas.DDL {
					fmt.Fprintln(stdout, "-- Then set schemas.ddl: true in the bridge's configuration: until then it drops these messages.")
				}
				return nil
			}
			if cfgErr != nil {
				return cfgErr
			}
			src, err := pickSource(cfg, source)
			if err != nil {
				return err
			}
			ps, ok := pgslot.SourceOf(src, cfg.Sources[src])
			if !ok {
				return fmt.Errorf("source %q has no dsn: not a Postgres source", src)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			conn, err := pgslot.Connect(ctx, ps.DSN, "bridge setup ddl")
			if err != nil {
				return fmt.Errorf("source %q: %w", src, err)
			}
			defer conn.Close(context.Background())
			var db string
			if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
				return fmt.Errorf("source %q: %w", src, err)
			}
			if _, err := conn.Exec(ctx, sql); err != nil {
				var pe *pgconn.PgError
				if errors.As(err, &pe) && pe.Code == "42501" {
					return fmt.Errorf("source %q, database %q: %w; creating or dropping an event trigger needs a superuser, or a managed service's administrator role that may (docs/schemas.md#who-may-create-event-triggers); or print the SQL (without --apply) for someone who may", src, db, err)
				}
				return fmt.Errorf("source %q, database %q: %w", src, db, err)
			}
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_event_trigger WHERE evtname = ANY($1) AND evtenabled <> 'D'", schema.DDLTriggerNames).Scan(&n); err != nil {
				return fmt.Errorf("source %q: checking the event triggers: %w", src, err)
			}
			if remove {
				fmt.Fprintf(stdout, "source %s: removed the DDL event triggers from database %s\n", src, db)
				return nil
			}
			if n != len(schema.DDLTriggerNames) {
				return fmt.Errorf("source %q, database %q: %d of the %d event triggers are installed and enabled after applying", src, db, n, len(schema.DDLTriggerNames))
			}
			fmt.Fprintf(stdout, "source %s: installed the DDL event triggers (%s) in database %s\n", src, strings.Join(schema.DDLTriggerNames, ", "), db)
			if !cfg.Schemas.DDL {
				fmt.Fprintln(stdout, "set schemas.ddl: true in the bridge's configuration: until then it drops these messages")
			}
			return nil
		},
	}
	ddl.Flags().BoolVar(&apply, "apply", false, "run the SQL on the source's database instead of printing it")
	ddl.Flags().BoolVar(&remove, "remove", false, "the SQL that removes the triggers and their functions")
	ddl.Flags().StringVar(&source, "source", "", "the source whose dsn --apply uses (default: the only one)")
	ddl.Flags().StringVar(&fnSchema, "schema", "public", "the schema of the triggers' functions")
	ddl.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "bounds --apply")
	root.AddCommand(ddl)
	return root
}

// pickSource returns the source named, or the only one.
func pickSource(cfg *config.Config, name string) (string, error) {
	names := slices.Sorted(maps.Keys(cfg.Sources))
	if name == "" {
		if len(names) != 1 {
			return "", usageError{fmt.Errorf("--source is required when the configuration has %d sources (%s)", len(names), strings.Join(names, ", "))}
		}
		return names[0], nil
	}
	if _, ok := cfg.Sources[name]; !ok {
		return "", usageError{fmt.Errorf("--source %q is not in the configuration (sources: %s)", name, strings.Join(names, ", "))}
	}
	return name, nil
}
