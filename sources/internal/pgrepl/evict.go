package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/sources"
)

// The slot admits one walsender. When START_REPLICATION finds it held
// (55006), Open returns a *sources.SlotBusyError naming the walsender, and
// the runtime may decide that it is stale and end it with Evict
// (sources.Evicter).

// readHolder returns the walsender holding slot, zero when none does. The
// start time is left zero when the role may not see it (pg_stat_activity
// hides other roles' sessions from roles without pg_read_all_stats).
func readHolder(ctx context.Context, c *pgx.Conn, slot string) (sources.SlotReader, error) {
	var pid *int32
	var started *time.Time
	err := c.QueryRow(ctx, `SELECT s.active_pid, a.backend_start
		FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, slot).Scan(&pid, &started)
	if errors.Is(err, pgx.ErrNoRows) {
		return sources.SlotReader{}, nil
	}
	if err != nil {
		return sources.SlotReader{}, fmt.Errorf("reading the reader of slot %q: %w", slot, err)
	}
	var r sources.SlotReader
	if pid != nil {
		r.PID = int(*pid)
	}
	if started != nil && r.PID != 0 {
		r.Started = started.UTC()
	}
	return r, nil
}

// busy returns err, the failure of START_REPLICATION, as a
// *sources.SlotBusyError naming the slot's walsender when the slot is held
// (55006); any other error as it is. s.cat must be open.
func (s *Source) busy(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55006" {
		return err
	}
	holder, rerr := readHolder(ctx, s.cat, s.cfg.Slot)
	if rerr != nil {
		s.log.Debug("cannot read the slot's reader", "slot", s.cfg.Slot, "err", rerr)
	}
	return &sources.SlotBusyError{Slot: s.cfg.Slot, Database: s.database, Holder: holder, Err: err}
}

// Reader implements sources.Evicter.
func (s *Source) Reader() sources.SlotReader { return s.reader }

// ownReader reads this source's own walsender after START_REPLICATION
// succeeded: its PID from the connection, its start time from
// pg_stat_activity (on s.cat, before the receive loop uses it).
func (s *Source) ownReader(ctx context.Context) sources.SlotReader {
	r := sources.SlotReader{PID: int(s.repl.PID())}
	var started *time.Time
	if err := s.cat.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = $1`, r.PID).Scan(&started); err == nil && started != nil {
		r.Started = started.UTC()
	}
	return r
}

// evictPoll is how often Evict looks whether the ended walsender let the
// slot go.
const evictPoll = 20 * time.Millisecond

// Evict implements sources.Evicter: on a connection of its own it ends
// holder with pg_terminate_backend, if holder still holds the slot, and
// waits until the slot is no longer held by it. Postgres allows it to a
// role that is the walsender's role (or a member of it) or a member of
// pg_signal_backend; a superuser's walsender only to a superuser.
func (s *Source) Evict(ctx context.Context, holder sources.SlotReader) error {
	if holder.PID == 0 {
		return nil
	}
	slot := s.cfg.Slot
	ccfg, err := pgx.ParseConfig(s.cfg.DSN)
	if err != nil {
		return fmt.Errorf("parsing dsn of source %q: %w", s.name, err)
	}
	ccfg.RuntimeParams["application_name"] = "bridge:" + s.name
	c, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		return fmt.Errorf("connecting to %s to end PID %d, the reader of slot %q: %w", Redact(s.cfg.DSN), holder.PID, slot, explainConnect(s.cfg.DSN, err))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = c.Close(cctx)
		cancel()
	}()
	cur, err := readHolder(ctx, c, slot)
	if err != nil {
		return err
	}
	if !cur.Same(holder) {
		return nil // it let the slot go already
	}
	var signalled bool
	err = c.QueryRow(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name = $1 AND active_pid = $2`, slot, holder.PID).Scan(&signalled)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // let go meanwhile
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			var role string
			_ = c.QueryRow(ctx, "SELECT current_user").Scan(&role)
			detail := pgErr.Message
			if pgErr.Detail != "" {
				detail += ": " + pgErr.Detail
			}
			return fmt.Errorf("%w: role %q may not end PID %d, the reader of slot %q (%s); fix: GRANT pg_signal_backend TO %s; or run every bridge instance of this source as the same role (a superuser's walsender can be ended only by a superuser)",
				sources.ErrEvictDenied, role, holder.PID, slot, detail, pgx.Identifier{role}.Sanitize())
		}
		return fmt.Errorf("ending PID %d, the reader of slot %q: %w", holder.PID, slot, err)
	}
	_ = signalled // false: it exited meanwhile (Postgres warns "not a PostgreSQL backend process"); the wait below sees it
	t := time.NewTicker(evictPoll)
	defer t.Stop()
	for {
		cur, err := readHolder(ctx, c, slot)
		if err != nil {
			return err
		}
		if !cur.Same(holder) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("PID %d, the reader of slot %q, was asked to end but still holds it: %w", holder.PID, slot, ctx.Err())
		case <-t.C:
		}
	}
}

var _ sources.Evicter = (*Source)(nil)
