package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/pgslot"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
)

// Report is what `bridge status` reports; `-o json` prints it with
// these field names, which are stable. Unknown values are null.
type Report struct {
	// Bridge is the bridge name.
	Bridge string `json:"bridge"`
	// NATS is the NATS server the checkpoint was read from (credentials
	// redacted); for an embedded server that was not running, the one
	// status started on its store for the time of the query.
	NATS string `json:"nats"`
	// OK is true when every query succeeded.
	OK bool `json:"ok"`
	// Sources are sorted by name.
	Sources []Source `json:"sources"`
	// Via says where the running state came from: "control" (the bridge's
	// instances answered on Subject) or "direct" (none did: slot,
	// checkpoint and streams were read directly, the state is unknown).
	Via string `json:"via"`
	// Subject is the control subject asked.
	Subject string `json:"subject"`
	// ControlError is why no instance answered, when Via is "direct".
	ControlError string `json:"control_error,omitempty"`
	// Instances are the running instances that answered, by id.
	Instances []Instance `json:"instances"`
}

// Instance is a running process of the bridge, as it answered.
type Instance struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	// ConfigRev is the revision of its configuration; ConfigFrom where it
	// read it.
	ConfigRev  string    `json:"config_rev"`
	ConfigFrom string    `json:"config_from"`
	Started    time.Time `json:"started"`
	// Fleet is the fleet it is a member of (bridge run --fleet).
	Fleet string `json:"fleet,omitempty"`
}

// Running is a source's state as the instance running it reported it.
type Running struct {
	// State: starting, streaming, draining, paused, retrying, standby,
	// fenced, stopped, done.
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Instance is the instance reporting it: the holder when one holds
	// the source.
	Instance string `json:"instance"`
	Holder   bool   `json:"holder"`
	// LastError is the error that ended its last run, with its fix.
	LastError string `json:"last_error,omitempty"`
	// ConfigRev is the configuration revision the source routes by.
	ConfigRev string `json:"config_rev"`
	// Paused, with its reason, who and when: the operator's pause.
	Paused      bool       `json:"paused"`
	PauseReason string     `json:"pause_reason,omitempty"`
	PausedBy    string     `json:"paused_by,omitempty"`
	PausedAt    *time.Time `json:"paused_at,omitempty"`
	// Others are the other instances running the source: "id: state".
	Others []string `json:"others,omitempty"`
	// Held are the tables a breaking schema change holds (schemas,
	// on_schema_change).
	Held []control.HeldTable `json:"held,omitempty"`
}

// Source is one source's state.
type Source struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Slot is null for a source without a dsn, or when Postgres could not be
	// queried.
	Slot *Slot `json:"slot"`
	// Checkpoint is null when NATS could not be queried.
	Checkpoint *Checkpoint `json:"checkpoint"`
	// Streams are the nats_jetstream sinks the source's routes reach.
	Streams []Stream `json:"streams"`
	// LagBytes is the WAL between the server's WAL end and the checkpoint;
	// null when either is unknown.
	LagBytes *uint64 `json:"lag_bytes"`
	// Errors are the queries that failed, credentials redacted.
	Errors []string `json:"errors"`
	// Snapshot is the snapshot progress; null when the
	// source never snapshotted or NATS could not be queried.
	Snapshot *snapshot.Status `json:"snapshot"`
	// Running is the state the bridge's instances reported; null when
	// none answered or none runs the source.
	Running *Running `json:"running"`
}

