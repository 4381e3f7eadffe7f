package pgrepl

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgfailover"
)

// failoverChecks says, for `bridge validate --connect`, whether the slot
// will survive a failover: on the primary (cat) its failover flag and
// synchronized_standby_slots; on each other host of the DSN in recovery,
// whether it holds a synced copy a promotion keeps. Nothing when
// failover is off and the slot is not a failover slot.
func (s *Source) failoverChecks(ctx context.Context, cat *pgx.Conn, si SlotInfo) []config.Check {
	if !s.cfg.Failover && !si.Failover {
		return nil
	}
	var num int
	var version string
	var inRecovery bool
	var sss *string
	if err := cat.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version'), pg_is_in_recovery(),
			current_setting('synchronized_standby_slots', true)`).Scan(&num, &version, &inRecovery, &sss); err != nil {
		return []config.Check{{Status: config.CheckFail, What: fmt.Sprintf("reading the failover settings: %v", err)}}
	}
	if num < 170000 {
		return []config.Check{{Status: config.CheckFail,
			What: fmt.Sprintf("source %q has failover: true, but failover slots need PostgreSQL 17 or later; the server runs %s", s.name, version),
			Fix:  fmt.Sprintf("remove failover from sources.%s.config (a failover then ends in a resync under on_slot_lost: recreate), or upgrade to PostgreSQL 17", s.name)}}
	}
	var out []config.Check
	slot := s.cfg.Slot
	switch {
	case !si.Exists:
		out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("slot %q will be created as a failover slot", slot)})
	case !si.Failover:
		out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("slot %q is not a failover slot yet: `bridge run` makes it one (ALTER_REPLICATION_SLOT ... (FAILOVER true))", slot)})
	default:
		out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("slot %q is a failover slot", slot)})
	}
	if !inRecovery {
		if sss == nil || strings.TrimSpace(*sss) == "" {
			out = append(out, config.Check{Status: config.CheckWarn,
				What: "synchronized_standby_slots is not set on the primary: it may send the bridge changes its standbys do not have yet, and after a failover to such a standby the stream holds changes the new primary never got (the bridge then stops, or resyncs under on_slot_lost: recreate)",
				Fix:  "ALTER SYSTEM SET synchronized_standby_slots = '<the standbys'' physical slots, comma-separated>'; SELECT pg_reload_conf();"})
		} else {
			out = append(out, config.Check{Status: config.CheckOK,
				What: fmt.Sprintf("synchronized_standby_slots = '%s': the primary sends changes only once those standbys have them", *sss)})
		}
	}
	ccfg, err := s.connConfig("bridge:" + s.name + ":validate")
	if err != nil {
		return out
	}
	standbys := 0
	for _, st := range pgfailover.ReadStandbys(ctx, ccfg, slot) {
		switch {
		case st.Err != nil:
			out = append(out, config.Check{Status: config.CheckWarn, What: config.Redact(fmt.Sprintf("host %s of the DSN cannot be read: %v", st.Addr, st.Err))})
		case !st.InRecovery:
			continue // the primary
		case st.Survives():
			standbys++
			out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("standby %s holds a synced copy of slot %q: it survives a failover to this standby", st.Addr, slot)})
		default:
			why := "it has no copy yet"
			switch {
			case !st.SyncSlots:
				why = "sync_replication_slots is off there"
			case !st.Feedback:
				why = "hot_standby_feedback is off there, which slot synchronization needs"
			case st.Exists && !st.Synced:
				why = "a slot of that name there is not a synced copy"
			case st.Temporary:
				why = "its copy is still temporary: a new slot syncs once the standby's catalog xmin allows it (commits on the primary move it); a promotion now would drop it"
			}
			out = append(out, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("standby %s holds no synced copy of slot %q: %s; a failover to it ends in a resync (or a stop)", st.Addr, slot, why),
				Fix:  "on the standby: sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name set and dbname in primary_conninfo"})
		}
	}
	if standbys == 0 {
		out = append(out, config.Check{Status: config.CheckWarn,
			What: "no standby in the DSN holds a synced copy of the slot: name the standbys in the DSN (host=primary,standby ... target_session_attrs=read-write) so that the bridge follows a failover and validate can check them"})
	}
	return out
}
