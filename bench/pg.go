package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/internal/pgtest"
)

// Table and Publication are what every workload writes to and streams.
const (
	Table       = "public.bench"
	Publication = "bench_pub"
)

// PG is the private Postgres of a run with a control connection.
type PG struct {
	Server *pgtest.Server
	Ctl    *pgx.Conn
	bin    string
	pad    int
}

// StartPG starts a private cluster (internal/pgtest) under dir, creates the
// bench table and its publication. pad is the length of the text column.
func StartPG(ctx context.Context, dir string, pad int) (*PG, error) {
	bin, err := pgtest.BinDir()
	if err != nil {
		return nil, err
	}
	s, err := pgtest.Start(ctx, pgtest.Options{Dir: dir, Settings: map[string]string{
		// No background vacuum competing with the measurements; each load
		// is followed by an explicit VACUUM ANALYZE instead.
		"autovacuum":   "off",
		"max_wal_size": "8GB",
	}})
	if err != nil {
		return nil, err
	}
	c, err := pgx.Connect(ctx, s.DSN(""))
	if err != nil {
		s.Destroy()
		return nil, err
	}
	p := &PG{Server: s, Ctl: c, bin: bin, pad: pad}
	if err := p.Exec(ctx,
		`CREATE TABLE bench (id bigserial PRIMARY KEY, n int NOT NULL, pad text NOT NULL)`,
		`CREATE PUBLICATION `+Publication+` FOR TABLE bench`,
	); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close stops and removes the cluster.
func (p *PG) Close() {
	if p.Ctl != nil {
		_ = p.Ctl.Close(context.Background())
	}
	p.Server.Destroy()
}

// Exec runs statements on the control connection.
func (p *PG) Exec(ctx context.Context, sql ...string) error {
	for _, q := range sql {
		if _, err := p.Ctl.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", firstLine(q), err)
		}
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

// Version returns Postgres' version string.
func (p *PG) Version(ctx context.Context) string {
	var v string
	_ = p.Ctl.QueryRow(ctx, `SHOW server_version`).Scan(&v)
	return v
}

// CreateSlot creates a logical slot with plugin.
func (p *PG) CreateSlot(ctx context.Context, slot, plugin string) error {
	_, err := p.Ctl.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, $2)`, slot, plugin)
	if err != nil {
		return fmt.Errorf("creating slot %s (%s): %w", slot, plugin, err)
	}
	return nil
}

// DropSlot drops a slot, waiting for its walsender to go away.
func (p *PG) DropSlot(ctx context.Context, slot string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := p.Ctl.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Load is one workload committed into the slots before a consumer starts.
type Load struct {
	Name    string // "single" or "big"
	Txns    int    // transactions
	PerTxn  int    // rows per transaction
	Changes int    // Txns * PerTxn
	Elapsed time.Duration
	EndLSN  string // pg_current_wal_lsn() after the last commit
}

// LoadSingle commits n single-row transactions (one server-side loop).
func (p *PG) LoadSingle(ctx context.Context, n int) (Load, error) {
	l := Load{Name: "single", Txns: n, PerTxn: 1, Changes: n}
	start := time.Now()
	q := fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP INSERT INTO bench (n, pad) VALUES (i, repeat('x', %d)); COMMIT; END LOOP; END $$`, n, p.pad)
	if err := p.Exec(ctx, q); err != nil {
		return l, err
	}
	l.Elapsed = time.Since(start)
	return l, p.afterLoad(ctx, &l)
}

// LoadBig commits txns transactions of rows rows each.
func (p *PG) LoadBig(ctx context.Context, txns, rows int) (Load, error) {
	l := Load{Name: "big", Txns: txns, PerTxn: rows, Changes: txns * rows}
	start := time.Now()
	for i := 0; i < txns; i++ {
		q := fmt.Sprintf(`INSERT INTO bench (n, pad) SELECT i, repeat('x', %d) FROM generate_series(1, %d) i`, p.pad, rows)
		if err := p.Exec(ctx, q); err != nil {
			return l, err
		}
	}
	l.Elapsed = time.Since(start)
	return l, p.afterLoad(ctx, &l)
}

