package deploy_test

// The monitoring artefacts: the Grafana dashboard and the Prometheus alert
// rules. promtool (Debian's prometheus package, installed by
// scripts/deps.sh) checks and unit-tests the rules and parses every
// dashboard query. That the metrics they use exist is checked against a
// running bridge in bridge/e2e (TestMonitoringMetricsExist).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	dashboardPath  = "grafana/bridge-dashboard.json"
	alertsPath     = "prometheus/alerts.yaml"
	alertTestsPath = "prometheus/alerts_test.yaml"
	// runbookBase is where the alerts' runbook_url point: the operations
	// guide's "Alerts and what to do".
	runbookBase = "https://github.com/bridgecdc/bridge/blob/main/docs/operations.md"
)

// promtool runs promtool with args in dir and returns its output; it fails
// the test when promtool is missing (never skips: CI installs it) or exits
// non-zero.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is needed to check the alert rules and dashboard queries: run scripts/deps.sh, or apt-get install prometheus")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// ---------------------------------------------------------------------------
// Alert rules

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleTests struct {
	RuleFiles          []string `yaml:"rule_files"`
	EvaluationInterval string   `yaml:"evaluation_interval"`
	Tests              []struct {
		Interval      string `yaml:"interval"`
		InputSeries   []any  `yaml:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// decodeFile decodes the one YAML document of the file at path strictly
// into out.
func decodeFile(t *testing.T, path string, out any) {
	t.Helper()
	docs := documents(t, path)
	require.Len(t, docs, 1, path)
	decodeStrict(t, docs[0], out, path)
}

// TestAlertRules checks alerts.yaml with promtool, runs its unit tests,
// and checks every alert's labels and annotations: a severity, a summary
// and a description, and a runbook_url pointing at a heading of
// docs/operations.md; and that alerts_test.yaml has, for every alert, a
// case where it fires and one where it does not.
func TestAlertRules(t *testing.T) {
	out := promtool(t, ".", "check", "rules", alertsPath)
	require.Contains(t, out, "SUCCESS", out)
	out = promtool(t, filepath.Dir(alertsPath), "test", "rules", filepath.Base(alertTestsPath))
	require.Contains(t, out, "SUCCESS", out)

	var rf ruleFile
	decodeFile(t, alertsPath, &rf)
	require.NotEmpty(t, rf.Groups)
	heads := anchors(t, filepath.Join(root, "docs", "operations.md"))
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: only alerting rules here", g.Name)
			require.False(t, alerts[r.Alert], "alert %s defined twice", r.Alert)
			alerts[r.Alert] = true
			require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], "%s: severity", r.Alert)
			keys := make([]string, 0, len(r.Annotations))
			for k := range r.Annotations {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			require.Equal(t, []string{"description", "runbook_url", "summary"}, keys, "%s: annotations", r.Alert)
			anchor := strings.ToLower(r.Alert)
			require.Equal(t, runbookBase+"#"+anchor, r.Annotations["runbook_url"], "%s: runbook_url", r.Alert)
			require.True(t, heads[anchor], "%s: docs/operations.md has no heading %q for its runbook_url", r.Alert, r.Alert)
			if strings.Contains(r.Expr, "bridge_") {
				require.Contains(t, r.Annotations["description"], "{{ $labels.source }}", "%s: the description names the source", r.Alert)
			}
			if strings.Contains(r.Expr, "bridge_slot_") {
				require.Contains(t, r.Annotations["description"], "{{ $labels.slot }}", "%s: the description names the slot", r.Alert)
			}
		}
	}
	for _, want := range []string{"BridgeDown", "BridgePipelineNotReady", "BridgeLagBytesGrowing", "BridgeLagHigh",
		"BridgeCheckpointStale", "BridgeSlotRetainingWAL", "BridgeSlotNearInvalidation", "BridgeSlotLost", "BridgeSlotMissing",
		"BridgeSinkWriteErrors"} {
		require.True(t, alerts[want], "alert %s is missing", want)
	}

	var rt ruleTests
	decodeFile(t, alertTestsPath, &rt)
	require.Equal(t, []string{filepath.Base(alertsPath)}, rt.RuleFiles)
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			require.True(t, alerts[a.Alertname], "%s tests alert %q, which alerts.yaml does not define", alertTestsPath, a.Alertname)
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for a := range alerts {
		require.True(t, fires[a], "%s has no case where %s fires", alertTestsPath, a)
		require.True(t, silent[a], "%s has no case where %s stays silent", alertTestsPath, a)
	}
}

// ---------------------------------------------------------------------------
// Grafana dashboard

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gridPos struct {
	H, W, X, Y int
}

type panel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	GridPos     *gridPos        `json:"gridPos"`
	Datasource  *dsRef          `json:"datasource"`
	Collapsed   bool            `json:"collapsed"`
	Panels      []panel         `json:"panels"`
	FieldConfig json.RawMessage `json:"fieldConfig"`
	Targets     []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		Datasource   *dsRef `json:"datasource"`
	} `json:"targets"`
}

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	ID            *int   `json:"id"`
	Editable      bool   `json:"editable"`
	Time          struct {
		From, To string
	} `json:"time"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Definition string `json:"definition"`
			Datasource *dsRef `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

// grafanaBuiltins are Grafana's global variables a query may use.
var grafanaBuiltins = map[string]string{"__rate_interval": "1m", "__interval": "30s", "__range": "1h"}

// TestGrafanaDashboard checks what Grafana needs to import the dashboard
// and what makes it work with any Prometheus: a uid and title, a schema
// version of Grafana 9 or later, the datasource variable every panel and
// query points at, a source variable from label_values, panels on the
// 24-column grid without overlaps, and targets with a refId and an expr.
// Every expr, with the variables filled in, must parse: promtool checks
// them as recording rules.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	require.NoError(t, dec.Decode(&d))
	require.Regexp(t, `^[a-zA-Z0-9_-]{1,40}$`, d.UID)
	require.NotEmpty(t, d.Title)
	require.GreaterOrEqual(t, d.SchemaVersion, 36)
	require.Nil(t, d.ID, "id must be null: Grafana assigns it on import")
	require.Equal(t, "now-1h", d.Time.From)

	// Variables: the datasource first (the others query it), then label_values.
	vars := map[string]string{}
	require.NotEmpty(t, d.Templating.List)
	ds := d.Templating.List[0]
	require.Equal(t, "datasource", ds.Name)
	require.Equal(t, "datasource", ds.Type)
	require.Equal(t, "prometheus", ds.Query)
	for _, v := range d.Templating.List[1:] {
		require.Equal(t, "query", v.Type, "variable %s", v.Name)
		require.Equal(t, &dsRef{Type: "prometheus", UID: "${datasource}"}, v.Datasource, "variable %s queries the datasource variable", v.Name)
		require.Regexp(t, `^label_values\(`, v.Definition, "variable %s", v.Name)
		// A string query: every Grafana version since 7 reads it.
		require.Equal(t, v.Definition, v.Query, "variable %s: query and definition agree", v.Name)
		vars[v.Name] = ".*"
	}
	require.Contains(t, vars, "source")
	for _, v := range d.Templating.List {
		if v.Name == "source" {
			require.Regexp(t, `^label_values\(bridge_[a-z_]+(\{[^}]*\})?, source\)$`, v.Definition)
		}
	}

	// Panels.
	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		if p.Type == "row" && p.Collapsed {
			all = append(all, p.Panels...)
		}
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	varRE := regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)
	queries := 0
	for _, p := range all {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		require.Positive(t, p.ID, where)
		require.False(t, ids[p.ID], "%s: id used twice", where)
		ids[p.ID] = true
		require.NotEmpty(t, p.Title, where)
		require.NotNil(t, p.GridPos, "%s: gridPos", where)
		g := *p.GridPos
		require.True(t, g.W >= 1 && g.H >= 1 && g.X >= 0 && g.Y >= 0 && g.X+g.W <= 24, "%s: gridPos %+v off the 24-column grid", where, g)
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				other, dup := taken[cell{x, y}]
				require.False(t, dup, "%s overlaps %s at (%d, %d)", where, other, x, y)
				taken[cell{x, y}] = where
			}
		}
		if p.Type == "row" {
			require.Empty(t, p.Targets, where)
			continue
		}
		require.Contains(t, []string{"timeseries", "stat", "state-timeline", "bargauge", "heatmap"}, p.Type, where)
		require.NotEmpty(t, p.Description, "%s: a description says what the panel shows", where)
		require.Equal(t, &dsRef{Type: "prometheus", UID: "${datasource}"}, p.Datasource, "%s: datasource", where)
		require.NotEmpty(t, p.Targets, where)
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			require.Regexp(t, `^[A-Z]$`, tg.RefID, where)
			require.False(t, refs[tg.RefID], "%s: refId %s twice", where, tg.RefID)
			refs[tg.RefID] = true
			require.NotEmpty(t, tg.Expr, "%s target %s: expr", where, tg.RefID)
			require.NotEmpty(t, tg.LegendFormat, "%s target %s: legendFormat", where, tg.RefID)
			require.Equal(t, &dsRef{Type: "prometheus", UID: "${datasource}"}, tg.Datasource, "%s target %s: datasource", where, tg.RefID)
			expr := varRE.ReplaceAllStringFunc(tg.Expr, func(m string) string {
				name := varRE.FindStringSubmatch(m)[1]
				if v, ok := vars[name]; ok {
					return v
				}
				v, ok := grafanaBuiltins[name]
				require.True(t, ok, "%s target %s: variable $%s is not defined", where, tg.RefID, name)
				return v
			})
			fmt.Fprintf(&rules, "      - record: dashboard:panel_%d:%s\n        expr: %q\n", p.ID, tg.RefID, expr)
			queries++
		}
		// The overrides by query name a query that exists.
		for _, ref := range regexp.MustCompile(`"id":\s*"byFrameRefID",\s*"options":\s*"([A-Z])"`).FindAllSubmatch(p.FieldConfig, -1) {
			require.True(t, refs[string(ref[1])], "%s: an override names query %s, which the panel lacks", where, ref[1])
		}
	}
	gridRows := map[int]bool{}
	for c := range taken {
		gridRows[c.y] = true
	}
	require.Len(t, taken, 24*len(gridRows), "the grid has holes: every row of the dashboard is filled")

	// The panels the dashboard must have.
	var titles []string
	for _, p := range all {
		titles = append(titles, p.Title)
	}
	for _, want := range []string{"Changes routed per second", "Transactions and delivered changes per second", "Lag (bytes)", "Lag (seconds)",
		"Checkpoint age", "Retained WAL vs max_slot_wal_keep_size", "Restarts and errors", "Publish latency", "Snapshot progress",
		"Feed requests per second", "Feed delivery latency"} {
		require.Contains(t, titles, want)
	}

	// Every query parses.
	p := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	require.NoError(t, os.WriteFile(p, []byte(rules.String()), 0o644))
	out := promtool(t, ".", "check", "rules", p)
	require.Contains(t, out, fmt.Sprintf("SUCCESS: %d rules found", queries), out)
}
