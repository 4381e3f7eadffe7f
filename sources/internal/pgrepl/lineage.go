package pgrepl

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources"
)

// Failovers and timelines. A promotion starts a new timeline at the point
// where the standby's WAL ended (its switch point); a failover slot
// (PostgreSQL 17) carries on there with the position the standby had
// synced. What the old primary sent past that point is not in the new
// history, and START_REPLICATION from a position past it would have
// Postgres skip every commit of the new timeline below that position,
// without a word. So Open compares the lineage the checkpoint was
// recorded under with the server's history before it streams.

// Expect implements sources.Lineaged.
func (s *Source) Expect(l sources.Lineage, end cdc.LSN) {
	s.expect, s.expectEnd = l, end
}

// Lineage implements sources.Lineaged.
func (s *Source) Lineage() sources.Lineage { return s.lineage }

// identify reads the server's lineage: IDENTIFY_SYSTEM on the replication
// connection (the current timeline, which pg_control_checkpoint() shows
// only after the next checkpoint) and pg_is_in_recovery().
func (s *Source) identify(ctx context.Context) error {
	sys, err := pglogrepl.IdentifySystem(ctx, s.repl)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	var standby bool
	if err := s.cat.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
		return fmt.Errorf("reading pg_is_in_recovery(): %w", err)
	}
	s.lineage = sources.Lineage{SystemID: sys.SystemID, Timeline: uint32(sys.Timeline), Standby: standby}
	return nil
}

// forks returns, for each ancestor timeline of the server's current one,
// the position where its successor forked off it (TIMELINE_HISTORY).
func (s *Source) forks(ctx context.Context, tli uint32) (map[uint32]cdc.LSN, error) {
	out := map[uint32]cdc.LSN{}
	if tli <= 1 {
		return out, nil // timeline 1 has no history file
	}
	h, err := pglogrepl.TimelineHistory(ctx, s.repl, int32(tli))
	if err != nil {
		return nil, fmt.Errorf("TIMELINE_HISTORY %d: %w", tli, err)
	}
	return parseHistory(h.Content)
}

// parseHistory parses a timeline history file: lines of "<parent tli>
// <switch point> <reason>", comments after #.
func parseHistory(b []byte) (map[uint32]cdc.LSN, error) {
	out := map[uint32]cdc.LSN{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		tli, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("timeline history line %q: %w", sc.Text(), err)
		}
		sp, err := cdc.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("timeline history line %q: %w", sc.Text(), err)
		}
		out[uint32(tli)] = sp
	}
	return out, sc.Err()
}

// lineageKind is judgeLineage's verdict.
type lineageKind int

const (
	lineageSame     lineageKind = iota // nothing recorded, nothing streamed, or the same timeline
	lineageHolds                       // the timeline changed, but the server's history holds the whole stream
	lineagePromoted                    // the standby the source read through its own slot was promoted
	lineageLacks                       // the server lacks part of the stream: another system, or a fork before the stream's end
)

// lineageJudgement says how a server's lineage stands to the one a
// checkpoint was recorded under.
type lineageJudgement struct {
	kind lineageKind
	// note names the failover or the other system ("" for lineageSame);
	// reason is the SlotLostError reason of lineageLacks.
	note, reason string
	// switchPoint is where the server's history left the checkpoint's
	// timeline (known only when forked is true).
	switchPoint cdc.LSN
	forked      bool
}

