package schema

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// DDL events (docs/schemas.md#ddl-events): the event trigger that `bridge
// setup ddl` installs (DDLSetupSQL) writes each DDL command into the WAL
// as a transactional logical message with prefix cdc.DDLPrefix, one per
// table the command concerns (one with no table for a command on none).
// The sources decode it in WAL order; the pipeline publishes it as a DDL
// event (cdc.OpDDL) at its own position in its transaction.

// DDLObject is an object a DDL command created, altered or dropped, as
// pg_event_trigger_ddl_commands() and pg_event_trigger_dropped_objects()
// describe it.
type DDLObject struct {
	// Type is Postgres' object type: "table", "index", "table column",
	// "sequence", "function", …
	Type string `json:"type"`
	// Identity is the object's identity, as Postgres spells it
	// ("public.orders", "public.orders.note", "orders_pkey on public.orders").
	Identity string `json:"identity"`
	// Schema is the object's schema; "" for an object in none.
	Schema string `json:"schema,omitempty"`
	// Table is the table the object is or belongs to; nil for none.
	Table *DDLTable `json:"table,omitempty"`
	// InExtension: created by an extension's script (created objects).
	InExtension bool `json:"in_extension,omitempty"`
	// Original: named by the command itself rather than dropped with
	// something it named (dropped objects).
	Original bool `json:"original,omitempty"`
}

// DDLTable names a table.
type DDLTable struct {
	Schema string `json:"schema"`
	Name   string `json:"name"`
}

// DDLMessage is the content of a DDL message, as the trigger writes it.
type DDLMessage struct {
	// V is the version of the message's layout: 1.
	V int `json:"v"`
	// Tag is the command tag: "CREATE TABLE", "ALTER TABLE", …
	Tag string `json:"tag"`
	// DDL is the text of the statement the client sent (current_query():
	// a query string of several statements arrives whole).
	DDL string `json:"ddl"`
	// Schema and Table name the table this message is for; Table is nil
	// for a command on no table (Schema is then its objects' schema, or
	// "").
	Schema string  `json:"schema"`
	Table  *string `json:"table"`
	// Objects are what the command created or altered; Dropped what it
	// dropped.
	Objects []DDLObject `json:"objects"`
	Dropped []DDLObject `json:"dropped"`
	// User is the role that ran the command (session_user), SearchPath
	// its search_path (to resolve the unqualified names of DDL).
	User       string `json:"user"`
	SearchPath string `json:"search_path"`
}

// ParseDDL decodes a DDL message's content.
func ParseDDL(content []byte) (DDLMessage, error) {
	var m DDLMessage
	if err := json.Unmarshal(content, &m); err != nil {
		return DDLMessage{}, fmt.Errorf("a %q logical message that is not the bridge's DDL JSON: %w", cdc.DDLPrefix, err)
	}
	if m.V < 1 || m.Tag == "" {
		return DDLMessage{}, fmt.Errorf("a %q logical message without v and tag: not the bridge's DDL JSON", cdc.DDLPrefix)
	}
	if m.Objects == nil {
		m.Objects = []DDLObject{}
	}
	if m.Dropped == nil {
		m.Dropped = []DDLObject{}
	}
	return m, nil
}

// TableName returns m's table, "" for a command on no table.
func (m *DDLMessage) TableName() string {
	if m.Table == nil {
		return ""
	}
	return *m.Table
}

// DDLEvent is the payload of a DDL event (op "ddl") in the native and
// cloudevents formats.
type DDLEvent struct {
	Op     string `json:"op"` // "ddl"
	Source string `json:"source"`
	// Schema and Table: the table the command concerns; Table is null for
	// a command on no table.
	Schema     string      `json:"schema"`
	Table      *string     `json:"table"`
	CommitLSN  string      `json:"commit_lsn"`
	Seq        uint32      `json:"seq"`
	TxSize     *uint32     `json:"tx_size"`
	Xid        uint32      `json:"xid"`
	CommitTime time.Time   `json:"commit_time"`
	Tag        string      `json:"tag"`
	DDL        string      `json:"ddl"`
	Objects    []DDLObject `json:"objects"`
	Dropped    []DDLObject `json:"dropped"`
	User       string      `json:"user"`
	SearchPath string      `json:"search_path"`
}

// NewDDLEvent returns the event of m, decoded from the message change c.
func NewDDLEvent(m DDLMessage, c *cdc.Change) DDLEvent {
	e := DDLEvent{Op: string(cdc.OpDDL), Source: c.Source, Schema: m.Schema, Table: m.Table,
		CommitLSN: c.CommitLSN.String(), Seq: c.Seq, Xid: c.Xid, CommitTime: c.CommitTime.UTC(),
		Tag: m.Tag, DDL: m.DDL, Objects: m.Objects, Dropped: m.Dropped, User: m.User, SearchPath: m.SearchPath}
	if c.TxSize > 0 {
		n := c.TxSize
		e.TxSize = &n
	}
	return e
}
