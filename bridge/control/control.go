package control

import (
	"errors"
	"fmt"
	"time"
)

// ServiceName is the name every bridge registers its service under
// (`nats micro ls`, `nats micro info bridge`).
const ServiceName = "bridge"

// The actions, the last token of an endpoint's subject (before the source,
// for the actions on one source).
const (
	ActionStatus   = "status"
	ActionSources  = "sources"
	ActionReload   = "reload"
	ActionPause    = "pause"
	ActionResume   = "resume"
	ActionSnapshot = "snapshot"
	ActionResync   = "resync"
)

// SourceActions are the actions on one source: their subjects end with
// the source's name, and only the instance holding the source answers.
var SourceActions = []string{ActionPause, ActionResume, ActionSnapshot, ActionResync}

// BridgeActions are the actions every instance of a bridge answers.
var BridgeActions = []string{ActionStatus, ActionSources, ActionReload}

// Subject returns the subject of an action of bridge: "bridge.<bridge>.<action>".
func Subject(bridge, action string) string { return "bridge." + bridge + "." + action }

// SourceSubject returns the subject of an action on source:
// "bridge.<bridge>.<action>.<source>".
func SourceSubject(bridge, action, source string) string {
	return Subject(bridge, action) + "." + source
}

// InstanceHeader addresses a request on one source to one instance (its
// instance id, as Sources replies name it): that instance acts if it runs
// the source, holding it or not. Without it, only the holder answers.
const InstanceHeader = "Bridge-Instance"

// Error codes of the Nats-Service-Error-Code header.
const (
	CodeBadRequest = "400" // the request does not decode or names nothing valid
	CodeNotFound   = "404" // no such source in the bridge's configuration
	CodeConflict   = "409" // the source's state does not allow it now
	CodeInvalid    = "422" // a reload refused: the new configuration is invalid
	CodeFailed     = "500" // the action failed
	CodeTimeout    = "504" // the action is under way but did not finish in time
)

// Error is an endpoint's refusal or failure: Code and Description travel
// in the Nats-Service-Error-Code and Nats-Service-Error headers, Details
// (a configuration's problems, one per line) in the JSON body.
type Error struct {
	Code        string   `json:"code"`
	Description string   `json:"error"`
	Details     []string `json:"details,omitempty"`
	// Instance is the instance that answered (filled by the client).
	Instance string `json:"instance,omitempty"`
}

func (e *Error) Error() string {
	msg := e.Description
	for _, d := range e.Details {
		msg += "\n" + d
	}
	return msg
}

// Errorf returns an *Error with code.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Description: fmt.Sprintf(format, args...)}
}

// ErrNoAnswer is returned (wrapped) by the client when no bridge answered:
// none runs, none holds the source, or none answered in time.
var ErrNoAnswer = errors.New("no bridge answered")

// Identity names the instance that answers.
type Identity struct {
	// Bridge is the bridge's name.
	Bridge string `json:"bridge"`
	// Instance is the process's instance id (its run id, as checkpoints
	// record it).
	Instance string `json:"instance"`
	// Version is the bridge's version.
	Version string `json:"version,omitempty"`
}

// Slot is a source's replication slot as the bridge's slot poller last
// read it.
type Slot struct {
	Name             string    `json:"name"`
	Exists           bool      `json:"exists"`
	Active           bool      `json:"active"`
	RetainedWALBytes uint64    `json:"retained_wal_bytes"`
	WALStatus        string    `json:"wal_status,omitempty"`
	CurrentWALLSN    string    `json:"current_wal_lsn,omitempty"`
	PolledAt         time.Time `json:"polled_at"`
}

// SourceStatus is one source as the instance running it sees it.
type SourceStatus struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// State: starting, streaming, draining, paused, retrying, standby,
	// fenced, stopped, done.
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Holder is true for the instance holding the source (streaming, or
	// paused by it): the one that answers the actions on the source.
	Holder bool `json:"holder"`
	// LastError is the error that ended the last run, with its fix where
	// one is known.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	Epoch       string     `json:"epoch,omitempty"`
	// Checkpoint is the checkpointed LSN this process last saw.
	Checkpoint string `json:"checkpoint"`
	// ConfigRev is the configuration revision the source routes by.
	ConfigRev string `json:"config_rev"`
	// Paused, with its reason, who and when: the operator's pause.
	Paused      bool       `json:"paused"`
	PauseReason string     `json:"pause_reason,omitempty"`
	PausedBy    string     `json:"paused_by,omitempty"`
	PausedAt    *time.Time `json:"paused_at,omitempty"`
	// Delivered counts the changes this process delivered.
	Delivered uint64 `json:"delivered"`
	// Sinks are the sinks the source's routes reach; Streams the
	// JetStream streams among them ("sink: stream").
	Sinks   []string `json:"sinks"`
	Streams []string `json:"streams"`
	// Slot is null for a source without a polled slot, or before the
	// first poll.
	Slot *Slot `json:"slot,omitempty"`
	// LagBytes is the WAL between the last polled WAL end and the
	// checkpoint.
	LagBytes *uint64 `json:"lag_bytes,omitempty"`
	// Held are the tables a breaking schema change holds
	// (on_schema_change; docs/schemas.md); absent when none.
	Held []HeldTable `json:"held,omitempty"`
}