// judgeLineage judges the server's lineage cur against exp, recorded with
// the checkpoint at from, the stream ending at end (at or past from).
// forks is the server's history (forks): called only when the timelines
// differ. slotExists and synced describe the slot (a synced copy of a
// failover slot, on a promoted standby).
func judgeLineage(exp, cur sources.Lineage, from, end cdc.LSN, slotExists, synced bool, forks func() (map[uint32]cdc.LSN, error)) (lineageJudgement, error) {
	if exp == (sources.Lineage{}) || end == 0 {
		return lineageJudgement{}, nil // nothing recorded, or nothing streamed under this epoch
	}
	if exp.SystemID != "" && exp.SystemID != cur.SystemID {
		return lineageJudgement{kind: lineageLacks, reason: "system_changed",
			note: fmt.Sprintf("the server is another database system (system_identifier %s; the checkpoint at %s was recorded on %s): "+
				"a restore from another cluster's backup, or a DSN that points at another cluster", cur.SystemID, from, exp.SystemID)}, nil
	}
	if exp.Timeline == 0 || exp.Timeline == cur.Timeline {
		return lineageJudgement{}, nil
	}
	fs, err := forks()
	if err != nil {
		return lineageJudgement{}, err
	}
	sp, ok := fs[exp.Timeline]
	j := lineageJudgement{kind: lineageLacks, reason: "failover", switchPoint: sp, forked: ok,
		note: fmt.Sprintf("a failover (or a point-in-time recovery) happened: the server is on timeline %d, the checkpoint was recorded on timeline %d", cur.Timeline, exp.Timeline)}
	if ok {
		j.note += fmt.Sprintf(", which its history left at %s", sp)
	} else {
		j.note += fmt.Sprintf(", which is not in its history (%v)", fs)
	}
	switch {
	case ok && end <= sp:
		j.kind = lineageHolds
	case ok && exp.Standby && slotExists && !synced:
		// The stream was read from a standby, through a slot made on it
		// (not a synced copy), and that standby was promoted: what it
		// decoded past the switch point is its own new timeline.
		j.kind = lineagePromoted
	}
	return j, nil
}

// lacksWhat is the complaint of a lineageLacks judgement j on a stream
// ending at end.
func (j lineageJudgement) lacksWhat(end cdc.LSN) string {
	if j.reason != "failover" {
		return j.note
	}
	return j.note + fmt.Sprintf("; but the stream holds changes up to %s, past that point: this server never got the changes "+
		"published after it (the old primary sent them before its standby had them: synchronized_standby_slots was not set), "+
		"and streaming on from the checkpoint would skip every commit of the new timeline below %s", end, end)
}

// checkLineage compares the server's lineage (identify) with the one the
// checkpoint at from was recorded under (Expect), the stream ending at
// the larger of from and Expect's end (judgeLineage). It returns a note
// naming the failover when the timeline changed (for the messages of a
// slot missing after one), and an error when the server's history does
// not hold the whole stream and the slot exists: a *SetupError under
// on_slot_lost: fail, a *sources.SlotLostError (Keep) under recreate. A
// missing slot is left to slotLost.
func (s *Source) checkLineage(ctx context.Context, si SlotInfo, from cdc.LSN) (note string, err error) {
	exp, cur := s.expect, s.lineage
	end := max(from, s.expectEnd)
	j, err := judgeLineage(exp, cur, from, end, si.Exists, si.Synced, func() (map[uint32]cdc.LSN, error) { return s.forks(ctx, cur.Timeline) })
	if err != nil {
		return "", err
	}
	switch j.kind {
	case lineageSame:
		return "", nil
	case lineageHolds:
		s.log.Warn("failover: the server's timeline changed since the checkpoint; the stream ends before the switch point, so the server has all of it: streaming on",
			"slot", s.cfg.Slot, "timeline", cur.Timeline, "checkpoint_timeline", exp.Timeline, "switch_point", j.switchPoint.String(), "stream_end", end.String(),
			"slot_exists", si.Exists, "synced", si.Synced)
		return j.note, nil
	case lineagePromoted:
		s.log.Warn("the standby this source reads was promoted; its slot carries on",
			"slot", s.cfg.Slot, "timeline", cur.Timeline, "checkpoint_timeline", exp.Timeline, "switch_point", j.switchPoint.String(), "stream_end", end.String())
		return j.note, nil
	}
	if j.reason == "failover" && !si.Exists {
		return j.note, nil // slotLost reports it, naming the failover
	}
	return j.note, s.diverged(ctx, si, from, end, j.lacksWhat(end), j.reason)
}

