// Package pgtest starts private PostgreSQL clusters for tests and the demo:
// initdb into a fresh directory (in tests, a copy of one initdb: see
// template.go; as the postgres OS user when running as
// root, since initdb refuses root), wal_level=logical, its own port and socket
// directory, trust authentication on loopback; optionally TLS with
// test-generated certificates (WriteCerts).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/internal/testport"
)

// BinDir returns the directory of the PostgreSQL server binaries: $PG_BINDIR,
// or the first of the Debian locations that has initdb.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	for _, v := range []string{"15", "16", "17", "14"} {
		d := "/usr/lib/postgresql/" + v + "/bin"
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries found: install them with `apt-get install postgresql-15 postgresql-15-wal2json` or set PG_BINDIR")
}

// Options tune a cluster.
type Options struct {
	// Major is the PostgreSQL major version to run (15 to 18, see
	// versions.txt and Majors); 0 runs BinDir()'s, the Debian 15.
	Major int
	// Settings are extra postgresql.conf settings, e.g. {"max_slot_wal_keep_size": "64MB"}.
	Settings map[string]string
	// Dir is the parent directory; default os.TempDir().
	Dir string
	// Logf receives the server's log path and notable events. Optional.
	Logf func(format string, args ...any)
	// HBA are pg_hba.conf lines put before the default ones (trust on
	// loopback), e.g. "host all alice 127.0.0.1/32 scram-sha-256" to make
	// one role authenticate with its password, or "hostssl all,replication
	// alice 127.0.0.1/32 cert" to make it present a client certificate.
	HBA []string
	// OwnSystem runs initdb for this cluster alone, so that it has a
	// system identifier of its own. In tests, clusters are otherwise
	// copies of one initdb per set of binaries (template.go) and share
	// theirs: a test of what the bridge does when a DSN points at another
	// cluster needs OwnSystem on one of them.
	OwnSystem bool
	// TLS, when set, turns ssl on with these files. The default pg_hba.conf
	// lines (host ...) accept connections with TLS and without.
	TLS *TLS
}

// TLS are the server's certificate files (PEM), copied into the data
// directory (server.crt, server.key, root.crt) so that the server's OS user
// owns them. WriteCerts makes a set for tests.
type TLS struct {
	// CertFile and KeyFile are the server's certificate and key. Required.
	CertFile, KeyFile string
	// CAFile holds the CAs whose client certificates the server accepts
	// (ssl_ca_file); optional, but pg_hba's cert method needs it.
	CAFile string
}

// Server is a running private cluster.
type Server struct {
	// Major is the server's major version (server_version_num / 10000).
	Major   int
	Port    int
	Dir     string // cluster root: data/, sock/, log
	DataDir string
	SockDir string
	bin     string
	asUser  bool
	release func() // gives up the port's claim
}