// HeldTable is a table whose breaking schema change a route holds until
// the operator resumes the source.
type HeldTable struct {
	Table       string `json:"table"` // schema.table
	Version     int    `json:"version"`
	RegistryKey string `json:"registry_key"`
	// Policy: "pause" (the source is paused before the change) or
	// "dead_letter" (the table's changes go to dead-letter subjects).
	Policy string    `json:"policy"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason"`
	// DeadLettered counts the table's changes put on dead-letter subjects
	// by this instance.
	DeadLettered uint64 `json:"dead_lettered"`
}

// StatusReply answers status.
type StatusReply struct {
	Identity
	// ConfigRev is the revision of the configuration in effect; ConfigFrom
	// says where it was read ("file bridge.yaml", "kv bucket/key revision 7").
	ConfigRev  string         `json:"config_rev"`
	ConfigFrom string         `json:"config_from"`
	Started    time.Time      `json:"started"`
	Sources    []SourceStatus `json:"sources"`
	// Fleet is the fleet the instance is a member of (bridge run --fleet),
	// absent outside a fleet; its Sources are then those it holds a lease on.
	Fleet string `json:"fleet,omitempty"`
}

// SourceInfo is one source in a SourcesReply.
type SourceInfo struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	State  string `json:"state"`
	Holder bool   `json:"holder"`
}

// SourcesReply answers sources.
type SourcesReply struct {
	Identity
	Sources []SourceInfo `json:"sources"`
}

// PauseRequest asks to pause a source.
type PauseRequest struct {
	// Reason is recorded with the pause.
	Reason string `json:"reason,omitempty"`
	// By names who asks (a user, a tool); recorded with the pause.
	By string `json:"by,omitempty"`
	// Wait bounds the wait for the transaction boundary, as a Go duration
	// ("30s", the default).
	Wait string `json:"wait,omitempty"`
}

// ResumeRequest asks to resume a source.
type ResumeRequest struct {
	By   string `json:"by,omitempty"`
	Wait string `json:"wait,omitempty"`
}

// SourceReply answers pause and resume: the source's state after it.
type SourceReply struct {
	Identity
	Source SourceStatus `json:"source"`
}

// SnapshotRequest asks for a snapshot of tables of a source.
type SnapshotRequest struct {
	// Tables are "schema.table" names (a bare name is public's); empty:
	// every table the source streams.
	Tables []string `json:"tables,omitempty"`
	// Where limits the rows read: conditions on columns joined with AND,
	// in the restricted form docs/snapshots.md describes (column op
	// literal; never SQL).
	Where string `json:"where,omitempty"`
	// By names who asks (a user, a tool); logged with the request.
	By string `json:"by,omitempty"`
}

// SnapshotReply answers snapshot: the queued request.
type SnapshotReply struct {
	Identity
	Source string   `json:"source"`
	ID     string   `json:"id"`
	Tables []string `json:"tables"`
	Where  string   `json:"where,omitempty"`
}

// ResyncRequest asks for an operator resync of a source.
type ResyncRequest struct {
	Reason string `json:"reason,omitempty"`
	Wait   string `json:"wait,omitempty"`
}

// ResyncReply answers resync.
type ResyncReply struct {
	Identity
	Source   string `json:"source"`
	Producer string `json:"producer"`
}

// ReloadReply answers reload (a refused reload is an Error with code 422
// whose Details are the problems).
type ReloadReply struct {
	Identity
	// Revision is the configuration revision in effect after the reload;
	// Previous the one before (equal: nothing changed).
	Revision string `json:"revision"`
	Previous string `json:"previous"`
	// Changes says what the reload did, one line each (a route swapped at
	// a transaction boundary, a source restarted, added, removed).
	Changes []string `json:"changes"`
}

// Wait parses a request's wait ("": def).
func Wait(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("wait: %q is not a positive duration such as \"30s\"", s)
	}
	return d, nil
}