// Slot is the source's replication slot (pg_replication_slots).
type Slot struct {
	Name              string `json:"name"`
	Exists            bool   `json:"exists"`
	Active            bool   `json:"active"`
	ActivePID         int    `json:"active_pid"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	RestartLSN        string `json:"restart_lsn"`
	RetainedWALBytes  uint64 `json:"retained_wal_bytes"`
	WALStatus         string `json:"wal_status"`
	SafeWALBytes      *int64 `json:"safe_wal_bytes"`
	CurrentWALLSN     string `json:"current_wal_lsn"`
}

// Checkpoint is the source's checkpoint in the KV bucket.
type Checkpoint struct {
	Bucket     string     `json:"bucket"`
	Key        string     `json:"key"`
	Exists     bool       `json:"exists"`
	LSN        string     `json:"lsn"`
	Epoch      string     `json:"epoch"`
	Run        string     `json:"run"`
	UpdatedAt  *time.Time `json:"updated_at"`
	AgeSeconds *float64   `json:"age_seconds"`
}

// Stream is a JetStream stream a source's changes go to.
type Stream struct {
	Sink     string     `json:"sink"`
	Stream   string     `json:"stream"`
	Exists   bool       `json:"exists"`
	Messages uint64     `json:"messages"`
	Bytes    uint64     `json:"bytes"`
	FirstSeq uint64     `json:"first_seq"`
	LastSeq  uint64     `json:"last_seq"`
	LastTime *time.Time `json:"last_time"`
	Error    string     `json:"error,omitempty"`
}

// Query reads the state of every source of cfg. It needs no running
// bridge for what Postgres and an external NATS hold. With nats.url empty
// (the embedded server) it reads the checkpoint and streams from the
// embedded server of the running bridge (FindNATS); with no bridge running
// they are reported unknown, with an error saying so, and the slot is still
// read.
func Query(ctx context.Context, cfg *config.Config) *Report {
	rep := &Report{Bridge: cfg.Name, OK: true}
	env, natsErr := FindNATS(cfg)
	rep.NATS = config.Redact(env.URL)
	base := natsconn.Env(env)
	type conn struct {
		c  natsconn.Conn
		nc *nats.Conn
	}
	var conns []conn
	defer func() {
		for _, c := range conns {
			c.nc.Close()
		}
	}()
	connect := func(c natsconn.Conn) (jetstream.JetStream, error) {
		for _, o := range conns {
			if o.c.Same(c) {
				return jetstream.New(o.nc)
			}
		}
		nc, err := natsconn.Connect(c, "bridge "+cfg.Name+" status", nats.Timeout(5*time.Second), nats.MaxReconnects(0))
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn{c, nc})
		return jetstream.New(nc)
	}

	for _, name := range slices.Sorted(maps.Keys(cfg.Sources)) {
		sc := cfg.Sources[name]
		st := Source{Name: name, Type: sc.Type, Streams: []Stream{}, Errors: []string{}}
		fail := func(err error) { st.Errors = append(st.Errors, err.Error()) }

		var walEnd uint64
		if src, ok := pgslot.SourceOf(name, sc); ok {
			if row, err := pgslot.ReadOnce(ctx, src, "bridge:status"); err != nil {
				fail(err)
			} else {
				st.Slot = &Slot{
					Name: src.Slot, Exists: row.Exists, Active: row.Active, ActivePID: row.ActivePID,
					RetainedWALBytes: row.Retained(), WALStatus: row.WALStatus, SafeWALBytes: row.SafeWALSize,
					CurrentWALLSN: row.CurrentWAL.String(),
				}
				if row.Exists {
					st.Slot.ConfirmedFlushLSN, st.Slot.RestartLSN = row.ConfirmedFlush.String(), row.RestartLSN.String()
				}
				walEnd = uint64(row.CurrentWAL)
			}
		}

		if natsErr != nil {
			fail(natsErr)
		} else if js, err := connect(base); err != nil {
			fail(err)
		} else if cs, err := statusCheckpoint(ctx, js, cfg.Checkpoint.Bucket, checkpoint.Key(cfg.Name, name)); err != nil {
			fail(err)
		} else {
			st.Checkpoint = cs
			if ss, err := snapshot.ReadStatus(ctx, js, cfg.Checkpoint.Bucket, cfg.Name, name); err != nil {
				fail(err)
			} else {
				st.Snapshot = ss
			}
			if cs.Exists && walEnd != 0 {
				l, _ := cdc.ParseLSN(cs.LSN)
				lag := uint64(0)
				if walEnd > uint64(l) {
					lag = walEnd - uint64(l)
				}
				st.LagBytes = &lag
			}
		}

		for _, sn := range cfg.RouteSinks(name) {
			sk := cfg.Sinks[sn]
			if sk.Type != "nats_jetstream" {
				continue
			}
			stream, _ := sk.Config["stream"].(string)
			ss := Stream{Sink: sn, Stream: stream}
			ne, err := natsconn.SinkOf(cfg, sn, env)
			u, _ := sk.Config["url"].(string)
			x, _ := sk.Config["context"].(string)
			if err == nil && natsErr != nil && u == "" && x == "" {
				err = natsErr // the bridge's NATS, which is not there
			}
			if err != nil {
				ss.Error = err.Error()
				st.Streams = append(st.Streams, ss)
				continue
			}
			if err := statusStream(ctx, connect, ne, &ss); err != nil {
				ss.Error = err.Error()
				fail(fmt.Errorf("stream %q of sink %q: %w", stream, sn, err))
			}
			st.Streams = append(st.Streams, ss)
		}
		if len(st.Errors) > 0 {
			rep.OK = false
		}
		rep.Sources = append(rep.Sources, st)
	}
	return rep
}

func statusCheckpoint(ctx context.Context, js jetstream.JetStream, bucket, key string) (*Checkpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cs := &Checkpoint{Bucket: bucket, Key: key}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return cs, nil // never started
	}
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint bucket %q: %w", bucket, err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return cs, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint %q: %w", key, err)
	}
	var s checkpoint.State
	if err := s.UnmarshalJSON(e.Value()); err != nil {
		return nil, fmt.Errorf("decoding checkpoint %q: %w", key, err)
	}
	cs.Exists, cs.LSN, cs.Epoch, cs.Run = true, s.LSN.String(), s.Epoch, s.Run
	if !s.UpdatedAt.IsZero() {
		at := s.UpdatedAt.UTC()
		age := time.Since(at).Seconds()
		cs.UpdatedAt, cs.AgeSeconds = &at, &age
	}
	return cs, nil
}

func statusStream(ctx context.Context, connect func(natsconn.Conn) (jetstream.JetStream, error), ne natsconn.Conn, ss *Stream) error {
	if ss.Stream == "" {
		return errors.New("the sink has no stream")
	}
	js, err := connect(ne)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, ss.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	ss.Exists = true
	ss.Messages, ss.Bytes, ss.FirstSeq, ss.LastSeq = info.State.Msgs, info.State.Bytes, info.State.FirstSeq, info.State.LastSeq
	if !info.State.LastTime.IsZero() {
		t := info.State.LastTime.UTC()
		ss.LastTime = &t
	}
	return nil
}

// statePriority orders states for the instance a source's Running is
// taken from when no instance holds it: the most telling first.
var statePriority = []string{"streaming", "draining", "paused", "retrying", "fenced", "stopped", "done", "starting", "standby"}

// Merge adds what the bridge's instances answered on the status endpoint
// (replies; subject the subject asked; err why none answered) to rep,
// and records which path was used.
func (rep *Report) Merge(subject string, replies []control.StatusReply, err error) {
	rep.Subject, rep.Instances = subject, []Instance{}
	if len(replies) == 0 {
		rep.Via = "direct"
		if err != nil {
			rep.ControlError = err.Error()
		}
		return
	}
	rep.Via = "control"
	for _, r := range replies {
		rep.Instances = append(rep.Instances, Instance{ID: r.Instance, Version: r.Version, ConfigRev: r.ConfigRev, ConfigFrom: r.ConfigFrom, Started: r.Started, Fleet: r.Fleet})
	}
	for i := range rep.Sources {
		src := &rep.Sources[i]
		type seen struct {
			inst string
			s    control.SourceStatus
		}
		var all []seen
		for _, r := range replies {
			for _, s := range r.Sources {
				if s.Name == src.Name {
					all = append(all, seen{r.Instance, s})
				}
			}
		}
		if len(all) == 0 {
			continue
		}
		best := 0
		rank := func(x seen) int {
			if x.s.Holder {
				return -1
			}
			if i := slices.Index(statePriority, x.s.State); i >= 0 {
				return i
			}
			return len(statePriority)
		}
		for j := range all {
			if rank(all[j]) < rank(all[best]) {
				best = j
			}
		}
		b := all[best]
		run := &Running{State: b.s.State, Since: b.s.Since, Instance: b.inst, Holder: b.s.Holder, LastError: b.s.LastError,
			ConfigRev: b.s.ConfigRev, Paused: b.s.Paused, PauseReason: b.s.PauseReason, PausedBy: b.s.PausedBy, PausedAt: b.s.PausedAt,
			Held: b.s.Held}
		for j, x := range all {
			if j != best {
				run.Others = append(run.Others, x.inst+": "+x.s.State)
			}
		}
		src.Running = run
	}
}

// FindNATS returns how a helper command (status, serve, snapshot, pause,
// reload, validate --connect...) reaches cfg's NATS server: nats.url (or
// nats.context's) with the nats section's credentials, or, when they are
// empty, the embedded server of a running `bridge run`, found through the
// address it records in data_dir (or the configured nats.embedded host and
// port), with the key it requires (natsembed.KeyFile in data_dir) unless
// nats.user or nats.token are set. It never starts a server: with nats.url
// empty and no bridge running there is no NATS, and the error says what to
// start.
func FindNATS(cfg *config.Config) (sinks.NATSEnv, error) {
	ne := sinks.NATSEnv{URL: cfg.NATS.URL, NATSClient: cfg.NATS.NATSClient}
	if cfg.NATS.URL != "" {
		return ne, nil
	}
	if cfg.NATS.Context != "" {
		c, err := natsconn.Resolve("nats", "", cfg.NATS.NATSClient)
		if err != nil {
			return ne, err
		}
		ne.URL = c.URL
		return ne, nil
	}
	e := cfg.NATS.Embedded
	host := e.Host
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	fallback := ""
	if e.Port > 0 {
		fallback = "nats://" + net.JoinHostPort(host, strconv.Itoa(e.Port))
	} else if e.Port == 0 {
		fallback = "nats://" + net.JoinHostPort(host, "4222")
	}
	url, err := natsembed.Running(cfg.DataDir, fallback)
	if err != nil {
		where := filepath.Join(cfg.DataDir, natsembed.AddrFile)
		if fallback != "" {
			where = fallback + " nor " + where
		}
		return ne, fmt.Errorf("nats.url is empty, so NATS is the embedded server of `bridge run`, and none is running (nothing at %s): start `bridge run` with this config first, or set nats.url to a NATS server", where)
	}
	ne.URL = url
	if ne.User == "" && ne.Token == "" {
		if ne.NKeySeedFile, err = natsembed.ClientKey(cfg.DataDir); err != nil {
			return ne, err
		}
	}
	return ne, nil
}

// Print writes rep for people.
func Print(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "bridge %s (NATS %s)\n", rep.Bridge, orDash(rep.NATS))
	switch rep.Via {
	case "control":
		fmt.Fprintf(w, "via         the control endpoint %s: %d instance(s) answered\n", rep.Subject, len(rep.Instances))
		for _, in := range rep.Instances {
			fmt.Fprintf(w, "  instance  %s, version %s, config %s (%s), up %s\n", in.ID, orDash(in.Version), orDash(in.ConfigRev),
				orDash(in.ConfigFrom), time.Since(in.Started).Round(time.Second))
		}
	case "direct":
		why := "no bridge answered"
		if rep.ControlError != "" {
			why = rep.ControlError
		}
		fmt.Fprintf(w, "via         direct reads of Postgres and the bucket (%s): the running state is unknown\n", why)
	}
	for _, s := range rep.Sources {
		fmt.Fprintf(w, "\nsource %s (%s)\n", s.Name, s.Type)
		if r := s.Running; r != nil {
			state := r.State
			if r.Paused {
				state += " by " + orDash(r.PausedBy)
				if r.PauseReason != "" {
					state += " (" + r.PauseReason + ")"
				}
			}
			fmt.Fprintf(w, "  state       %s on instance %s for %s, config %s\n", state, r.Instance, time.Since(r.Since).Round(time.Second), orDash(r.ConfigRev))
			for _, o := range r.Others {
				fmt.Fprintf(w, "  also        %s\n", o)
			}
			if r.LastError != "" {
				fmt.Fprintf(w, "  last error  %s\n", r.LastError)
			}
			for _, h := range r.Held {
				dl := ""
				if h.Policy == "dead_letter" {
					dl = fmt.Sprintf(", %d change(s) dead-lettered", h.DeadLettered)
				}
				fmt.Fprintf(w, "  held        %s version %d (%s) by on_schema_change: %s for %s%s: bridge schema diff %s --source %s, then bridge resume %s\n",
					h.Table, h.Version, h.RegistryKey, h.Policy, time.Since(h.Since).Round(time.Second), dl, h.Table, s.Name, s.Name)
			}
		}
		if sl := s.Slot; sl != nil {
			if !sl.Exists {
				fmt.Fprintf(w, "  slot        %s: does not exist (WAL end %s)\n", sl.Name, sl.CurrentWALLSN)
			} else {
				act := "inactive"
				if sl.Active {
					act = fmt.Sprintf("active (pid %d)", sl.ActivePID)
				}
				fmt.Fprintf(w, "  slot        %s: %s, confirmed_flush %s, restart %s, retained %s, wal_status %s\n",
					sl.Name, act, sl.ConfirmedFlushLSN, sl.RestartLSN, humanBytes(sl.RetainedWALBytes), orDash(sl.WALStatus))
			}
		}
		if c := s.Checkpoint; c != nil {
			if !c.Exists {
				fmt.Fprintf(w, "  checkpoint  none yet (%s in bucket %s)\n", c.Key, c.Bucket)
			} else {
				age := ""
				if c.AgeSeconds != nil {
					age = fmt.Sprintf(", written %s ago", (time.Duration(*c.AgeSeconds * float64(time.Second))).Round(time.Second))
				}
				fmt.Fprintf(w, "  checkpoint  %s, epoch %s%s\n", c.LSN, c.Epoch, age)
			}
		}
		if s.LagBytes != nil {
			fmt.Fprintf(w, "  lag         %s\n", humanBytes(*s.LagBytes))
		}
		printSnapshotStatus(w, s.Snapshot)
		for _, st := range s.Streams {
			switch {
			case st.Error != "":
				fmt.Fprintf(w, "  stream      %s (sink %s): %s\n", st.Stream, st.Sink, st.Error)
			case !st.Exists:
				fmt.Fprintf(w, "  stream      %s (sink %s): does not exist yet\n", st.Stream, st.Sink)
			default:
				fmt.Fprintf(w, "  stream      %s (sink %s): %d messages, %s, last seq %d\n", st.Stream, st.Sink, st.Messages, humanBytes(st.Bytes), st.LastSeq)
			}
		}
		for _, e := range s.Errors {
			fmt.Fprintf(w, "  error       %s\n", e)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func printSnapshotStatus(w io.Writer, s *snapshot.Status) {
	if s == nil {
		return
	}
	state := "none running"
	if s.Running {
		state = fmt.Sprintf("%s (%s) running", s.ID, s.Reason)
	} else if s.LastID != "" {
		outcome := s.LastOutcome
		if outcome == "" {
			outcome = "finished"
		}
		state = fmt.Sprintf("last %s (%s) %s", s.LastID, s.Reason, outcome)
		if s.LastError != "" {
			state += ": " + s.LastError
		}
	}
	if s.Queued > 0 {
		state += fmt.Sprintf(", %d queued", s.Queued)
	}
	fmt.Fprintf(w, "  snapshot    %s\n", state)
	for _, t := range s.Tables {
		eta := "unknown"
		if t.ETASeconds != nil {
			eta = (time.Duration(*t.ETASeconds) * time.Second).String()
		}
		fmt.Fprintf(w, "    %s: %d/%d rows, %.0f rows/s, eta %s, done %t\n", t.Table, t.Rows, t.Estimate, t.RowsPerS, eta, t.Done)
	}
}
