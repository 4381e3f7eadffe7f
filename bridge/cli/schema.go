package cli

// `bridge schema ls | show | diff`: read the schema registry (docs/schemas.md)
// from NATS; no database needed.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bridgecdc/bridge/bridge/schema"
	"github.com/bridgecdc/bridge/config"
)

func newSchemaCommand(load func() (*config.Config, error), stdout io.Writer) *cobra.Command {
	var source string
	var asJSON bool
	var timeout time.Duration
	root := &cobra.Command{
		Use:   "schema",
		Short: "List, show and compare the versions of the tables' shapes in the schema registry",
		Long: `Read the schema registry (schemas.bucket, a JetStream KV bucket; docs/schemas.md):
every version of every table a source streamed. Needs only NATS.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.PersistentFlags().StringVar(&source, "source", "", "the source (default: the only one)")
	root.PersistentFlags().DurationVar(&timeout, "timeout", 10*time.Second, "bounds the reads")

	// open loads the config and opens the registry.
	open := func(cmd *cobra.Command, needSource bool) (*schema.Registry, string, context.Context, context.CancelFunc, func(), error) {
		cfg, err := load()
		if err != nil {
			return nil, "", nil, nil, nil, err
		}
		src := source
		if src == "" && needSource {
			if len(cfg.Sources) != 1 {
				return nil, "", nil, nil, nil, usageError{fmt.Errorf("--source is required: the config has %d sources", len(cfg.Sources))}
			}
			for n := range cfg.Sources {
				src = n
			}
		}
		nc, err := dialNATS(cfg, "schema")
		if err != nil {
			return nil, "", nil, nil, nil, fmt.Errorf("the schema registry is in NATS: %w", err)
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		js, err := jetstream.New(nc)
		if err == nil {
			var reg *schema.Registry
			if reg, err = schema.OpenExisting(ctx, js, cfg.Schemas.Bucket); err == nil {
				return reg, src, ctx, cancel, nc.Close, nil
			}
		}
		cancel()
		nc.Close()
		return nil, "", nil, nil, nil, fmt.Errorf("%w (is schemas.enabled on, and has the bridge run?)", err)
	}
	table := func(arg string) (string, string, error) {
		sch, tbl, ok := strings.Cut(arg, ".")
		if !ok {
			return "", "", usageError{fmt.Errorf("table %q: want <schema>.<table>", arg)}
		}
		return sch, tbl, nil
	}
	get := func(ctx context.Context, reg *schema.Registry, src, sch, tbl, which string) (*schema.Version, error) {
		n, _, err := reg.Latest(ctx, src, sch, tbl)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("the registry %q has no versions of %s.%s of source %q", reg.Bucket(), sch, tbl, src)
		}
		switch {
		case which == "" || which == "latest":
		case strings.HasPrefix(which, "latest-"):
			k, err := strconv.Atoi(strings.TrimPrefix(which, "latest-"))
			if err != nil {
				return nil, usageError{fmt.Errorf("version %q: want a number, latest or latest-<n>", which)}
			}
			n -= k
		default:
			if n, err = strconv.Atoi(which); err != nil {
				return nil, usageError{fmt.Errorf("version %q: want a number, latest or latest-<n>", which)}
			}
		}
		v, err := reg.Get(ctx, src, sch, tbl, n)
		if err == nil && v == nil {
			err = fmt.Errorf("the registry %q has no version %d of %s.%s of source %q", reg.Bucket(), n, sch, tbl, src)
		}
		return v, err
	}

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the tables in the registry and their latest versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reg, src, ctx, cancel, done, err := open(cmd, false)
			if err != nil {
				return err
			}
			defer done()
			defer cancel()
			ts, err := reg.Tables(ctx)
			if err != nil {
				return err
			}
			sort.Slice(ts, func(i, j int) bool {
				a, b := ts[i], ts[j]
				return a.Source+"\x00"+a.Schema+"\x00"+a.Table < b.Source+"\x00"+b.Schema+"\x00"+b.Table
			})
			var out []schema.TableRef
			for _, t := range ts {
				if src == "" || t.Source == src {
					out = append(out, t)
				}
			}
			if asJSON {
				return json.NewEncoder(stdout).Encode(out)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SOURCE\tTABLE\tLATEST")
			for _, t := range out {
				fmt.Fprintf(tw, "%s\t%s.%s\t%d\n", t.Source, t.Schema, t.Table, t.Latest)
			}
			return tw.Flush()
		},
	}
	var version string
	show := &cobra.Command{
		Use:   "show <schema>.<table>",
		Short: "Show one version of a table (default the latest): columns, types, key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sch, tbl, err := table(args[0])
			if err != nil {
				return err
			}
			reg, src, ctx, cancel, done, err := open(cmd, true)
			if err != nil {
				return err
			}
			defer done()
			defer cancel()
			v, err := get(ctx, reg, src, sch, tbl, version)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(stdout).Encode(v)
			}
			fmt.Fprintf(stdout, "%s %s.%s version %d", v.Source, v.Schema, v.Table, v.Version)
			if v.Previous > 0 {
				fmt.Fprintf(stdout, " (previous %d)", v.Previous)
			}
			snap := ""
			if v.Since.Snapshot != "" {
				snap = " (a read of snapshot " + v.Since.Snapshot + ")"
			}
			fmt.Fprintf(stdout, "\nfirst change: %s seq %d of %s%s\nreplica identity: %s; key: %s\nregistry key: %s\n",
				v.Since.CommitLSN, v.Since.Seq, v.Since.Producer, snap, v.ReplicaIdentity, strings.Join(v.Key, ", "),
				schema.VersionKey(v.Source, v.Schema, v.Table, v.Version))
			if len(v.Inferred) > 0 {
				fmt.Fprintf(stdout, "read from the catalog, not the WAL: %s\n", strings.Join(v.Inferred, ", "))
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COLUMN\tTYPE\tNULL\tKEY")
			for _, c := range v.Columns {
				k, n := "", ""
				if c.Key {
					k = "key"
				}
				if c.NotNull {
					n = "not null"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Name, c.TypeName(), n, k)
			}
			return tw.Flush()
		},
	}
	show.Flags().StringVar(&version, "version", "latest", "the version: a number, latest or latest-<n>")
	diff := &cobra.Command{
		Use:   "diff <schema>.<table> [<from> [<to>]]",
		Short: "Compare two versions of a table (default: the one before the latest, and the latest)",
		Args:  cobra.RangeArgs(1, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			sch, tbl, err := table(args[0])
			if err != nil {
				return err
			}
			from, to := "latest-1", "latest"
			if len(args) > 1 {
				from = args[1]
			}
			if len(args) > 2 {
				to = args[2]
			}
			reg, src, ctx, cancel, done, err := open(cmd, true)
			if err != nil {
				return err
			}
			defer done()
			defer cancel()
			a, err := get(ctx, reg, src, sch, tbl, from)
			if err != nil {
				return err
			}
			b, err := get(ctx, reg, src, sch, tbl, to)
			if err != nil {
				return err
			}
			d := schema.Compare(a, b)
			if asJSON {
				return json.NewEncoder(stdout).Encode(d)
			}
			fmt.Fprintf(stdout, "%s %s.%s version %d → %d\n", src, sch, tbl, a.Version, b.Version)
			for _, c := range d.Added {
				fmt.Fprintf(stdout, "+ %s %s\n", c.Name, c.TypeName())
			}
			for _, c := range d.Dropped {
				fmt.Fprintf(stdout, "- %s %s\n", c.Name, c.TypeName())
			}
			for _, r := range d.Retyped {
				fmt.Fprintf(stdout, "~ %s %s → %s\n", r.Name, r.From, r.To)
			}
			for _, c := range d.Changed {
				from, to := c.From, c.To
				if c.What == "modifier" {
					from, to = orNone(from), orNone(to)
				}
				fmt.Fprintf(stdout, "~ %s %s: %s → %s\n", c.Name, strings.ReplaceAll(c.What, "_", " "), from, to)
			}
			if d.KeyChanged {
				fmt.Fprintf(stdout, "key: %s → %s\n", strings.Join(d.KeyBefore, ", "), strings.Join(d.KeyAfter, ", "))
			}
			if d.ReplicaIdentityChanged {
				fmt.Fprintf(stdout, "replica identity: %s → %s\n", a.ReplicaIdentity, b.ReplicaIdentity)
			}
			fmt.Fprintf(stdout, "breaking: %t\n", d.Breaking)
			return nil
		},
	}
	root.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")
	root.AddCommand(ls, show, diff)
	return root
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
