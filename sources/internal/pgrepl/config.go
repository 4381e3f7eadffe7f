// Package pgrepl is the replication core shared by the pgoutput and wal2json
// sources: setup checks, publication and slot management, START_REPLICATION,
// the receive loop with keepalives, and standby status updates that report
// only what the pipeline acknowledged. A source plugin supplies a Decoder.
package pgrepl

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/pgnet"
)

// Config is the configuration block shared by Postgres sources.
type Config struct {
	// DSN is a libpq connection string or URL. Required. Its password is
	// never logged. libpq's TCP parameters apply to the bridge's sockets:
	// tcp_user_timeout (ms, default 20000), keepalives (default 1),
	// keepalives_idle (s, default 10), keepalives_interval (s, default 5),
	// keepalives_count (default 3); 0 leaves the system's value.
	DSN string `koanf:"dsn"`
	// Slot is the logical replication slot name. Default "bridge_<source name>".
	Slot string `koanf:"slot"`
	// CreateSlot creates the slot (permanent) when it is missing. Default true.
	CreateSlot bool `koanf:"create_slot"`
	// Publication is the publication to stream (pgoutput). Default "bridge_<source name>".
	Publication string `koanf:"publication"`
	// CreatePublication creates the publication when missing, before the slot. Default true.
	CreatePublication bool `koanf:"create_publication"`
	// Tables, as "schema.table", go into a created publication (and into
	// wal2json's add-tables filter); empty means all tables.
	Tables []string `koanf:"tables"`
	// MessagePrefixes selects pg_logical_emit_message messages to emit as
	// changes; empty means none.
	MessagePrefixes []string `koanf:"message_prefixes"`
	// StatusInterval between standby status updates. Default 10s.
	StatusInterval time.Duration `koanf:"status_interval"`
	// Buffer is how many decoded transactions may wait for the pipeline. Default 64.
	Buffer int `koanf:"buffer"`
	// CatchUpReadDelay is how long the replication reader waits before
	// reading again once it has read everything received, while it catches
	// up with a backlog (the last transaction it decoded arrived more than
	// 100 ms after its commit, by the bridge's clock): the walsender meanwhile
	// fills the socket, so that one read takes many transactions instead
	// of one message, which costs the bridge and the walsender less CPU per
	// change of small transactions. Following live changes, however rare,
	// the reader reads at once. A duration up to 10ms; 0 turns it off.
	// Default 200us.
	CatchUpReadDelay time.Duration `koanf:"catch_up_read_delay"`
	// StreamInProgress (pgoutput, Postgres 14 and later) has Postgres send
	// a large transaction while it runs, once its changes pass
	// logical_decoding_work_mem, instead of decoding it into files of its
	// own (pg_replslot) and sending it after its commit: the bridge keeps
	// it (memory, then a file in spill_dir) and publishes it when its
	// commit arrives. It moves that disk use from the database server to
	// the bridge, at about twice the bridge's CPU per change of such a
	// transaction. Default false: a large transaction is then published
	// while Postgres sends it after its commit. wal2json ignores it.
	StreamInProgress bool `koanf:"stream_in_progress"`
	// SpillChanges is how many changes of one transaction are held in
	// memory before it goes to a temporary file; a transaction that passes
	// it (or spill_bytes) keeps only its first 64 changes in memory. A
	// transaction of more than 1000 changes is handed to the sinks while
	// it arrives and never spills past its 1000th, so this matters only
	// below 1000. Default 2048.
	SpillChanges int `koanf:"spill_changes"`
	// SpillBytes is how many bytes of row data of one transaction (up to
	// its 1000th change) are held in memory before it goes to a temporary
	// file. Default 16MiB.
	SpillBytes int64 `koanf:"spill_bytes"`
	// SpillDir holds the temporary files; default the system's temp dir.
	SpillDir string `koanf:"spill_dir"`
	// OnSlotLost is what to do when the slot a checkpoint depends on was
	// dropped or invalidated (wal_status = lost): "fail" (default) stops
	// with the error and the SQL to fix it; "recreate" drops an invalidated
	// slot, creates a new one, starts a new epoch and publishes a resync
	// control message before any change of it (changes in between are lost;
	// consumers re-read).
	OnSlotLost string `koanf:"on_slot_lost"`
	// Failover creates the slot as a failover slot (PostgreSQL 17 and
	// later; an error before), which standbys with sync_replication_slots
	// keep in sync, so that it survives the promotion of one; an existing
	// slot is altered to be one. A failover that loses none of the stream
	// also needs synchronized_standby_slots on the primary
	// (docs/sources.md#failover). Default false.
	Failover bool `koanf:"failover"`
	// ReceiveTimeout is how long the replication connection may stay
	// silent (no data, no keepalive, though the bridge asks for one every
	// status_interval) before the bridge asks Postgres, over its catalog
	// connection, what the walsender does: busy decoding a large
	// transaction (it answers nothing meanwhile), the bridge waits on and
	// asks again; idle, gone, sending what never arrives, or no answer
	// within a few seconds, the connection is taken as lost, its
	// walsender ended (so the slot is free at once) and the bridge
	// redials. A duration. Default 0: the larger of 20s and two
	// status_intervals; else at least twice status_interval.
	ReceiveTimeout time.Duration `koanf:"receive_timeout"`
	// HeartbeatInterval, when > 0, writes a non-transactional logical
	// message (prefix HeartbeatPrefix, never published) into the source's
	// database that often, so that an idle database still moves the slot and
	// lag stays measurable. Default 0 (off).
	HeartbeatInterval time.Duration `koanf:"heartbeat_interval"`
	// Snapshot configures snapshots: reading the tables' current rows into
	// the stream as "read" changes (docs/snapshots.md).
	Snapshot SnapshotConfig `koanf:"snapshot"`
}

