// Package pgslot reads a source's replication slot from Postgres on a
// regular (not replication) connection: whether it exists and is active,
// what it confirmed, how much WAL it retains and its wal_status, and for a
// failover slot whether it survives a failover (internal/pgfailover). The slot
// poller keeps the last reading in a Gauge for metrics, for /readyz and for
// the pipeline's check that the slot was not lost while it streams; `bridge
// status` and `bridge resync` read the slot once.
package pgslot

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgfailover"
	"github.com/bridgecdc/bridge/internal/pgnet"
)

// Row is a replication slot's row with the server's WAL end.
type Row struct {
	Exists         bool
	Active         bool
	ActivePID      int
	ConfirmedFlush cdc.LSN
	RestartLSN     cdc.LSN
	WALStatus      string
	SafeWALSize    *int64
	// CurrentWAL is pg_current_wal_lsn(), or on a standby the last WAL
	// received.
	CurrentWAL cdc.LSN
	// Failover is pg_replication_slots.failover (PostgreSQL 17; false
	// before), StandbySlots the server's synchronized_standby_slots.
	Failover     bool
	StandbySlots string
	// Standbys are the other hosts of the DSN and their copies of a
	// failover slot (Poll reads them for a failover slot only).
	Standbys []pgfailover.Standby
}

// FailoverStandbys returns how many standbys of the DSN hold a synced
// copy of the slot that their promotion keeps.
func (r Row) FailoverStandbys() int {
	n := 0
	for _, s := range r.Standbys {
		if s.Survives() {
			n++
		}
	}
	return n
}

// FailoverReady reports whether a failover to one of the DSN's standbys
// loses nothing of the stream: a failover slot, synchronized_standby_slots
// set on the primary (it sends nothing its standbys lack), and a standby
// holding a synced copy.
func (r Row) FailoverReady() bool {
	return r.Exists && r.Failover && strings.TrimSpace(r.StandbySlots) != "" && r.FailoverStandbys() > 0
}

// Retained returns the WAL bytes the slot holds back.
func (r Row) Retained() uint64 {
	if !r.Exists || r.RestartLSN == 0 || r.CurrentWAL < r.RestartLSN {
		return 0
	}
	return uint64(r.CurrentWAL - r.RestartLSN)
}

// Read reads slot's row (Exists false when there is none) and the WAL end
// on c. Needs PostgreSQL 13 or later.
func Read(ctx context.Context, c *pgx.Conn, slot string) (Row, error) {
	var r Row
	var cur, confirmed, restart, status *string
	var pid *int32
	var failover *bool
	var sss *string
	err := c.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END)::text,
			s.slot_name IS NOT NULL, coalesce(s.active, false), s.active_pid, s.confirmed_flush_lsn::text, s.restart_lsn::text,
			s.wal_status, s.safe_wal_size, (to_jsonb(s) ->> 'failover')::bool, current_setting('synchronized_standby_slots', true)
		FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).
		Scan(&cur, &r.Exists, &r.Active, &pid, &confirmed, &restart, &status, &r.SafeWALSize, &failover, &sss)
	if err != nil {
		return r, fmt.Errorf("reading slot %q: %w", slot, err)
	}
	parse := func(s *string) cdc.LSN {
		if s == nil {
			return 0
		}
		l, _ := cdc.ParseLSN(*s)
		return l
	}
	r.CurrentWAL, r.ConfirmedFlush, r.RestartLSN = parse(cur), parse(confirmed), parse(restart)
	if pid != nil {
		r.ActivePID = int(*pid)
	}
	if status != nil {
		r.WALStatus = *status
	}
	r.Failover = failover != nil && *failover
	if sss != nil {
		r.StandbySlots = *sss
	}
	return r, nil
}

