package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/internal/pgtest"
)

// The monitoring artefacts, relative to this package.
const (
	dashboardFile = "../../deploy/grafana/bridge-dashboard.json"
	alertsFile    = "../../deploy/prometheus/alerts.yaml"
)

// selector is one series selector of a PromQL expression: a metric name
// and the label names its matchers use.
type selector struct {
	metric string
	labels []string
}

// promqlKeywords are the identifiers of PromQL that are neither metrics nor
// functions called with parentheses right after them.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
	// aggregations, which may be followed by a by/without clause
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// labelLists are the keywords followed by a parenthesised list of label
// names.
var labelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlSelectors returns the series selectors of a PromQL expression: a
// small lexer, enough for the expressions of the dashboard and the alert
// rules (promtool checks that they parse). Identifiers followed by "(" are
// functions; label lists, matchers, ranges and strings are skipped.
func promqlSelectors(expr string) ([]selector, error) {
	var out []selector
	isStart := func(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
	isPart := func(c byte) bool { return isStart(c) || (c >= '0' && c <= '9') }
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n' || expr[i] == '\r') {
			i++
		}
		return i
	}
	// skipString returns the index after the string literal at i.
	skipString := func(i int) (int, error) {
		q := expr[i]
		for j := i + 1; j < len(expr); j++ {
			if expr[j] == '\\' && q != '`' {
				j++
				continue
			}
			if expr[j] == q {
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d in %q", i, expr)
	}
	// until returns the index after the first close at or after i, outside
	// strings.
	until := func(i int, close byte) (int, error) {
		for j := i; j < len(expr); j++ {
			switch expr[j] {
			case '"', '\'', '`':
				k, err := skipString(j)
				if err != nil {
					return 0, err
				}
				j = k - 1
			case close:
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("no %q after %d in %q", close, i, expr)
	}
	// matchers returns the label names of the matchers in expr[i:j].
	matchers := func(s string) []string {
		var names []string
		for _, m := range regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`+"`[^`]*`"+`)`).FindAllStringSubmatch(s, -1) {
			names = append(names, m[1])
		}
		return names
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := until(i, ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{': // a selector without a metric name
			j, err := until(i, '}')
			if err != nil {
				return nil, err
			}
			i = j
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '$': // a Grafana variable
			i++
			for i < len(expr) && isPart(expr[i]) {
				i++
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			name := expr[i:j]
			k := skipSpace(j)
			switch {
			case labelLists[name]:
				if k < len(expr) && expr[k] == '(' {
					e, err := until(k, ')')
					if err != nil {
						return nil, err
					}
					k = e
				}
				i = k
			case promqlKeywords[name], k < len(expr) && expr[k] == '(':
				i = j
			default:
				s := selector{metric: name}
				i = j
				if k < len(expr) && expr[k] == '{' {
					e, err := until(k, '}')
					if err != nil {
						return nil, err
					}
					s.labels = matchers(expr[k:e])
					i = e
				}
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out, nil
}

func TestPromQLSelectors(t *testing.T) {
	defer parallel(t)()
	for expr, want := range map[string][]selector{
		`sum by (source, op) (rate(bridge_changes_total{job=~"$job", source=~"$source"}[$__rate_interval]))`: {
			{"bridge_changes_total", []string{"job", "source"}}},
		`histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))`:  {{"x_bucket", nil}},
		`sum(rate(a[5m])) by (job) / on (job) group_left (version) b`: {{"a", nil}, {"b", nil}},
		`time() - x{s="a}b"} > 300 and y > 16 * 1024 * 1024`:          {{"x", []string{"s"}}, {"y", nil}},
		`a{wal_status="lost"} + ignoring(wal_status) 2 * b offset 5m`: {{"a", []string{"wal_status"}}, {"b", nil}},
		`up{job="bridge"} == 0 unless max without (wal_status) (c{k!~'x'})`: {
			{"up", []string{"job"}}, {"c", []string{"k"}}},
		`clamp_max(r / (e > 0), 1e-3) or vector(0)`: {{"r", nil}, {"e", nil}},
	} {
		got, err := promqlSelectors(expr)
		require.NoError(t, err, expr)
		require.Equal(t, want, got, expr)
	}
	_, err := promqlSelectors(`a{b="c}`)
	require.Error(t, err)
}

// monitoringQueries returns the PromQL of the dashboard's targets and of
// the alert rules, each with where it is, and the (metric, label) pairs of
// the dashboard variables' label_values queries.
func monitoringQueries(t *testing.T) (exprs map[string]string, labelValues map[string][2]string) {
	t.Helper()
	exprs, labelValues = map[string]string{}, map[string][2]string{}
	b, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs[fmt.Sprintf("%s: panel %d %q, target %s", filepath.Base(dashboardFile), p.ID, p.Title, tg.RefID)] = tg.Expr
		}
	}
	lv := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := lv.FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
		labelValues[fmt.Sprintf("%s: variable %s", filepath.Base(dashboardFile), v.Name)] = [2]string{m[1], m[3]}
	}

	b, err = os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &rules))
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs[fmt.Sprintf("%s: %s", filepath.Base(alertsFile), r.Alert)] = r.Expr
		}
	}
	require.NotEmpty(t, exprs)
	return exprs, labelValues
}

// synthetic are the series Prometheus adds itself, not in any /metrics.
var synthetic = map[string]bool{"up": true}

// scrapeLabels are the labels Prometheus adds to every scraped series.
var scrapeLabels = map[string]bool{"job": true, "instance": true}

// TestMonitoringMetricsExist runs a bridge against a real Postgres (with
// max_slot_wal_keep_size, so the slot has a safe_wal_size) and NATS: an
// initial snapshot, changes, a run restarted by a terminated walsender, and
// a `bridge serve` feed server answering a long-poll. Then every metric
// that a query of the Grafana dashboard or an alert rule selects must be
// in their /metrics, with the labels the query matches on; every query of
// the dashboard must return data from two of their scrapes (promtool
// evaluates it); and every bridge_* metric they export must be on the
// dashboard: a renamed or a new metric fails here.
func TestMonitoringMetricsExist(t *testing.T) {
	defer parallel(t)()
	exprs, labelValues := monitoringQueries(t)

	e := newEnvWith(t, pgtest.Options{Settings: map[string]string{"max_slot_wal_keep_size": "64MB"}})
	e.pg.ExecT(t, `CREATE TABLE dash (id int PRIMARY KEY, v text)`,
		`INSERT INTO dash SELECT g, 'row ' || g FROM generate_series(1, 100) g`, `ANALYZE dash`)
	p := e.snapConfig("dash", "initial", 20)
	appendYAML(t, p, "telemetry:\n  metrics:\n    slot_poll_interval: 100ms\n")
	r := e.start(p)
	waitSlotActive(t, e, "slot_dash")
	e.waitSnapshotDone("dash", 2*time.Minute, nil)
	e.pg.ExecT(t, `INSERT INTO dash VALUES (101, 'a')`, `UPDATE dash SET v = 'b' WHERE id = 1`, `DELETE FROM dash WHERE id = 2`)
	e.waitStored("CDC_dash", 103, time.Minute)
	base := "http://" + r.app.HTTPAddr()

	// A lost replication connection restarts the run: restarts and errors
	// by cause.
	e.pg.ExecT(t, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'slot_dash'`)
	require.Eventually(t, func() bool {
		v, _ := metricValue(scrape(t, base), "bridge_run_restarts_total", map[string]string{"source": "app"})
		return v >= 1
	}, time.Minute, 50*time.Millisecond)
	waitReady(t, r)

	// `bridge serve` over the same stream answers a long-poll.
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	fs, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_dash"})
	require.NoError(t, err)
	t.Cleanup(fs.Close)
	hs := httptest.NewServer(serve.New(fs, serve.Config{}, testLogger(t)).Handler())
	t.Cleanup(hs.Close)
	resp, body := get(t, hs.URL, url.Values{"token": {"now"}, "timeout": {"300ms"}}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	e.pg.ExecT(t, `INSERT INTO dash VALUES (102, 'c')`)
	resp, body = get(t, hs.URL, url.Values{"token": {body.Token}, "timeout": {"30s"}}, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, body.Changes, 1)

	// scrapeBoth scrapes the bridge and the feed server.
	scrapeBoth := func() map[string]*dto.MetricFamily {
		fams := scrape(t, base)
		for name, f := range scrape(t, hs.URL) {
			if _, dup := fams[name]; !dup { // go_* and process_* are in both
				fams[name] = f
			}
		}
		return fams
	}

	// Every selected metric is exported, with the labels matched on.
	var fams map[string]*dto.MetricFamily
	var missing []string
	check := func() bool {
		fams = scrapeBoth()
		missing = missing[:0]
		for where, expr := range exprs {
			sels, err := promqlSelectors(expr)
			require.NoError(t, err, where)
			require.NotEmpty(t, sels, "%s: no metric in %q", where, expr)
			for _, s := range sels {
				if problem := exported(fams, s); problem != "" {
					missing = append(missing, fmt.Sprintf("%s: %s", where, problem))
				}
			}
		}
		for where, ml := range labelValues {
			if problem := exported(fams, selector{metric: ml[0], labels: []string{ml[1]}}); problem != "" {
				missing = append(missing, fmt.Sprintf("%s: %s", where, problem))
			}
		}
		return len(missing) == 0
	}
	deadline := time.Now().Add(30 * time.Second)
	for !check() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Fatalf("the dashboard and alerts use what the bridge does not export:\n%s", strings.Join(missing, "\n"))
	}

	// Every panel shows data: each query of the dashboard, evaluated by
	// promtool over two scrapes of the bridge and the feed server, returns
	// at least one series (wrong labels in a by clause or an operator's
	// vector matching return none).
	panelsShowData(t, exprs, fams, scrapeBoth())

	// Every bridge_* metric the bridge and the feed server export is on
	// the dashboard.
	charted := map[string]bool{}
	for where, expr := range exprs {
		if !strings.HasPrefix(where, filepath.Base(dashboardFile)) {
			continue
		}
		sels, _ := promqlSelectors(expr)
		for _, s := range sels {
			charted[family(fams, s.metric)] = true
		}
	}
	var uncharted []string
	for name := range fams {
		if strings.HasPrefix(name, "bridge_") && !charted[name] {
			uncharted = append(uncharted, name)
		}
	}
	if len(uncharted) > 0 {
		slices.Sort(uncharted)
		t.Fatalf("no panel of %s shows these metrics of the bridge:\n%s", dashboardFile, strings.Join(uncharted, "\n"))
	}
	t.Logf("%d queries checked against %d metric families", len(exprs)+len(labelValues), len(fams))
}

// family returns the metric family a selected series name belongs to: the
// name itself, or a histogram's or summary's family for its _bucket, _sum
// and _count series.
func family(fams map[string]*dto.MetricFamily, name string) string {
	if _, ok := fams[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f := fams[base]
		if f == nil {
			continue
		}
		if t := f.GetType(); t == dto.MetricType_HISTOGRAM || (t == dto.MetricType_SUMMARY && suffix != "_bucket") {
			return base
		}
	}
	return ""
}

// exported says what is wrong with selector s against the scraped
// families: "" when its metric is exported and some series has every
// label it matches on.
func exported(fams map[string]*dto.MetricFamily, s selector) string {
	if synthetic[s.metric] {
		return ""
	}
	name := family(fams, s.metric)
	if name == "" {
		return fmt.Sprintf("metric %s is not exported", s.metric)
	}
	want := map[string]bool{}
	for _, l := range s.labels {
		if !scrapeLabels[l] {
			want[l] = true
		}
	}
	if s.metric != name && strings.HasSuffix(s.metric, "_bucket") {
		delete(want, "le")
	}
	for _, m := range fams[name].GetMetric() {
		have := map[string]bool{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = true
		}
		ok := true
		for l := range want {
			ok = ok && have[l]
		}
		if ok {
			return ""
		}
	}
	var ls []string
	for l := range want {
		ls = append(ls, l)
	}
	slices.Sort(ls)
	return fmt.Sprintf("no series of %s has all of the labels %v", name, ls)
}

// panelsShowData evaluates every dashboard query of exprs with promtool
// over the series of two scrapes a minute apart (first, then second) and
// fails for each query that returns nothing.
func panelsShowData(t *testing.T, exprs map[string]string, first, second map[string]*dto.MetricFamily) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool evaluates the dashboard's queries: run scripts/deps.sh, or apt-get install prometheus")

	// The series, in promtool's notation: two values, "_" where a scrape
	// lacks the series.
	values := map[string][2]string{}
	for i, fams := range []map[string]*dto.MetricFamily{first, second} {
		for name, f := range fams {
			for _, m := range f.GetMetric() {
				for _, s := range samples(name, f.GetType(), m) {
					v := values[s.series]
					if v[0] == "" {
						v = [2]string{"_", "_"}
					}
					v[i] = s.value
					values[s.series] = v
				}
			}
		}
	}
	type inputSeries struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	var input []inputSeries
	for s, v := range values {
		input = append(input, inputSeries{s, v[0] + " " + v[1]})
	}
	slices.SortFunc(input, func(a, b inputSeries) int { return strings.Compare(a.Series, b.Series) })

	type alertTest struct {
		EvalTime  string           `yaml:"eval_time"`
		Alertname string           `yaml:"alertname"`
		ExpAlerts []map[string]any `yaml:"exp_alerts"`
	}
	type alertRule struct {
		Alert string `yaml:"alert"`
		Expr  string `yaml:"expr"`
	}
	var rules []alertRule
	var tests []alertTest
	names := map[string]string{}
	vars := regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)
	for where, expr := range exprs {
		if !strings.HasPrefix(where, filepath.Base(dashboardFile)) {
			continue
		}
		q := vars.ReplaceAllStringFunc(expr, func(m string) string {
			if strings.Contains(m, "__rate_interval") {
				return "2m"
			}
			return ".*"
		})
		name := fmt.Sprintf("query_%d", len(rules)+1)
		names[name] = where
		rules = append(rules, alertRule{Alert: name, Expr: "count(" + q + ") > 0"})
		tests = append(tests, alertTest{EvalTime: "1m", Alertname: name, ExpAlerts: []map[string]any{{}}})
	}
	slices.SortFunc(rules, func(a, b alertRule) int { return strings.Compare(a.Alert, b.Alert) })
	ruleFile := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	testFile := map[string]any{
		"rule_files":          []string{"rules.yaml"},
		"evaluation_interval": "1m",
		"tests":               []any{map[string]any{"interval": "1m", "input_series": input, "alert_rule_test": tests}},
	}
	dir := t.TempDir()
	for file, v := range map[string]any{"rules.yaml": ruleFile, "tests.yaml": testFile} {
		b, err := yaml.Marshal(v)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), b, 0o644))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		var empty []string
		for _, m := range regexp.MustCompile(`alertname: (query_[0-9]+),`).FindAllStringSubmatch(string(out), -1) {
			empty = append(empty, names[m[1]])
		}
		slices.Sort(empty)
		t.Fatalf("dashboard queries that return nothing on a running bridge (variables set to .*, $__rate_interval to 2m):\n%s\n\npromtool: %v\n%s",
			strings.Join(empty, "\n"), err, out)
	}
	t.Logf("%d dashboard queries return data over %d series", len(rules), len(input))
}

type sample struct{ series, value string }

// samples returns the series of metric m of family name as the text
// exposition writes them (a histogram's _bucket, _sum and _count), each
// with the labels job and instance a scrape adds.
func samples(name string, typ dto.MetricType, m *dto.Metric) []sample {
	labels := []string{`job="bridge"`, `instance="bridge:8080"`}
	for _, lp := range m.GetLabel() {
		labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
	}
	series := func(n string, extra ...string) string {
		return n + "{" + strings.Join(append(slices.Clone(labels), extra...), ", ") + "}"
	}
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	switch typ {
	case dto.MetricType_COUNTER:
		return []sample{{series(name), num(m.GetCounter().GetValue())}}
	case dto.MetricType_GAUGE:
		return []sample{{series(name), num(m.GetGauge().GetValue())}}
	case dto.MetricType_UNTYPED:
		return []sample{{series(name), num(m.GetUntyped().GetValue())}}
	case dto.MetricType_HISTOGRAM:
		h := m.GetHistogram()
		out := []sample{{series(name + "_sum"), num(h.GetSampleSum())}, {series(name + "_count"), num(float64(h.GetSampleCount()))}}
		for _, b := range h.GetBucket() {
			out = append(out, sample{series(name+"_bucket", fmt.Sprintf("le=%q", num(b.GetUpperBound()))), num(float64(b.GetCumulativeCount()))})
		}
		return append(out, sample{series(name+"_bucket", `le="+Inf"`), num(float64(h.GetSampleCount()))})
	case dto.MetricType_SUMMARY:
		sm := m.GetSummary()
		out := []sample{{series(name + "_sum"), num(sm.GetSampleSum())}, {series(name + "_count"), num(float64(sm.GetSampleCount()))}}
		for _, q := range sm.GetQuantile() {
			out = append(out, sample{series(name, fmt.Sprintf("quantile=%q", num(q.GetQuantile()))), num(q.GetValue())})
		}
		return out
	}
	return nil
}