// DefaultReceiveTimeout is receive_timeout's default (with the default
// status_interval): a dead replication connection is noticed 10 to 20 s
// after its link died (the last answer came at most a status_interval
// before), plus a probe of at most 5 s when the catalog connection died
// with it, plus lostGrace (1 s). A walsender busy with a large transaction is not taken for
// dead however long it stays silent (silence.go), so the timeout need not
// exceed its silences.
const DefaultReceiveTimeout = 20 * time.Second

// DefaultCatchUpReadDelay is catch_up_read_delay's default. On the
// benchmark's 200,000 single-row transactions it took the bridge's CPU per
// change from 11.7–13.7 to 9.2–10.1 µs (docs/performance.md).
const DefaultCatchUpReadDelay = 200 * time.Microsecond

// maxCatchUpReadDelay bounds catch_up_read_delay: the socket holds what
// the walsender sends in a few milliseconds, and a longer wait only
// leaves the walsender blocked on it.
const maxCatchUpReadDelay = 10 * time.Millisecond

// HeartbeatPrefix is the pg_logical_emit_message prefix of heartbeats.
const HeartbeatPrefix = "bridge_heartbeat"

// The on_slot_lost policies.
const (
	SlotLostFail     = "fail"
	SlotLostRecreate = "recreate"
)

