package webhook_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOutsideModule builds examples/custom-sink, a module of its own that
// requires this one, the way a user builds a bridge with a custom sink:
// offline, from the module cache. It works on a copy, so the build never
// edits the example; the example's go.mod and go.sum must already hold
// what the build needs.
func TestOutsideModule(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	src := filepath.Join(root, "examples", "custom-sink")
	dir := filepath.Join(t.TempDir(), "custom-sink")
	copyTree(t, src, dir)
	gomod := filepath.Join(dir, "go.mod")
	mod, err := os.ReadFile(gomod)
	require.NoError(t, err)
	const replace = "replace github.com/bridgecdc/bridge => ../.."
	require.Contains(t, string(mod), replace)
	require.NoError(t, os.WriteFile(gomod, bytes.Replace(mod, []byte(replace), []byte("replace github.com/bridgecdc/bridge => "+root), 1), 0o644))
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	require.NoError(t, err)

	env := []string{"GOFLAGS=-mod=mod", "GOWORK=off", "GOPROXY=off", "GOSUMDB=off", "GOTOOLCHAIN=local"}
	bin := filepath.Join(t.TempDir(), "acme-bridge")
	run(t, dir, env, "go", "build", "-o", bin, ".")
	run(t, dir, env, "go", "vet", "./...")
	run(t, dir, env, "go", "test", "-count=1", "./...") // the file sink passes sinktest.Run

	after, err := os.ReadFile(gomod)
	require.NoError(t, err)
	afterSum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	require.NoError(t, err)
	if !bytes.Equal(after, bytes.Replace(mod, []byte(replace), []byte("replace github.com/bridgecdc/bridge => "+root), 1)) || !bytes.Equal(sum, afterSum) {
		t.Errorf("examples/custom-sink/go.mod or go.sum is out of date with this module's dependencies; refresh them with\n" +
			"  cd examples/custom-sink && GOWORK=off GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off go test ./...")
	}

	out := run(t, dir, nil, bin, "plugins")
	for _, typ := range []string{"acme_file", "nats_jetstream", "nats_core", "webhook", "pgoutput"} {
		require.Contains(t, out, "  "+typ+"\t", "`plugins` does not list %s", typ)
	}
	require.Contains(t, out, "path (string)", "acme_file's config keys")

	out = run(t, dir, nil, bin, "validate", "-c", "bridge.yaml")
	require.Contains(t, out, "bridge.yaml: ok (1 sources, 2 sinks, 1 routes)")

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(`name: acme
sources:
  shop:
    type: pgoutput
    config: { dsn: "postgres://bridge@db/shop" }
sinks:
  audit:
    type: acme_file
    config: { pth: /tmp/audit.jsonl }
routes:
  - sinks: [audit]
`), 0o644))
	cmd := exec.CommandContext(t.Context(), bin, "validate", "-c", bad)
	cmd.Env = cleanEnv(nil)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.ExitCode())
	require.Contains(t, stderr.String(), "sinks.audit.config.pth: unknown key")
	require.Contains(t, stderr.String(), "sinks.audit.config.path: must be set")
}

// run runs name in dir and returns its stdout, failing the test with its
// output when it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s %s:\n%s%s", name, strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String()
}

// cleanEnv is the environment without BRIDGE_* overrides (they would change
// what validate sees) and GOFLAGS, plus extra.
func cleanEnv(extra []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BRIDGE_") && !strings.HasPrefix(kv, "GOFLAGS=") {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// copyTree copies the regular files under src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	}))
}
