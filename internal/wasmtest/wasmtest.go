// Package wasmtest builds the WebAssembly modules the tests run: the
// examples under examples/wasm (a Go transform, an AssemblyScript filter)
// and test guests, with the real toolchains (the go command for
// GOOS=wasip1, npm's assemblyscript as the example's package-lock.json
// pins it). Builds are cached by the hash of their sources in
// $XDG_CACHE_HOME/bridge/wasm (or ~/.cache/bridge/wasm), under a file lock,
// so parallel test packages build each module once.
package wasmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Root returns the repository's root directory.
func Root(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// GoTransform builds examples/wasm/go-transform and returns the module's path.
func GoTransform(t testing.TB) string {
	return GoModule(t, filepath.Join(Root(t), "examples", "wasm", "go-transform"))
}

// ASFilter builds examples/wasm/as-filter and returns the module's path.
func ASFilter(t testing.TB) string {
	dir := filepath.Join(Root(t), "examples", "wasm", "as-filter")
	return build(t, dir, "filter.wasm", func(out string) {
		asc := filepath.Join(dir, "node_modules", ".bin", "asc")
		if _, err := os.Stat(asc); err != nil {
			run(t, dir, nil, "npm", "ci", "--no-audit", "--no-fund") // the versions package-lock.json pins
		}
		run(t, dir, nil, asc, "assembly/index.ts", "--outFile", out, "--optimize", "--runtime", "incremental")
	})
}

// GoModule builds the Go module in dir (its own go.mod, package main) for
// GOOS=wasip1 as a reactor and returns the module's path.
func GoModule(t testing.TB, dir string) string {
	return build(t, dir, "module.wasm", func(out string) {
		run(t, dir, []string{"GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=-mod=mod"}, "go", "build", "-buildmode=c-shared", "-o", out, ".")
	})
}

// SHA256 returns the hex sha256 of the file at path.
func SHA256(t testing.TB, path string) string {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// build returns the cached build of dir's sources, making it with make
// (which writes the module to the path it is given) when absent.
func build(t testing.TB, dir, name string, make func(out string)) string {
	t.Helper()
	key := sourcesHash(t, dir)
	base, err := os.UserCacheDir()
	require.NoError(t, err)
	cache := filepath.Join(base, "bridge", "wasm")
	require.NoError(t, os.MkdirAll(cache, 0o755))
	out := filepath.Join(cache, filepath.Base(dir)+"-"+key[:16], name)
	if _, err := os.Stat(out); err == nil {
		return out
	}
	lock, err := os.OpenFile(filepath.Join(cache, filepath.Base(dir)+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(t, err)
	defer lock.Close()
	require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX))
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(out); err == nil {
		return out // built while this one waited
	}
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))
	tmp := out + ".tmp"
	make(tmp)
	require.NoError(t, os.Rename(tmp, out))
	return out
}

// sourcesHash hashes the files that make dir's module, and the go version.
func sourcesHash(t testing.TB, dir string) string {
	h := sha256.New()
	h.Write([]byte(runtime.Version()))
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "build") {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".ts") || strings.HasSuffix(p, ".json") || strings.HasSuffix(p, ".mod") || strings.HasSuffix(p, ".sum")) {
			files = append(files, p)
		}
		return nil
	})
	require.NoError(t, err)
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, f)
		h.Write([]byte(rel))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func run(t testing.TB, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s in %s:\n%s", name, strings.Join(args, " "), dir, out)
}
