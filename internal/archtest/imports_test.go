package archtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/bridgecdc/bridge/"

// rule forbids packages matching from (but not except) to import packages
// matching to (but not allow). Patterns are module-relative: "x" is the
// package x, "x/..." is x and every package below it, "*" is every
// package of the module.
type rule struct {
	from, except, to, allow []string
	why                     string
}

var rules = []rule{
	{from: []string{"bridge/cdc"}, to: []string{"*"},
		why: "the change model is a leaf: everything imports it, it imports nothing of ours"},
	{from: []string{"config"}, to: []string{"*"},
		why: "config is read by every plugin and the runtime; it imports nothing of ours"},
	{from: []string{"sources/...", "sinks/...", "plugins/..."}, to: []string{"bridge/..."}, allow: []string{"bridge/cdc"},
		why: "sources and sinks implement contracts; they never import the runtime (only the change model)"},
	{from: []string{"bridge/..."}, to: []string{"sources/...", "sinks/...", "plugins/..."}, allow: []string{"sources", "sinks"},
		why: "the runtime knows plugins by their contracts and registries, never by their packages"},
	{from: []string{"bridge/pipeline", "bridge/route", "bridge/snapshot"},
		to:  []string{"bridge/telemetry", "bridge/app", "bridge/cli", "bridge/serve", "bridge/status", "bridge/control", "bridge"},
		why: "the data path knows nothing of telemetry, wiring, the control plane or commands (telemetry observes it through pipeline.Observer)"},
	{from: []string{"bridge/control"}, to: []string{"bridge/...", "sources/...", "sinks/...", "plugins/...", "config"},
		why: "the control plane speaks NATS and its own types; it knows the bridge only through control.Bridge, which the App implements"},
	{from: []string{"bridge/telemetry", "bridge/serve", "bridge/status", "bridge/feeds", "bridge/format", "bridge/checkpoint", "bridge/retry", "bridge/pgslot"},
		to:  []string{"bridge/pipeline", "bridge/app", "bridge/cli", "bridge"},
		why: "services and helpers sit below the wiring and the data path"},
	{from: []string{"*"}, except: []string{"bridge", "bridge/cli", "cmd/...", "bench/..."}, to: []string{"bridge/cli", "bridge"},
		why: "the command line is the top: only binaries and the entry point import it"},
}

// match reports whether pkg (module-relative) matches one of pats.
func match(pkg string, pats []string) bool {
	for _, p := range pats {
		switch {
		case p == "*":
			return true
		case strings.HasSuffix(p, "/..."):
			base := strings.TrimSuffix(p, "/...")
			if pkg == base || strings.HasPrefix(pkg, base+"/") {
				return true
			}
		case pkg == p:
			return true
		}
	}
	return false
}

// violations returns a line per import that breaks a rule; imports maps a
// module-relative package to its module-relative imports of ours.
func violations(imports map[string][]string) []string {
	var out []string
	for _, pkg := range slices.Sorted(maps.Keys(imports)) {
		for _, imp := range imports[pkg] {
			for _, r := range rules {
				if match(pkg, r.from) && !match(pkg, r.except) && match(imp, r.to) && !match(imp, r.allow) && pkg != imp {
					out = append(out, fmt.Sprintf("%s imports %s: %s", pkg, imp, r.why))
				}
			}
		}
	}
	return out
}

// moduleImports lists the non-test imports of ours of every package of the
// module.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...")
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	imports := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		require.NoError(t, dec.Decode(&p))
		rel := strings.TrimPrefix(p.ImportPath, module)
		imports[rel] = []string{}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module) {
				imports[rel] = append(imports[rel], strings.TrimPrefix(imp, module))
			}
		}
	}
	return imports
}

// TestImportRules fails when a package of the module imports what its
// layer must not (ARCHITECTURE.md).
func TestImportRules(t *testing.T) {
	imports := moduleImports(t)
	require.Contains(t, imports, "bridge/pipeline", "go list found the module's packages")
	require.Empty(t, violations(imports))
}

// TestImportRulesCatch checks that the rules catch each kind of forbidden
// import, so that TestImportRules can fail.
func TestImportRulesCatch(t *testing.T) {
	for _, c := range []struct{ pkg, imp string }{
		{"bridge/cdc", "config"},
		{"config", "bridge/cdc"},
		{"sinks/natsjs", "bridge/format"},
		{"sources/internal/pgrepl", "bridge/pipeline"},
		{"plugins/webhook", "bridge/app"},
		{"bridge/pipeline", "bridge/telemetry"},
		{"bridge/app", "sinks/natsjs"},
		{"bridge/app", "plugins"},
		{"bridge/telemetry", "bridge/pipeline"},
		{"bridge/app", "bridge/cli"},
		{"bridge/control", "bridge/app"},
		{"bridge/control", "bridge/cli"},
		{"bridge/control", "bridge/pipeline"},
		{"bridge/pipeline", "bridge/control"},
	} {
		got := violations(map[string][]string{c.pkg: {c.imp}})
		require.NotEmpty(t, got, "%s importing %s must break a rule", c.pkg, c.imp)
	}
	for _, c := range []struct{ pkg, imp string }{
		{"sinks/natsjs", "bridge/cdc"},
		{"bridge/app", "sinks"},
		{"bridge/pipeline", "bridge/route"},
		{"cmd/bridge", "bridge"},
		{"bridge", "bridge/cli"},
		{"bridge/app", "bridge/control"},
		{"bridge/cli", "bridge/control"},
	} {
		require.Empty(t, violations(map[string][]string{c.pkg: {c.imp}}), "%s may import %s", c.pkg, c.imp)
	}
}
