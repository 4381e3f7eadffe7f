package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources"
)

// slotLost applies on_slot_lost to a slot that is invalidated (si.Exists,
// wal_status lost) or missing while a checkpoint at from depends on it. It
// returns nil when the source may go on and create a slot (a lost slot with
// no checkpoint, under recreate), a *SetupError under fail, and a
// *sources.SlotLostError under recreate with a checkpoint, after dropping an
// invalidated slot.
//
// failover, when set, says that a failover happened since the checkpoint
// (checkLineage): a missing slot is then named as one that did not
// survive it.
func (s *Source) slotLost(ctx context.Context, si SlotInfo, from cdc.LSN, failover string) error {
	slot, db := s.cfg.Slot, s.database
	reason := "slot_missing"
	if si.Exists {
		reason = "slot_invalidated"
	} else if failover != "" {
		reason = "failover"
	}
	if s.cfg.OnSlotLost != SlotLostRecreate {
		return s.slotLostError(si, from, db, failover)
	}
	if si.Exists {
		if _, err := s.cat.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
			return fmt.Errorf("dropping invalidated slot %q of database %q to recreate it (on_slot_lost: recreate): %w", slot, db, err)
		}
		s.log.Warn("dropped the invalidated replication slot to recreate it (on_slot_lost: recreate)", "slot", slot, "database", db)
	}
	if from == 0 {
		return nil // nothing was streamed from it under this checkpoint: just create it
	}
	var end string
	if err := s.cat.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		return fmt.Errorf("reading the WAL end: %w", err)
	}
	walEnd, _ := cdc.ParseLSN(end)
	lost := &sources.SlotLostError{Slot: slot, Database: db, Reason: reason, Checkpoint: from, WALEnd: walEnd}
	if reason == "failover" {
		lost.Detail = s.slotLostError(si, from, db, failover).What
	}
	return lost
}

// slotLostError is the error of a slot that is invalidated (si.Exists,
// wal_status lost) or missing while a checkpoint at from depends on it,
// under on_slot_lost: fail: what was lost and the ways out.
//
// failover, when set, names a failover since the checkpoint: the slot is
// missing because it never existed on the new primary.
func (s *Source) slotLostError(si SlotInfo, from cdc.LSN, db, failover string) *SetupError {
	slot := s.cfg.Slot
	what := fmt.Sprintf("slot %q of database %q is missing but the checkpoint is at %s: it was dropped, so the changes after the checkpoint cannot be read any more", slot, db, from)
	if failover != "" && !si.Exists {
		what = fmt.Sprintf("slot %q of database %q is missing after a failover, and the checkpoint is at %s: %s. "+
			"The slot was not copied to this server: before PostgreSQL 17 slots live on the primary only, and on 17 only a failover slot "+
			"(failover: true) synced by a standby with sync_replication_slots survives; the changes after the checkpoint cannot be read from this server", slot, db, from, failover)
	}
	if si.Exists {
		what = fmt.Sprintf("slot %q of database %q is invalidated (wal_status = lost): Postgres removed WAL it still needed (max_slot_wal_keep_size), so the changes after the checkpoint at %s cannot be read any more", slot, db, from)
		if from == 0 {
			what = fmt.Sprintf("slot %q of database %q is invalidated (wal_status = lost): Postgres removed WAL it still needed (max_slot_wal_keep_size)", slot, db)
		}
	}
	fix := fmt.Sprintf("set on_slot_lost: recreate on source %q and restart: the bridge creates the slot anew under a new epoch and publishes a resync message (consumers re-read); or start over by hand: ", s.name)
	if si.Exists {
		fix += fmt.Sprintf("SELECT pg_drop_replication_slot('%s'); then ", slot)
	}
	fix += "delete the checkpoint with `nats kv del <checkpoint bucket> <bridge name>.<source name>` and restart"
	if si.Exists {
		fix += "; raise max_slot_wal_keep_size (or set it to -1) to prevent it"
	}
	return &SetupError{What: what, Fix: fix}
}

// explain turns server errors whose cause is the database's setup into a
// *SetupError with the fix, so the runtime stops with it instead of
// retrying; other errors are returned as they are.
func (s *Source) explain(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	msg := strings.ToLower(pgErr.Message)
	switch {
	case pgErr.Code == "42704" && strings.Contains(msg, "publication"):
		pub := s.cfg.Publication
		return &SetupError{
			What: fmt.Sprintf("publication %q of database %q is gone while slot %q needs it (dropped while streaming?): %s", pub, s.database, s.cfg.Slot, pgErr.Message),
			Fix: fmt.Sprintf("recreate it (%s;). PostgreSQL before 18 cannot decode past the drop with this slot even then: "+
				"skip past it with SELECT pg_replication_slot_advance('%s', pg_current_wal_lsn()); (changes in between are lost, consumers should re-read), "+
				"or drop the slot and restart with on_slot_lost: recreate",
				CreatePublicationSQL(pub, s.cfg.Tables, false), s.cfg.Slot),
		}
	case pgErr.Code == "55000" && strings.Contains(msg, "wal_level"):
		return &SetupError{
			What: fmt.Sprintf("database %q cannot decode slot %q: %s", s.database, s.cfg.Slot, pgErr.Message),
			Fix:  "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
		}
	}
	return err
}

// heartbeat writes a logical message into the database every
// HeartbeatInterval, on its own connection, until ctx ends. Failures are
// logged and retried at the next beat: a heartbeat is never worth a restart.
func (s *Source) heartbeat(ctx context.Context) {
	defer close(s.beat)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
	}()
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, max(s.cfg.HeartbeatInterval, 5*time.Second))
		var err error
		if conn == nil {
			var cc *pgx.ConnConfig
			if cc, err = s.connConfig("bridge:" + s.name + ":heartbeat"); err == nil {
				conn, err = pgx.ConnectConfig(qctx, cc)
			}
		}
		if err == nil {
			_, err = conn.Exec(qctx, `SELECT pg_logical_emit_message(false, $1, now()::text)`, HeartbeatPrefix)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				s.log.Warn("heartbeat failed; retrying at the next beat", "slot", s.cfg.Slot, "err", err)
			}
			failing = true
			if conn != nil {
				cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
				_ = conn.Close(cctx)
				ccancel()
				conn = nil
			}
		default:
			failing = false
		}
	}
}
