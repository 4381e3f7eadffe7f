package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// In a test binary, a cluster's data directory is a copy of one initdb
// per set of server binaries instead of an initdb of its own: initdb
// costs about a second of CPU, a copy a few hundredths, and the e2e tests
// start hundreds of clusters. The copies share the template's system
// identifier; Options.OwnSystem runs initdb for a cluster that must have
// one of its own. Outside tests (the demo, the benchmark) every cluster
// runs initdb, so nothing is left behind in the temp directory.
//
// The templates live in os.TempDir()/bridge-pgtest-templates, one per
// binaries and OS user, shared by the test processes that go test runs
// side by side: each is made under a name of its own and renamed into
// place, so a process sees a whole template or none.

// templates serializes the making of a template within this process, so
// that tests starting together wait for one initdb instead of each
// running their own.
var templates sync.Map // key → *sync.Mutex

// useTemplate reports whether Start copies a template: in tests, unless
// the cluster needs a system identifier of its own.
func useTemplate(o Options) bool {
	return testing.Testing() && !o.OwnSystem
}

// initDataDir fills s.DataDir: a copy of the template for s's binaries, or
// its own initdb.
func (s *Server) initDataDir(ctx context.Context, o Options) error {
	if !useTemplate(o) {
		return s.initdb(ctx, s.DataDir)
	}
	tmpl, err := s.template(ctx)
	if err != nil {
		return err
	}
	// cp -a keeps the files' owner (postgres) and modes.
	if out, err := exec.CommandContext(ctx, "cp", "-a", tmpl, s.DataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("copying the initdb template %s: %w\n%s", tmpl, err, out)
	}
	return nil
}

func (s *Server) initdb(ctx context.Context, dir string) error {
	if out, err := s.run(ctx, "initdb", "-D", dir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

// template returns the data directory made by initdb for s's binaries,
// making it first when there is none.
func (s *Server) template(ctx context.Context) (string, error) {
	initdb := filepath.Join(s.bin, "initdb")
	fi, err := os.Stat(initdb)
	if err != nil {
		return "", fmt.Errorf("initdb: %w", err)
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d", initdb, fi.Size(), fi.ModTime().UnixNano())))
	root := filepath.Join(os.TempDir(), "bridge-pgtest-templates")
	dir := filepath.Join(root, strconv.Itoa(os.Geteuid())+"-"+hex.EncodeToString(h[:8]))
	mu, _ := templates.LoadOrStore(dir, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	if complete(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("making %s: %w", root, err)
	}
	_ = os.Chmod(root, 0o755) // traversable by the postgres user
	tmp, err := os.MkdirTemp(root, "making-")
	if err != nil {
		return "", fmt.Errorf("making a template dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := s.own(tmp); err != nil {
		return "", err
	}
	_ = os.Chmod(tmp, 0o755)
	data := filepath.Join(tmp, "data")
	if err := s.initdb(ctx, data); err != nil {
		return "", err
	}
	if err := os.Rename(data, dir); err != nil && !complete(dir) {
		// Another process may have put its own in place meanwhile
		// (rename does not replace a directory that has files).
		return "", fmt.Errorf("putting the initdb template in place: %w", err)
	}
	removeStale(root)
	return dir, nil
}

// complete reports whether dir holds a whole data directory.
func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "global", "pg_control"))
	return err == nil
}

// removeStale removes what processes killed while making a template left
// behind (an hour old: no initdb takes that long).
func removeStale(root string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), "making-") && time.Since(fi.ModTime()) > time.Hour {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}
