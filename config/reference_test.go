package config_test

import (
	"flag"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
	_ "github.com/bridgecdc/bridge/plugins"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the code")

const (
	module    = "github.com/bridgecdc/bridge"
	moduleDir = ".."
	refPath   = "../docs/configuration.md"
	refocus   = "go test ./config -run TestReference -update"
)

// registered lists every compiled-in plugin, as the bridge binary has them.
func registered() []config.RefPlugin {
	var out []config.RefPlugin
	for _, typ := range sources.Default.Types() {
		p, _ := sources.Default.Lookup(typ)
		out = append(out, config.RefPlugin{Kind: "source", Type: typ, Doc: p.Doc, Config: p.Config})
	}
	for _, typ := range sinks.Default.Types() {
		p, _ := sinks.Default.Lookup(typ)
		out = append(out, config.RefPlugin{Kind: "sink", Type: typ, Doc: p.Doc, Config: p.Config})
	}
	return out
}

// sourceComments reads the doc comments of struct types and their fields
// from the Go source of the packages that declare them (go/parser and
// go/doc), for packages inside this module.
func sourceComments(t *testing.T) config.CommentFunc {
	type key struct{ pkg, typ, field string }
	var mu sync.Mutex
	parsed := map[string]bool{}
	docs := map[key]string{}
	load := func(pkgPath string) {
		if parsed[pkgPath] {
			return
		}
		parsed[pkgPath] = true
		if pkgPath != module && !strings.HasPrefix(pkgPath, module+"/") {
			return
		}
		dir := filepath.Join(moduleDir, strings.TrimPrefix(pkgPath, module))
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		fset := token.NewFileSet()
		var files []*ast.File
		for _, n := range names {
			if strings.HasSuffix(n, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
			require.NoError(t, err)
			files = append(files, f)
		}
		p, err := doc.NewFromFiles(fset, files, pkgPath, doc.AllDecls|doc.PreserveAST)
		require.NoError(t, err, pkgPath)
		for _, typ := range p.Types {
			docs[key{pkgPath, typ.Name, ""}] = typ.Doc
			for _, spec := range typ.Decl.Specs {
				ts, ok := spec.(*ast.TypeSpec)
				if !ok || ts.Name.Name != typ.Name {
					continue
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				prev := ""
				for _, f := range st.Fields.List {
					text := f.Doc.Text()
					if text == "" {
						text = f.Comment.Text()
					}
					for _, n := range f.Names {
						// "User and Password for ..." above User documents
						// the Password field that follows it too.
						if text == "" && regexp.MustCompile(`\b`+n.Name+`\b`).MatchString(prev) {
							text = prev
						}
						docs[key{pkgPath, typ.Name, n.Name}] = text
					}
					prev = text
				}
			}
		}
	}
	return func(typ reflect.Type, field string) string {
		mu.Lock()
		defer mu.Unlock()
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		load(typ.PkgPath())
		return docs[key{typ.PkgPath(), typ.Name(), field}]
	}
}

// TestReference regenerates docs/configuration.md and fails when the file
// differs: the reference follows the config structs, their defaults and
// their doc comments.
func TestReference(t *testing.T) {
	got := append(config.Reference(registered(), sourceComments(t)), '\n')
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(refPath), 0o755))
		require.NoError(t, os.WriteFile(refPath, got, 0o644))
		return
	}
	want, err := os.ReadFile(refPath)
	require.NoError(t, err, "docs/configuration.md is missing; create it with: %s", refocus)
	if string(want) != string(got) {
		t.Fatalf("docs/configuration.md is out of date with the config structs; refresh it with:\n\t%s\n(first difference at line %d)",
			refocus, firstDiff(string(want), string(got)))
	}
}

func firstDiff(a, b string) int {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range la {
		if i >= len(lb) || la[i] != lb[i] {
			return i + 1
		}
	}
	return len(la) + 1
}

// TestReferenceCoversEveryKey checks the generated reference against what
// the code accepts: every framework key Load knows and every key of every
// plugin's config block appears, each with a description.
func TestReferenceCoversEveryKey(t *testing.T) {
	ref := string(config.Reference(registered(), sourceComments(t)))
	for _, k := range []string{
		"`name`", "`data_dir`", "`unrouted`", "`nats.url`", "`nats.embedded.sync_always`", "`sources.<name>.type`",
		"`sinks.<name>.batch.max_wait`", "`sinks.<name>.retry.max`", "`routes[].match.tables`", "`routes[].subject`",
		"`checkpoint.replicas`", "`shutdown.timeout`", "`telemetry.tracing.sample_ratio`", "`http.listen`",
		"`sources.<name>.config.dsn`", "`sources.<name>.config.spill_bytes`", "`sinks.<name>.config.stream`",
		"`sinks.<name>.config.dead_letter_subject`", "`sinks.<name>.config.headers`",
	} {
		require.Contains(t, ref, "| "+k+" |", k)
	}
	// Defaults from Load's defaults and the plugins' Config values.
	for _, row := range []string{
		"| `checkpoint.interval` | duration | `1s` | `BRIDGE_CHECKPOINT__INTERVAL` |",
		"| `sinks.<name>.batch.max_changes` | int | `1000` |",
		"| `routes[].format` | string | `\"native\"` | — |",
		"| `sinks.<name>.config.duplicate_window` | duration | `2m` |",
		"| `sources.<name>.config.slot` | string | `\"bridge_<name>\"` | `BRIDGE_SOURCES__<NAME>__CONFIG__SLOT` |",
		"| `nats.embedded.store_dir` | string | `<data_dir>/nats` |",
		"| `sinks.<name>.config.subjects` | list of strings | `[\"cdc.>\"]` | `BRIDGE_SINKS__<NAME>__CONFIG__SUBJECTS` |",
		"| `routes[].match.tables` | list of strings | — | — |",
	} {
		require.Contains(t, ref, row)
	}
	// Every row has a description: a field without a doc comment fails.
	for _, line := range strings.Split(ref, "\n") {
		if strings.HasPrefix(line, "| `") {
			cells := strings.Split(strings.TrimSuffix(line, " |"), " | ")
			require.NotEmpty(t, strings.TrimSpace(cells[len(cells)-1]), "no doc comment: %s", line)
		}
	}
}