// Start creates and starts a cluster.
func Start(ctx context.Context, o Options) (_ *Server, err error) {
	bin, err := BinDirOf(o.Major)
	if err != nil {
		return nil, err
	}
	parent := o.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	root, err := os.MkdirTemp(parent, "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("making cluster dir: %w", err)
	}
	s := &Server{Dir: root, DataDir: filepath.Join(root, "data"), SockDir: filepath.Join(root, "sock"), bin: bin, asUser: os.Geteuid() == 0}
	if err := os.MkdirAll(s.SockDir, 0o755); err != nil {
		return nil, err
	}
	if s.asUser {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres OS user (apt-get install postgresql-15 makes it): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{root, s.SockDir} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, fmt.Errorf("chown %s: %w", p, err)
			}
		}
		// Parent dirs must be traversable by postgres.
		_ = os.Chmod(root, 0o755)
	}
	if err := s.initDataDir(ctx, o); err != nil {
		return nil, err
	}
	port, release, err := testport.Claim() // stays free across Stop and Start
	if err != nil {
		return nil, err
	}
	s.Port, s.release = port, release
	defer func() {
		if err != nil { // a cluster that did not start gives its port up
			release()
		}
	}()
	settings := map[string]string{
		"wal_level":               "logical",
		"max_wal_senders":         "20",
		"max_replication_slots":   "20",
		"listen_addresses":        "'127.0.0.1'",
		"port":                    strconv.Itoa(port),
		"unix_socket_directories": "'" + s.SockDir + "'",
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
		"shared_buffers":          "128MB",
		"max_connections":         "100",
		"wal_sender_timeout":      "60s",
		"log_min_messages":        "warning",
		"TimeZone":                "'UTC'",
	}
	if o.TLS != nil {
		if err := s.installTLS(o.TLS); err != nil {
			return nil, err
		}
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = "'server.crt'"
		settings["ssl_key_file"] = "'server.key'"
		if o.TLS.CAFile != "" {
			settings["ssl_ca_file"] = "'root.crt'"
		}
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	var conf strings.Builder
	for k, v := range settings {
		fmt.Fprintf(&conf, "%s = %s\n", k, v)
	}
	f, err := os.OpenFile(filepath.Join(s.DataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteString(conf.String()); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	hba := "local all all trust\nhost all all 127.0.0.1/32 trust\nlocal replication all trust\nhost replication all 127.0.0.1/32 trust\n"
	if len(o.HBA) > 0 {
		hba = strings.Join(o.HBA, "\n") + "\n" + hba
	}
	if err := os.WriteFile(filepath.Join(s.DataDir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return nil, err
	}
	if err := s.own(filepath.Join(s.DataDir, "pg_hba.conf")); err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	if err := s.readMajor(ctx); err != nil {
		return nil, err
	}
	if o.Logf != nil {
		o.Logf("postgres on 127.0.0.1:%d, data %s", s.Port, s.DataDir)
	}
	return s, nil
}

// ReplaceTLS replaces the server's certificate and key (and client CA,
// when t has one) with t's, for a cluster started with Options.TLS, and
// reloads the configuration: new connections get the new certificate.
func (s *Server) ReplaceTLS(ctx context.Context, t *TLS) error {
	if err := s.installTLS(t); err != nil {
		return err
	}
	if out, err := s.run(ctx, "pg_ctl", "-D", s.DataDir, "reload"); err != nil {
		return fmt.Errorf("pg_ctl reload: %w\n%s", err, out)
	}
	return nil
}

// installTLS copies t's files into the data directory (server.crt,
// server.key, root.crt), owned by the server's user with mode 0600 (the
// server refuses a key others can read).
func (s *Server) installTLS(t *TLS) error {
	files := [][2]string{{t.CertFile, "server.crt"}, {t.KeyFile, "server.key"}}
	if t.CAFile != "" {
		files = append(files, [2]string{t.CAFile, "root.crt"})
	}
	for _, f := range files {
		b, err := os.ReadFile(f[0])
		if err != nil {
			return fmt.Errorf("pgtest TLS: %w", err)
		}
		dst := filepath.Join(s.DataDir, f[1])
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return fmt.Errorf("pgtest TLS: %w", err)
		}
		if err := s.own(dst); err != nil {
			return err
		}
	}
	return nil
}

// own gives the file at path to the server's OS user when the cluster runs
// as postgres.
func (s *Server) own(path string) error {
	if !s.asUser {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(path, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", path, err)
	}
	return nil
}

// StartT starts a cluster for a test and stops it in cleanup. It never skips:
// missing binaries fail the test with the install command.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("starting postgres: %v", err)
	}
	t.Cleanup(func() { s.Destroy() })
	return s
}

func (s *Server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, name)
	var cmd *exec.Cmd
	if s.asUser {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = "/"
	// Keep the server out of our process group so a test's signals do not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd.CombinedOutput()
}

// Start starts a stopped cluster and waits until it accepts connections.
func (s *Server) Start(ctx context.Context) error {
	out, err := s.run(ctx, "pg_ctl", "-D", s.DataDir, "-l", filepath.Join(s.Dir, "log"), "-w", "-t", "60", "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
		return fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return nil
}

// Stop stops the cluster; mode is "fast", "smart" or "immediate" (a crash).
func (s *Server) Stop(ctx context.Context, mode string) error {
	out, err := s.run(ctx, "pg_ctl", "-D", s.DataDir, "-m", mode, "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s", mode, err, out)
	}
	return nil
}

// Restart stops the cluster in mode and starts it again.
func (s *Server) Restart(ctx context.Context, mode string) error {
	if err := s.Stop(ctx, mode); err != nil {
		return err
	}
	return s.Start(ctx)
}

// Destroy stops the cluster at once and removes its files.
func (s *Server) Destroy() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = s.Stop(ctx, "immediate")
	_ = os.RemoveAll(s.Dir)
	if s.release != nil {
		s.release()
	}
}

// DSN returns a connection string for database db ("" means postgres).
func (s *Server) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Exec runs SQL statements on database db.
func (s *Server) Exec(ctx context.Context, db string, sql ...string) error {
	c, err := pgx.Connect(ctx, s.DSN(db))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, q := range sql {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// ExecT runs SQL statements and fails the test on error.
func (s *Server) ExecT(t testing.TB, sql ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Exec(ctx, "", sql...); err != nil {
		t.Fatal(err)
	}
}

// Conn opens a connection to database db, closed in cleanup.
func (s *Server) Conn(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), s.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}
