package pgtest

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// versions lists the majors the tests run on and where each comes from;
// scripts/deps.sh reads the same file to install them.
//
//go:embed versions.txt
var versions string

// DefaultMajor is the major a cluster runs when Options.Major is 0: the
// Debian package's (or $PG_BINDIR's). It is the only one with wal2json.
const DefaultMajor = 15

// Version is one line of versions.txt.
type Version struct {
	Major int
	// Source is "debian" (Bin is the Debian binaries' directory) or "npm"
	// (Package is the npm package and version whose server build
	// scripts/deps.sh unpacks into CacheDir()).
	Source       string
	Bin, Package string
}

// Versions returns the majors of versions.txt, in order.
func Versions() []Version {
	var out []Version
	for _, l := range strings.Split(versions, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || strings.HasPrefix(f[0], "#") {
			continue
		}
		m, err := strconv.Atoi(f[0])
		if err != nil {
			panic("pgtest: versions.txt: bad major " + f[0])
		}
		v := Version{Major: m, Source: f[1]}
		if v.Source == "debian" {
			v.Bin = f[2]
		} else {
			v.Package = f[2]
		}
		out = append(out, v)
	}
	return out
}

// Majors returns the majors the version matrix runs on: $PG_MAJORS (a
// comma-separated list, e.g. "15,17"), or every major of versions.txt
// (15 to 18).
func Majors() []int {
	all := Versions()
	if s := strings.TrimSpace(os.Getenv("PG_MAJORS")); s != "" {
		var out []int
		for _, f := range strings.Split(s, ",") {
			m, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || !slices.ContainsFunc(all, func(v Version) bool { return v.Major == m }) {
				panic(fmt.Sprintf("pgtest: PG_MAJORS=%q: %q is not one of the majors of internal/pgtest/versions.txt", s, f))
			}
			out = append(out, m)
		}
		return out
	}
	out := make([]int, len(all))
	for i, v := range all {
		out[i] = v.Major
	}
	return out
}

// CacheDir is where scripts/deps.sh unpacks the npm server builds, one
// directory per package version: $BRIDGE_PG_CACHE, else
// /var/cache/bridge/postgres for root (the postgres OS user, which runs
// the servers, must reach it; root's home is closed to it), else
// $XDG_CACHE_HOME/bridge/postgres or ~/.cache/bridge/postgres.
func CacheDir() string {
	if d := os.Getenv("BRIDGE_PG_CACHE"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/bridge/postgres"
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "bridge", "postgres")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "bridge", "postgres")
}

// BinDirOf returns the directory of major's server binaries (0:
// BinDir()). It fails, naming the command that installs them, when they
// are missing.
func BinDirOf(major int) (string, error) {
	if major == 0 {
		return BinDir()
	}
	for _, v := range Versions() {
		if v.Major != major {
			continue
		}
		d := v.Bin
		if v.Source == "npm" {
			d = filepath.Join(CacheDir(), strings.ReplaceAll(strings.TrimPrefix(v.Package, "@"), "/", "+"), "native", "bin")
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("no PostgreSQL %d server binaries in %s: run scripts/deps.sh (it installs every major of internal/pgtest/versions.txt)", major, d)
		}
		return d, nil
	}
	return "", errors.New("pgtest: PostgreSQL " + strconv.Itoa(major) + " is not in internal/pgtest/versions.txt")
}

// HasWal2json reports whether major's server has the wal2json plugin:
// only Debian's PostgreSQL 15 (postgresql-15-wal2json); the npm builds of
// 16 to 18 have none, so the wal2json tests run on 15 only.
func HasWal2json(major int) bool {
	if major == 0 {
		major = DefaultMajor
	}
	d, err := BinDirOf(major)
	if err != nil {
		return false
	}
	for _, lib := range []string{"../lib/wal2json.so", "../lib/postgresql/wal2json.so"} {
		if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
			return true
		}
	}
	return false
}