// readStandbys fills r.Standbys for a failover slot: each other host of
// dsn, read on a connection of its own.
func readStandbys(ctx context.Context, r *Row, dsn, slot string) {
	if !r.Exists || !r.Failover {
		return
	}
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return
	}
	if err := pgnet.Apply(&cc.Config); err != nil {
		return
	}
	r.Standbys = pgfailover.ReadStandbys(ctx, cc, slot)
}

// ReadOnce connects to src, reads its slot and disconnects, within 15 s.
// appName is the connection's application_name.
func ReadOnce(ctx context.Context, src Source, appName string) (Row, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, err := Connect(ctx, src.DSN, appName)
	if err != nil {
		return Row{}, err
	}
	defer c.Close(context.Background())
	return Read(ctx, c, src.Slot)
}

// Source is what the slot readers need of a Postgres source's config
// block, decoded leniently (other keys are ignored).
type Source struct {
	DSN, Slot string
}

// SourceOf returns the DSN and slot of source name's config block, the
// slot defaulting to bridge_<name> as the Postgres sources do; ok is false
// when the block has no dsn (not a Postgres source).
func SourceOf(name string, p config.Plugin) (Source, bool) {
	dsn, _ := p.Config["dsn"].(string)
	slot, _ := p.Config["slot"].(string)
	if slot == "" {
		slot = "bridge_" + name
	}
	return Source{DSN: dsn, Slot: slot}, dsn != ""
}

// Connect opens a regular connection with application_name appName and a
// 10 s connect timeout unless the DSN sets one. Errors never show the
// password.
func Connect(ctx context.Context, dsn, appName string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing dsn %s: %w", config.Redact(dsn), err)
	}
	// libpq's keepalives and tcp_user_timeout, as the source's connections.
	if err := pgnet.Apply(&cc.Config); err != nil {
		return nil, fmt.Errorf("dsn %s: %w", config.Redact(dsn), err)
	}
	cc.RuntimeParams["application_name"] = appName
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 10 * time.Second
	}
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", config.Redact(dsn), err)
	}
	return c, nil
}

// Reading is a Gauge's last poll.
type Reading struct {
	Slot string
	Row  Row
	At   time.Time // when the poll was taken
}

// Gauge holds the last poll of a slot. It is safe for concurrent use; the
// zero value holds no reading.
type Gauge struct {
	mu sync.Mutex
	ok bool
	r  Reading
}

// Set records a poll of slot at now; ok false records a failed poll.
func (g *Gauge) Set(slot string, r Row, ok bool) {
	g.mu.Lock()
	g.r, g.ok = Reading{Slot: slot, Row: r, At: time.Now()}, ok
	g.mu.Unlock()
}

// Last returns the last poll and whether it succeeded.
func (g *Gauge) Last() (Reading, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.r, g.ok
}

// Poll reads src's slot into g every interval until ctx ends, on one
// connection named "bridge:<source>:metrics" that it reopens after a
// failure. failed is called for each failed poll (a metric); the first
// failure in a row and the recovery are logged.
func Poll(ctx context.Context, g *Gauge, source string, src Source, every time.Duration, log *slog.Logger, failed func()) {
	var conn *pgx.Conn
	closeConn := func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
			conn = nil
		}
	}
	defer closeConn()
	failing := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, max(every, 5*time.Second))
		var err error
		if conn == nil {
			conn, err = Connect(qctx, src.DSN, "bridge:"+source+":metrics")
		}
		var r Row
		if err == nil {
			r, err = Read(qctx, conn, src.Slot)
		}
		if err == nil {
			readStandbys(qctx, &r, src.DSN, src.Slot)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			g.Set(src.Slot, Row{}, false)
			if failed != nil {
				failed()
			}
			if !failing {
				log.Warn("cannot read the replication slot for metrics; retrying", "slot", src.Slot, "err", err)
			}
			failing = true
			closeConn()
		default:
			if failing {
				log.Info("reading the replication slot for metrics again", "slot", src.Slot)
			}
			failing = false
			g.Set(src.Slot, r, true)
		}
		t.Reset(every)
	}
}
