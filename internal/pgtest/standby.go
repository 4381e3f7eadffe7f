package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/internal/testport"
)

// readMajor sets s.Major from the running server.
func (s *Server) readMajor(ctx context.Context) error {
	c, err := pgx.Connect(ctx, s.DSN(""))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&n); err != nil {
		return fmt.Errorf("reading server_version_num: %w", err)
	}
	s.Major = n / 10000
	return nil
}

// StandbyOptions tune a physical standby made by NewStandby.
type StandbyOptions struct {
	// Slot is the physical replication slot on the primary that the
	// standby streams from (primary_slot_name); created when missing.
	// Default "standby_<port>".
	Slot string
	// PrimaryAddr is the "host:port" the standby connects to the primary
	// at (primary_conninfo); default the primary's own. A test puts a
	// faultproxy in between to stall the standby's WAL.
	PrimaryAddr string
	// Settings are extra postgresql.conf settings of the standby, e.g.
	// {"sync_replication_slots": "on"} (17+).
	Settings map[string]string
}

// NewStandby makes a physical standby of primary and starts it: it stops
// the primary (fast), copies its data directory, starts the primary again,
// and starts the copy with standby.signal, primary_conninfo (with
// dbname=postgres, which slot synchronization needs), primary_slot_name
// and hot_standby_feedback = on, on a port of its own. A clean stop makes
// the copy consistent without pg_basebackup, which the npm builds lack.
func NewStandby(ctx context.Context, primary *Server, o StandbyOptions) (_ *Server, err error) {
	if o.Slot == "" {
		o.Slot = "standby_" + strconv.Itoa(primary.Port)
	}
	if o.PrimaryAddr == "" {
		o.PrimaryAddr = "127.0.0.1:" + strconv.Itoa(primary.Port)
	}
	if err := primary.Exec(ctx, "", fmt.Sprintf(`SELECT pg_create_physical_replication_slot('%s', true)
		WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '%s')`, o.Slot, o.Slot)); err != nil {
		return nil, err
	}
	if err := primary.Stop(ctx, "fast"); err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp(filepath.Dir(primary.Dir), "pgtest-standby-")
	if err != nil {
		return nil, fmt.Errorf("making standby dir: %w", err)
	}
	s := &Server{Major: primary.Major, Dir: root, DataDir: filepath.Join(root, "data"), SockDir: filepath.Join(root, "sock"), bin: primary.bin, asUser: primary.asUser}
	// cp -a keeps the files' owner (postgres) and modes.
	out, cerr := exec.CommandContext(ctx, "cp", "-a", primary.DataDir, s.DataDir).CombinedOutput()
	if serr := primary.Start(ctx); serr != nil && cerr == nil {
		cerr = serr
	}
	if cerr != nil {
		return nil, fmt.Errorf("copying the primary's data directory: %w\n%s", cerr, out)
	}
	if err := os.MkdirAll(s.SockDir, 0o755); err != nil {
		return nil, err
	}
	for _, p := range []string{root, s.SockDir} {
		if err := s.own(p); err != nil {
			return nil, err
		}
	}
	_ = os.Chmod(root, 0o755)
	// The copy holds the primary's slots: a standby starts without them
	// (the logical ones come back through slot synchronization).
	entries, _ := os.ReadDir(filepath.Join(s.DataDir, "pg_replslot"))
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(s.DataDir, "pg_replslot", e.Name()))
	}
	_ = os.Remove(filepath.Join(s.DataDir, "postmaster.pid"))
	port, release, err := testport.Claim()
	if err != nil {
		return nil, err
	}
	s.Port, s.release = port, release
	defer func() {
		if err != nil {
			release()
		}
	}()
	host, pport, _ := strings.Cut(o.PrimaryAddr, ":")
	settings := map[string]string{
		"port":                         strconv.Itoa(port),
		"unix_socket_directories":      "'" + s.SockDir + "'",
		"primary_conninfo":             fmt.Sprintf("'host=%s port=%s user=postgres dbname=postgres application_name=%s'", host, pport, o.Slot),
		"primary_slot_name":            "'" + o.Slot + "'",
		"hot_standby_feedback":         "on",
		"wal_receiver_status_interval": "1s",
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	if err := s.appendConf(settings); err != nil {
		return nil, err
	}
	sig := filepath.Join(s.DataDir, "standby.signal")
	if err := os.WriteFile(sig, nil, 0o600); err != nil {
		return nil, err
	}
	if err := s.own(sig); err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// NewStandbyT is NewStandby for a test: it fails the test on error and
// destroys the standby in cleanup.
func NewStandbyT(t interface {
	Helper()
	Fatalf(string, ...any)
	Cleanup(func())
	Context() context.Context
}, primary *Server, o StandbyOptions) *Server {
	t.Helper()
	s, err := NewStandby(t.Context(), primary, o)
	if err != nil {
		t.Fatalf("starting a standby of port %d: %v", primary.Port, err)
	}
	t.Cleanup(s.Destroy)
	return s
}

// appendConf appends settings to postgresql.conf; the last setting of a
// name wins.
func (s *Server) appendConf(settings map[string]string) error {
	var conf strings.Builder
	for k, v := range settings {
		fmt.Fprintf(&conf, "%s = %s\n", k, v)
	}
	f, err := os.OpenFile(filepath.Join(s.DataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(conf.String())
	return err
}

// SetConf appends settings to postgresql.conf and reloads the server
// (settings that need a restart take effect at the next Start).
func (s *Server) SetConf(ctx context.Context, settings map[string]string) error {
	if err := s.appendConf(settings); err != nil {
		return err
	}
	if out, err := s.run(ctx, "pg_ctl", "-D", s.DataDir, "reload"); err != nil {
		return fmt.Errorf("pg_ctl reload: %w\n%s", err, out)
	}
	return nil
}

// Promote promotes a standby to a primary (pg_ctl promote) and waits
// until it is one.
func (s *Server) Promote(ctx context.Context) error {
	if out, err := s.run(ctx, "pg_ctl", "-D", s.DataDir, "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s\nthe server's log, last lines:\n%s", err, out, tail(s.Log(), 40))
	}
	return nil
}

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "log"))
	return string(b)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