// DefaultConfig returns the defaults for source name.
func DefaultConfig(name string) Config {
	return Config{
		Slot:              "bridge_" + name,
		CreateSlot:        true,
		Publication:       "bridge_" + name,
		CreatePublication: true,
		StatusInterval:    10 * time.Second,
		Buffer:            64,
		CatchUpReadDelay:  DefaultCatchUpReadDelay,
		SpillChanges:      2048,
		SpillBytes:        16 << 20,
		OnSlotLost:        SlotLostFail,
		Snapshot:          DefaultSnapshotConfig(),
	}
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
var tableRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$`)

// Validate checks the block; errors carry their key.
func (c *Config) Validate() error {
	var errs []error
	if c.DSN == "" {
		errs = append(errs, config.Field("dsn", "must be set (for example postgres://user@host:5432/db)"))
	} else if pc, err := pgconn.ParseConfig(c.DSN); err != nil {
		// ParseConfig reads the DSN (and PG* variables, a passfile or a
		// service file it names) without connecting; its error hides the
		// password.
		hint := "write a URL (postgres://user:pass@host:5432/db?sslmode=require) or key=value pairs (host=db port=5432 dbname=app)"
		if msg := err.Error(); strings.Contains(msg, "failed to configure TLS") && !strings.Contains(msg, "sslmode is invalid") {
			hint = "sslrootcert, sslcert and sslkey must name PEM files the bridge can read (sslcert and sslkey together)"
		}
		errs = append(errs, config.Field("dsn", "%s; %s", config.Redact(err.Error()), hint))
	} else if _, err := pgnet.Take(pc.RuntimeParams); err != nil {
		errs = append(errs, config.Field("dsn", "%s: libpq's TCP parameter, which the bridge applies to its own sockets", err))
	}
	if !identRE.MatchString(c.Slot) {
		errs = append(errs, config.Field("slot", "%q is not a valid slot name: lower-case letters, digits and _ only, at most 63", c.Slot))
	}
	if !identRE.MatchString(c.Publication) {
		errs = append(errs, config.Field("publication", "%q is not a valid publication name: lower-case letters, digits and _ only, at most 63", c.Publication))
	}
	for i, t := range c.Tables {
		if !tableRE.MatchString(t) {
			errs = append(errs, config.Field("tables", "entry %d %q must be schema.table", i, t))
		}
	}
	if c.StatusInterval <= 0 {
		errs = append(errs, config.Field("status_interval", "must be > 0, got %s", c.StatusInterval))
	}
	if c.SpillChanges <= 0 {
		errs = append(errs, config.Field("spill_changes", "must be > 0, got %d", c.SpillChanges))
	}
	if c.SpillBytes <= 0 {
		errs = append(errs, config.Field("spill_bytes", "must be > 0, got %d", c.SpillBytes))
	}
	if c.OnSlotLost != SlotLostFail && c.OnSlotLost != SlotLostRecreate {
		errs = append(errs, config.Field("on_slot_lost", "must be %q or %q, got %q", SlotLostFail, SlotLostRecreate, c.OnSlotLost))
	}
	if c.ReceiveTimeout != 0 && c.ReceiveTimeout < 2*c.StatusInterval {
		errs = append(errs, config.Field("receive_timeout", "must be at least twice status_interval (%s), got %s", c.StatusInterval, c.ReceiveTimeout))
	}
	if c.HeartbeatInterval < 0 {
		errs = append(errs, config.Field("heartbeat_interval", "must be >= 0 (0 is off), got %s", c.HeartbeatInterval))
	}
	if c.CatchUpReadDelay < 0 || c.CatchUpReadDelay > maxCatchUpReadDelay {
		errs = append(errs, config.Field("catch_up_read_delay", "must be between 0 (off) and %s, got %s", maxCatchUpReadDelay, c.CatchUpReadDelay))
	}
	if c.Buffer <= 0 {
		errs = append(errs, config.Field("buffer", "must be > 0, got %d", c.Buffer))
	}
	errs = append(errs, c.Snapshot.validate()...)
	return errors.Join(errs...)
}

// AddPrefixes returns configured with the prefixes of extra (sources.Env's
// MessagePrefixes) that it does not already cover; "*" covers all.
func AddPrefixes(configured, extra []string) []string {
	if slices.Contains(configured, "*") {
		return configured
	}
	out := configured
	for _, p := range extra {
		if p != "" && !slices.Contains(out, p) {
			out = append(slices.Clip(out), p)
		}
	}
	return out
}

// receiveTimeout is ReceiveTimeout with its default applied.
func (c *Config) receiveTimeout() time.Duration {
	if c.ReceiveTimeout > 0 {
		return c.ReceiveTimeout
	}
	return max(DefaultReceiveTimeout, 2*c.StatusInterval)
}