// afterLoad records the WAL end, then writes a little WAL past it (so that a
// consumer stopping at the end sees a position beyond it), and settles the
// table so no maintenance runs during the measurements.
func (p *PG) afterLoad(ctx context.Context, l *Load) error {
	if err := p.Ctl.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&l.EndLSN); err != nil {
		return err
	}
	return p.Exec(ctx,
		`SELECT pg_logical_emit_message(false, 'bench-end', 'x')`,
		`VACUUM ANALYZE bench`,
		`CHECKPOINT`,
	)
}

// SlotPID returns the walsender pid streaming slot, or 0.
func (p *PG) SlotPID(ctx context.Context, slot string) int {
	var pid *int32
	_ = p.Ctl.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
	if pid == nil {
		return 0
	}
	return int(*pid)
}

// WaitSlotPID waits until a walsender streams slot and returns its pid.
func (p *PG) WaitSlotPID(ctx context.Context, slot string, within time.Duration, alive func() bool) (int, error) {
	deadline := time.Now().Add(within)
	for {
		if pid := p.SlotPID(ctx, slot); pid != 0 {
			return pid, nil
		}
		if alive != nil && !alive() {
			return 0, fmt.Errorf("no walsender on slot %s: the consumer exited", slot)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no walsender on slot %s after %s", slot, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// PostmasterPID reads the postmaster's pid from postmaster.pid.
func (p *PG) PostmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(p.Server.DataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// Decode is one pg_recvlogical run over a backlog.
type Decode struct {
	Plugin      string        `json:"plugin"`
	Changes     int           `json:"changes"`
	Wall        time.Duration `json:"wall_ns"`
	Walsender   time.Duration `json:"walsender_cpu_ns"`
	RecvLogical time.Duration `json:"pg_recvlogical_cpu_ns"`
	Messages    int64         `json:"messages,omitempty"` // protocol messages, SQL decode only
}

// Rate is changes per second of wall time.
func (d Decode) Rate() float64 { return float64(d.Changes) / d.Wall.Seconds() }

// RecvLogical runs pg_recvlogical on slot from its position to endLSN,
// writing the plugin's output to /dev/null, and measures the wall time and
// the walsender's CPU time.
func (p *PG) RecvLogical(ctx context.Context, slot, plugin, endLSN string, changes int) (Decode, error) {
	d := Decode{Plugin: plugin, Changes: changes}
	args := []string{"-d", p.Server.DSN(""), "--slot", slot, "--start", "--endpos", endLSN,
		"--plugin", plugin, "--no-loop", "-f", "/dev/null", "-s", "1"}
	switch plugin {
	case "pgoutput":
		args = append(args, "-o", "proto_version=1", "-o", "publication_names="+Publication)
	case "wal2json":
		// The options the bridge's wal2json source asks for.
		for _, o := range []string{"format-version=2", "include-transaction=1", "include-xids=1", "include-timestamp=1",
			"include-lsn=1", "include-types=1", "include-type-oids=1", "include-pk=1", "include-not-null=1",
			"actions=insert,update,delete,truncate", "add-tables=" + Table} {
			args = append(args, "-o", o)
		}
	}
	// The poll connection is opened before the postmaster's counters are
	// read: a backend exiting inside the window would count as walsender.
	poll, err := pgx.Connect(ctx, p.Server.DSN(""))
	if err != nil {
		return d, err
	}
	defer poll.Close(context.Background())
	pm, err := p.PostmasterPID()
	if err != nil {
		return d, err
	}
	pmBefore, err := ReadCPU(pm)
	if err != nil {
		return d, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "pg_recvlogical"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return d, err
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	var sampler *Sampler
find:
	for {
		var pid *int32
		_ = poll.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		if pid != nil {
			sampler = Sample(int(*pid), 10*time.Millisecond)
			break
		}
		select {
		case <-done:
			break find
		case <-time.After(2 * time.Millisecond):
		}
	}
	<-done
	err = waitErr
	d.Wall = time.Since(start)
	if err != nil {
		return d, fmt.Errorf("pg_recvlogical --slot %s: %w\n%s", slot, err, stderr.String())
	}
	if st := cmd.ProcessState; st != nil {
		d.RecvLogical = st.UserTime() + st.SystemTime()
	}
	var sampled CPU
	if sampler != nil {
		sampled = sampler.Stop()
	}
	// The postmaster reaps the walsender when it exits; its children's CPU
	// time then grows by exactly the walsender's. Wait for the slot to be
	// released, then a little for the reaping.
	for i := 0; i < 200; i++ {
		var pid *int32
		_ = poll.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		if pid == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	pmAfter, err := ReadCPU(pm)
	if err != nil {
		return d, err
	}
	d.Walsender = pmAfter.Children - pmBefore.Children
	if d.Walsender < sampled.Self {
		d.Walsender = sampled.Self
	}
	return d, nil
}

// LiveDecode is pg_recvlogical following a live workload.
type LiveDecode struct {
	Changes     int           `json:"changes"`
	Walsender   time.Duration `json:"walsender_cpu_ns"`
	RecvLogical time.Duration `json:"pg_recvlogical_cpu_ns"`
	Writer      time.Duration `json:"writer_backend_cpu_ns"`
}

// RecvLogicalLive streams slot with pg_recvlogical (pgoutput) while write
// runs, and measures the walsender's CPU time over it: the Postgres side of
// a live stream with the cheapest possible consumer.
func (p *PG) RecvLogicalLive(ctx context.Context, slot string, write func() (int, time.Duration, error)) (LiveDecode, error) {
	var d LiveDecode
	args := []string{"-d", p.Server.DSN(""), "--slot", slot, "--start", "--no-loop", "-f", "/dev/null", "-s", "10",
		"-o", "proto_version=1", "-o", "publication_names=" + Publication}
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "pg_recvlogical"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return d, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ws, err := p.WaitSlotPID(ctx, slot, 30*time.Second, nil)
	if err != nil {
		return d, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	w0, _ := ReadCPU(ws)
	r0, _ := ReadCPU(cmd.Process.Pid)
	n, writer, err := write()
	if err != nil {
		return d, err
	}
	time.Sleep(300 * time.Millisecond) // the tail of the stream
	w1, _ := ReadCPU(ws)
	r1, _ := ReadCPU(cmd.Process.Pid)
	d.Changes, d.Walsender, d.RecvLogical, d.Writer = n, w1.Self-w0.Self, r1.Self-r0.Self, writer
	return d, nil
}

// SQLDecode consumes slot (pgoutput) inside a backend with
// pg_logical_slot_get_binary_changes: Postgres' decoding without a network
// client, on one core. It returns the decode with Walsender holding the
// backend's CPU time.
func (p *PG) SQLDecode(ctx context.Context, slot string, changes int) (Decode, error) {
	d := Decode{Plugin: "pgoutput (SQL, no client)", Changes: changes}
	c, err := pgx.Connect(ctx, p.Server.DSN(""))
	if err != nil {
		return d, err
	}
	defer c.Close(context.Background())
	var pid int
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return d, err
	}
	before, _ := ReadCPU(pid)
	start := time.Now()
	var n int64
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2)`,
		slot, Publication).Scan(&n); err != nil {
		return d, err
	}
	d.Wall = time.Since(start)
	after, _ := ReadCPU(pid)
	d.Walsender = after.Self - before.Self
	d.Messages = n
	if n < int64(changes) {
		return d, fmt.Errorf("pg_logical_slot_get_binary_changes on %s returned %d messages for %d changes", slot, n, changes)
	}
	return d, nil
}
