package cli

// `bridge validate`: the configuration alone (every error at once, each
// naming its YAML path), and with --connect everything `bridge run`
// checks at start, against the real servers, printed as a checklist.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/status"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

func newValidateCommand(load func(...app.Option) (*config.Config, *app.App, error), printErrs func(error) error, stdout io.Writer, cfgPath *string, opts []app.Option) *cobra.Command {
	var connect bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check bridge.yaml, every plugin block and every route; with --connect, the servers too",
		Long: `Check bridge.yaml: every key, every plugin block, every route (its template
renders, and its subjects stay within the subjects of the stream it writes to)
and exit 1 listing every error, each with its YAML path.

With --connect, also check against the servers, changing nothing, what
"bridge run" checks at start, printed as a checklist (ok, warn or FAIL, with
the fix): for each source, the DSN, the role and its REPLICATION privilege,
wal_level, a replication connection, the slot and its plugin, the publication
and its tables, the replica identity of the streamed tables, the columns
the subject templates read, and each route's filter, columns, mask and
transform against the columns and types of the tables it takes; for each sink, the connection, JetStream, the
stream (or what run will create or update), and that its user may publish the
routes' subjects into it; the checkpoint bucket. What run would create
(publication, slot, stream, bucket) is reported, not created. Exit 1 when a
check failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := load()
			if err != nil {
				return printErrs(err)
			}
			fmt.Fprintf(stdout, "%s: ok (%d sources, %d sinks, %d routes)\n", *cfgPath, len(cfg.Sources), len(cfg.Sinks), len(cfg.Routes))
			if !connect {
				return nil
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			secs := connectChecks(ctx, cfg, opts)
			failed, warned := printChecks(stdout, secs)
			switch {
			case failed > 0:
				fmt.Fprintf(stdout, "\n%s: %s failed, %s; `bridge run` would stop\n", *cfgPath, plural(failed, "check"), plural(warned, "warning"))
				return fmt.Errorf("%s failed against the servers: the checklist's FAIL lines say what and the fix", plural(failed, "check"))
			case warned > 0:
				fmt.Fprintf(stdout, "\n%s: every check passed, with %s\n", *cfgPath, plural(warned, "warning"))
			default:
				fmt.Fprintf(stdout, "\n%s: every check passed\n", *cfgPath)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&connect, "connect", false, "also check the setup against PostgreSQL and NATS, changing nothing")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "with --connect: the time all checks may take")
	return cmd
}

// section is the checks of one source, sink or the checkpoint bucket.
type section struct {
	title  string
	checks []config.Check
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// printChecks prints secs as a checklist and counts failures and warnings.
func printChecks(w io.Writer, secs []section) (failed, warned int) {
	for _, s := range secs {
		fmt.Fprintf(w, "\n%s\n", s.title)
		for _, c := range s.checks {
			fmt.Fprintf(w, "  %-4s  %s\n", c.Status, c.What)
			if c.Fix != "" && c.Status != config.CheckOK {
				fmt.Fprintf(w, "        fix: %s\n", c.Fix)
			}
			switch c.Status {
			case config.CheckFail:
				failed++
			case config.CheckWarn:
				warned++
			}
		}
	}
	return failed, warned
}

// connectChecks runs every check of `validate --connect`: the bridge's
// NATS server and checkpoint bucket first (the checkpoints tell the
// sources how to judge a missing slot), then each source, then each sink.
func connectChecks(ctx context.Context, cfg *config.Config, opts []app.Option) []section {
	sinkReg, srcReg := app.Registries(opts...)
	log := slog.New(slog.DiscardHandler)
	ne, natsSec := bridgeNATS(cfg)
	froms, lineages := map[string]cdc.LSN{}, map[string]sources.Lineage{}
	if ne.URL != "" {
		natsSec.checks = append(natsSec.checks, checkpointChecks(ctx, cfg, ne, froms, lineages)...)
	}
	secs := []section{natsSec}
	patterns := route.SubjectPatterns(cfg)

	for _, name := range slices.Sorted(maps.Keys(cfg.Sources)) {
		sc := cfg.Sources[name]
		sec := section{title: fmt.Sprintf("source %s (%s)", name, sc.Type)}
		p, err := srcReg.Lookup(sc.Type)
		if err != nil {
			continue // load reported it
		}
		src, err := p.New(cfg.Decoder("sources."+name+".config", sc.Config), sources.Env{Name: name, Logger: log})
		if err != nil {
			continue
		}
		if ch, ok := src.(sources.Checker); ok {
			sec.checks = ch.Check(ctx, sources.CheckRequest{From: froms[name], Lineage: lineages[name], Columns: columnUses(cfg, name),
				Tables: func(rels []*cdc.Relation) []config.Check { return route.CheckTables(cfg, name, rels) }})
		} else {
			sec.checks = []config.Check{{Status: config.CheckWarn, What: fmt.Sprintf("not checked: source type %s has no checks", sc.Type)}}
		}
		_ = src.Close(ctx)
		secs = append(secs, sec)
	}

	sinkNames := slices.Sorted(maps.Keys(cfg.Sinks))
	for _, name := range sinkNames {
		sc := cfg.Sinks[name]
		sec := section{title: fmt.Sprintf("sink %s (%s)", name, sc.Type)}
		p, err := sinkReg.Lookup(sc.Type)
		if err != nil {
			continue
		}
		s, err := p.New(cfg.Decoder("sinks."+name+".config", sc.Config), sinks.Env{Name: name, Logger: log, NATS: ne})
		if err != nil {
			continue
		}
		ch, ok := s.(sinks.Checker)
		switch {
		case !ok:
			sec.checks = []config.Check{{Status: config.CheckWarn, What: fmt.Sprintf("not checked: sink type %s has no checks", sc.Type)}}
		case ne.URL == "" && usesBridgeNATS(sc):
			sec.checks = []config.Check{{Status: config.CheckWarn, What: "not checked: it uses the embedded NATS server, which is not running (see above)"}}
		default:
			sec.checks = ch.Check(ctx, sinks.CheckRequest{Subjects: subjectUses(cfg, patterns, name)})
		}
		// What a crash of the bridge means for it (docs/exactly-once.md).
		g := config.Check{Status: config.CheckOK}
		kind, why := sinks.Guarantee(s)
		if kind == "at least once" {
			g.Status = config.CheckWarn
			g.Fix = "implement sinks.Resumer in the sink (docs/custom-sinks.md), or drop repeated ids at the destination"
		}
		g.What = "delivery: " + kind + ": " + why
		sec.checks = append(sec.checks, g)
		_ = s.Close(ctx)
		secs = append(secs, sec)
	}
	return secs
}

// usesBridgeNATS reports whether a sink block leaves url empty, so that it
// uses the bridge's NATS connection.
func usesBridgeNATS(sc config.Sink) bool {
	u, _ := sc.Config["url"].(string)
	return u == ""
}

// bridgeNATS finds the bridge's NATS server: nats.url, or the embedded
// server of a running bridge (status.FindNATS). ne.URL is empty when there
// is nothing to check.
func bridgeNATS(cfg *config.Config) (sinks.NATSEnv, section) {
	n := cfg.NATS
	ne := sinks.NATSEnv{URL: n.URL, NATSClient: n.NATSClient}
	sec := section{title: "NATS (nats.url) and checkpoint bucket " + cfg.Checkpoint.Bucket}
	if n.URL == "" && n.Context != "" {
		sec.title = "NATS (nats.context) and checkpoint bucket " + cfg.Checkpoint.Bucket
		ne.URL = natsconn.Env(ne).URL
	}
	if ne.URL != "" {
		return ne, sec
	}
	sec.title = "embedded NATS (nats.url is empty) and checkpoint bucket " + cfg.Checkpoint.Bucket
	found, err := status.FindNATS(cfg)
	if err != nil {
		store := n.Embedded.StoreDir
		if store == "" {
			store = filepath.Join(cfg.DataDir, "nats")
		}
		sec.checks = append(sec.checks, config.Check{Status: config.CheckOK,
			What: fmt.Sprintf("no bridge is running with this data_dir: `bridge run` starts its embedded NATS server (store %s) and creates the streams and the bucket in it; they are checked while it runs", store)})
		return sinks.NATSEnv{}, sec
	}
	return found, sec
}

// checkpointChecks checks the bridge's NATS server and the checkpoint
// bucket, and records each source's checkpoint in froms and the lineage
// recorded with it in lineages.
func checkpointChecks(ctx context.Context, cfg *config.Config, ne sinks.NATSEnv, froms map[string]cdc.LSN, lineages map[string]sources.Lineage) []config.Check {
	p, err := natsconn.DialProbe(ctx, natsconn.Env(ne))
	if err != nil {
		fix := "check nats.url and the credentials (nats.creds, user, password, token)"
		var explained *natsconn.Error
		switch msg := strings.ToLower(err.Error()); {
		case errors.As(err, &explained):
			fix = "" // the error says it
		case strings.Contains(msg, "authorization"), strings.Contains(msg, "authentication"):
			fix = "check the credentials: nats.creds, user, password or token"
		case strings.Contains(msg, "no servers available"), strings.Contains(msg, "connection refused"):
			fix = fmt.Sprintf("is nats-server running at %s? (nats.url)", config.Redact(ne.URL))
		}
		if cfg.NATS.RunsEmbedded() {
			fix = fmt.Sprintf("something that is not a NATS server listens at %s, so `bridge run` cannot start its embedded server there: stop it, or set nats.embedded.port", strings.TrimPrefix(ne.URL, "nats://"))
		}
		return []config.Check{{Status: config.CheckFail, What: config.Redact(err.Error()), Fix: fix}}
	}
	defer p.Close()
	out := []config.Check{{Status: config.CheckOK, What: fmt.Sprintf("connected to NATS at %s (server %s, nats-server %s)", config.Redact(ne.URL), p.NC.ConnectedServerName(), p.NC.ConnectedServerVersion())}}
	if cfg.NATS.RunsEmbedded() {
		out[0].What += "; the bridge (or another server) is running there"
	}
	js, err := jetstream.New(p.NC)
	if err != nil {
		return append(out, config.Check{Status: config.CheckFail, What: fmt.Sprintf("opening JetStream: %v", err)})
	}
	bucket := cfg.Checkpoint.Bucket
	kv, err := js.KeyValue(ctx, bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		if cfg.Checkpoint.Replicas > 1 && p.NC.ConnectedClusterName() == "" {
			out = append(out, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("checkpoint.replicas is %d, but the NATS server is not clustered: bucket %q cannot have %d replicas", cfg.Checkpoint.Replicas, bucket, cfg.Checkpoint.Replicas),
				Fix:  "set checkpoint.replicas: 1, or connect to a cluster"})
		}
		return append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("checkpoint bucket %q does not exist yet: `bridge run` creates it", bucket)})
	case err != nil:
		c := config.Check{Status: config.CheckFail, What: fmt.Sprintf("reading checkpoint bucket %q: %v", bucket, err)}
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			c.Fix = "start nats-server with -js (or jetstream {} in its config), or enable JetStream for the account"
		}
		if d := p.Denied(true); len(d) > 0 {
			c.What = fmt.Sprintf("reading checkpoint bucket %q: permission denied on %s", bucket, d[0])
			c.Fix = "allow the bridge's NATS user to publish to $JS.API.> and $KV." + bucket + ".> and to subscribe to _INBOX.>"
		}
		return append(out, c)
	}
	out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("checkpoint bucket %q exists", bucket)})
	var keys []string
	for _, src := range slices.Sorted(maps.Keys(cfg.Sources)) {
		key := checkpoint.Key(cfg.Name, src)
		keys = append(keys, "$KV."+bucket+"."+key)
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("source %s has no checkpoint yet (key %s): its first run starts a new epoch", src, key)})
		case err != nil:
			out = append(out, config.Check{Status: config.CheckFail, What: fmt.Sprintf("reading the checkpoint of source %s (key %s): %v", src, key, err)})
		default:
			var st checkpoint.State
			if err := json.Unmarshal(e.Value(), &st); err != nil {
				out = append(out, config.Check{Status: config.CheckFail,
					What: fmt.Sprintf("the checkpoint of source %s (key %s, revision %d) does not decode: %v", src, key, e.Revision(), err),
					Fix:  fmt.Sprintf("nats kv del %s %s (the next run starts a new epoch)", bucket, key)})
				continue
			}
			froms[src] = st.LSN
			lineages[src] = sources.Lineage{SystemID: st.SystemID, Timeline: st.Timeline, Standby: st.Standby}
			out = append(out, config.Check{Status: config.CheckOK,
				What: fmt.Sprintf("source %s's checkpoint (key %s): %s, epoch %s, saved %s", src, key, st.LSN, st.Epoch, st.UpdatedAt.UTC().Format(time.RFC3339))})
		}
	}
	res, err := p.TryPublish(ctx, "KV_"+bucket, keys)
	if err != nil {
		return append(out, config.Check{Status: config.CheckFail, What: fmt.Sprintf("probing the checkpoint keys: %v", err)})
	}
	for _, k := range keys {
		if res[k].Outcome == natsconn.Denied {
			out = append(out, config.Check{Status: config.CheckFail, What: "permission denied on " + k,
				Fix: "allow the bridge's NATS user to publish to $KV." + bucket + ".>"})
		}
	}
	return out
}

// columnUses lists, for source src, the columns each route's subject
// template reads, with the tables it matches. Routes that take no row
// changes (only messages, truncates or control messages) read no columns.
// Tables an earlier route takes whole (no ops filter) never reach a later
// route, so a route after a catch-all one reads nothing.
func columnUses(cfg *config.Config, src string) []sources.ColumnUse {
	var out []sources.ColumnUse
	var shadow []string // table globs earlier routes take whole
	all := false        // an earlier route takes every change of src
	for i, rc := range cfg.Routes {
		if len(rc.Match.Sources) > 0 && !slices.Contains(rc.Match.Sources, src) {
			continue
		}
		subj := rc.Subject
		if subj == "" {
			subj = "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"
		}
		cols, keys := route.RowRefs(subj)
		rows := len(rc.Match.Ops) == 0 || slices.ContainsFunc(rc.Match.Ops, func(op string) bool {
			return op == string(cdc.OpInsert) || op == string(cdc.OpUpdate) || op == string(cdc.OpDelete) || op == string(cdc.OpRead)
		})
		if len(cols)+len(keys) > 0 && rows && !all {
			out = append(out, sources.ColumnUse{Route: fmt.Sprintf("routes[%d].subject", i), Tables: rc.Match.Tables, Col: cols, Key: keys, Skip: slices.Clone(shadow)})
		}
		if len(rc.Match.Ops) == 0 {
			if len(rc.Match.Tables) == 0 {
				all = true
			}
			shadow = append(shadow, rc.Match.Tables...)
		}
	}
	return out
}

// subjectUses lists the subjects the routes give sink's changes and
// control messages, each route's once.
func subjectUses(cfg *config.Config, patterns []route.Patterns, sink string) []sinks.SubjectUse {
	var out []sinks.SubjectUse
	for _, p := range patterns {
		if !slices.Contains(cfg.Routes[p.Route].Sinks, sink) {
			continue
		}
		r := fmt.Sprintf("routes[%d].subject", p.Route)
		var subs, ctl []string
		for _, src := range sortedSources(p) {
			for _, s := range p.Data[src] {
				if !slices.Contains(subs, s) {
					subs = append(subs, s)
				}
			}
		}
		for _, src := range sortedSources(p) {
			if s, ok := p.Control[src][sink]; ok && !slices.Contains(ctl, s) && !slices.ContainsFunc(subs, func(pat string) bool { return route.Within(s, pat) }) {
				ctl = append(ctl, s)
			}
		}
		for _, s := range subs {
			out = append(out, sinks.SubjectUse{Route: r, Subject: s})
		}
		for _, s := range ctl {
			out = append(out, sinks.SubjectUse{Route: r + " (control messages)", Subject: s})
		}
	}
	return out
}

func sortedSources(p route.Patterns) []string {
	var out []string
	for s := range p.Data {
		out = append(out, s)
	}
	for s := range p.Control {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