// diverged is checkLineage's error for an existing slot: stop under
// on_slot_lost: fail; under recreate, a new epoch from the slot's
// confirmed position.
func (s *Source) diverged(ctx context.Context, si SlotInfo, from, end cdc.LSN, what, reason string) error {
	if !si.Exists {
		return nil
	}
	if s.cfg.OnSlotLost != SlotLostRecreate {
		return &SetupError{What: fmt.Sprintf("source %q, slot %q of database %q: %s", s.name, s.cfg.Slot, s.database, what), Fix: s.divergedFix(si, reason)}
	}
	var walEnd cdc.LSN
	var cur string
	if err := s.cat.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text`).Scan(&cur); err == nil {
		walEnd, _ = cdc.ParseLSN(cur)
	}
	return &sources.SlotLostError{Slot: s.cfg.Slot, Database: s.database, Reason: reason, Checkpoint: from, WALEnd: walEnd,
		Detail: what, Keep: true}
}

// divergedFix is the fix diverged gives under on_slot_lost: fail.
func (s *Source) divergedFix(si SlotInfo, reason string) string {
	recreate := fmt.Sprintf("set on_slot_lost: recreate on source %q and restart: the bridge publishes a resync message and streams again "+
		"from the slot's confirmed position (%s) under a new epoch (consumers re-read; what this server lacks stays in the stream "+
		"under the old epoch)", s.name, si.ConfirmedFlush)
	if reason == "system_changed" {
		return "if the DSN is wrong, point it back at the cluster the checkpoint was recorded on; if this cluster replaces that one, " + recreate
	}
	return recreate + "; set synchronized_standby_slots on the primary to prevent it (docs/sources.md#failover)"
}

// createSlot creates the slot, as a failover slot when configured
// (PostgreSQL 17 and later), and returns its consistent point.
func (s *Source) createSlot(ctx context.Context) (cdc.LSN, error) {
	if !s.cfg.Failover {
		res, err := pglogrepl.CreateReplicationSlot(ctx, s.repl, s.cfg.Slot, s.plugin.Name(),
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
		if err != nil {
			return 0, fmt.Errorf("creating slot %q: %w", s.cfg.Slot, err)
		}
		cp, _ := cdc.ParseLSN(res.ConsistentPoint)
		return cp, nil
	}
	if err := s.needFailover(ctx); err != nil {
		return 0, err
	}
	// pglogrepl has no FAILOVER option: the PostgreSQL 17 syntax.
	sql := fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL %s (SNAPSHOT 'nothing', FAILOVER true)",
		pgx.Identifier{s.cfg.Slot}.Sanitize(), pgx.Identifier{s.plugin.Name()}.Sanitize())
	res, err := s.repl.Exec(ctx, sql).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("creating failover slot %q: %w", s.cfg.Slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 2 {
		return 0, fmt.Errorf("creating failover slot %q: unexpected answer to %s", s.cfg.Slot, sql)
	}
	return cdc.ParseLSN(string(res[0].Rows[0][1]))
}

// needFailover refuses failover: true before PostgreSQL 17.
func (s *Source) needFailover(ctx context.Context) error {
	var num int
	var version string
	if err := s.cat.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version); err != nil {
		return fmt.Errorf("reading server_version_num: %w", err)
	}
	if num < 170000 {
		return &SetupError{
			What: fmt.Sprintf("source %q has failover: true, but failover slots need PostgreSQL 17 or later and database %q runs %s", s.name, s.database, version),
			Fix: fmt.Sprintf("remove failover from sources.%s.config (before 17 a slot does not survive a failover: the bridge stops, "+
				"or resyncs under on_slot_lost: recreate, naming the failover), or upgrade to PostgreSQL 17", s.name),
		}
	}
	return nil
}

// alterFailover makes an existing slot a failover slot (ALTER_REPLICATION_SLOT,
// PostgreSQL 17) when failover is configured and it is not one.
func (s *Source) alterFailover(ctx context.Context, si SlotInfo) error {
	if !s.cfg.Failover || si.Failover {
		return nil
	}
	if err := s.needFailover(ctx); err != nil {
		return err
	}
	if si.Synced {
		return &SetupError{What: fmt.Sprintf("slot %q on this server is a synced copy of a standby (synced = true) but not a failover slot", s.cfg.Slot),
			Fix: "connect the source to the primary"}
	}
	sql := fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", pgx.Identifier{s.cfg.Slot}.Sanitize())
	if _, err := s.repl.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("making slot %q a failover slot: %w", s.cfg.Slot, err)
	}
	s.log.Info("made the replication slot a failover slot (failover: true)", "slot", s.cfg.Slot)
	return nil
}
