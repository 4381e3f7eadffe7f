// Package exampleplugins builds the example sink plugins of
// examples/plugins for the tests and benchmarks that run them: the Go one
// with go build, the Python one with its build.sh (Debian's python3-grpcio
// and python3-grpc-tools), the TypeScript one with its build.sh (Node and
// the node_modules `npm ci` installed; scripts/deps.sh provides all of
// them). Each is built once per process, into a temporary directory that
// Cleanup removes (a TestMain calls it after the tests).
package exampleplugins

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// Languages are the example plugins, by the name Build takes.
var Languages = []string{"go", "python", "typescript"}

type built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

var (
	mu     sync.Mutex
	builds = map[string]*built{}
)

// Root returns the repository's root directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Build builds the example plugin in lang (one of Languages) once and
// returns the path of its executable. An error says what to install.
func Build(lang string) (string, error) {
	mu.Lock()
	b := builds[lang]
	if b == nil {
		b = &built{}
		builds[lang] = b
	}
	mu.Unlock()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "bridge-"+lang+"-sink-")
		if b.err == nil {
			b.path, b.err = build(lang, b.dir)
		}
	})
	return b.path, b.err
}

// Cleanup removes what Build built.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	for lang, b := range builds {
		if b.dir != "" {
			_ = os.RemoveAll(b.dir)
		}
		delete(builds, lang)
	}
}

func build(lang, dir string) (string, error) {
	root := Root()
	var cmd *exec.Cmd
	var exe string
	switch lang {
	case "go":
		exe = filepath.Join(dir, "go-sink")
		cmd = exec.Command("go", "build", "-o", exe, "./examples/plugins/go-sink")
	case "python":
		exe = filepath.Join(dir, "python-sink")
		cmd = exec.Command("examples/plugins/python-sink/build.sh", exe)
	case "typescript":
		exe = filepath.Join(dir, "ts-sink")
		cmd = exec.Command("examples/plugins/ts-sink/build.sh", dir)
	default:
		return "", fmt.Errorf("no example plugin in %q (there are %v)", lang, Languages)
	}
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("building the %s example plugin: %s: %w (scripts/deps.sh installs what it needs)", lang, out, err)
		}
		return "", fmt.Errorf("building the %s example plugin: %w", lang, err)
	}
	return exe, nil
}
