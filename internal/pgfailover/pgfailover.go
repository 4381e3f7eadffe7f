// Package pgfailover reads whether a logical replication slot will survive
// the failover of its primary (PostgreSQL 17 failover slots): on the
// primary, the slot's failover flag and synchronized_standby_slots; on each
// other host a multi-host DSN names, whether it is a standby holding a
// synced copy of the slot that a promotion keeps. `bridge validate
// --connect` and the slot metrics both read it.
package pgfailover

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Standby is what one host of the DSN says about the slot's copy.
type Standby struct {
	// Addr is the host's "host:port".
	Addr string
	// Err is set when the host could not be read (down, refused).
	Err error
	// InRecovery is false for a primary: its other fields are then unset.
	InRecovery bool
	// SyncSlots and Feedback are the standby's sync_replication_slots
	// and hot_standby_feedback.
	SyncSlots, Feedback bool
	// Exists, Synced and Temporary describe its copy of the slot: a
	// promotion keeps only a synced copy that is not temporary (a new
	// copy stays temporary until the standby's catalog xmin allows it).
	Exists, Synced, Temporary bool
}

// Survives reports whether a promotion of this standby keeps the slot.
func (s Standby) Survives() bool {
	return s.Err == nil && s.InRecovery && s.Exists && s.Synced && !s.Temporary
}

// Hosts returns the "host:port" of each host cfg names, in order, without
// repeats (TLS fallbacks repeat a host).
func Hosts(cfg *pgx.ConnConfig) []string {
	var out []string
	seen := map[string]bool{}
	add := func(h string, p uint16) {
		a := net.JoinHostPort(h, strconv.Itoa(int(p)))
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	add(cfg.Host, cfg.Port)
	for _, f := range cfg.Fallbacks {
		add(f.Host, f.Port)
	}
	return out
}

// ReadStandbys connects to each host of cfg apart from the others (any
// session, read-only or not), each within 5 s, and reads the slot's copy
// on those in recovery. It returns one Standby per host, primaries
// included (InRecovery false).
func ReadStandbys(ctx context.Context, cfg *pgx.ConnConfig, slot string) []Standby {
	var out []Standby
	for _, addr := range Hosts(cfg) {
		out = append(out, readOne(ctx, cfg, addr, slot))
	}
	return out
}

func readOne(ctx context.Context, cfg *pgx.ConnConfig, addr, slot string) Standby {
	st := Standby{Addr: addr}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	c := cfg.Copy()
	c.Host, c.Port = host, uint16(p)
	for _, f := range cfg.Fallbacks {
		if f.Host == host && f.Port == uint16(p) {
			c.TLSConfig = f.TLSConfig
			break
		}
	}
	c.Fallbacks = nil
	c.ValidateConnect = nil // target_session_attrs: read the standbys too
	c.ConnectTimeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, c)
	if err != nil {
		st.Err = err
		return st
	}
	defer conn.Close(context.Background())
	var sync, feedback, exists, synced, temporary *bool
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('sync_replication_slots', true)::bool,
			current_setting('hot_standby_feedback')::bool, s.slot_name IS NOT NULL,
			(to_jsonb(s) ->> 'synced')::bool, s.temporary
		FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).
		Scan(&st.InRecovery, &sync, &feedback, &exists, &synced, &temporary)
	if err != nil {
		st.Err = fmt.Errorf("reading slot %q on %s: %w", slot, addr, err)
		return st
	}
	deref := func(b *bool) bool { return b != nil && *b }
	st.SyncSlots, st.Feedback, st.Exists, st.Synced, st.Temporary = deref(sync), deref(feedback), deref(exists), deref(synced), deref(temporary)
	return st
}
