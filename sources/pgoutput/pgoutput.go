// Package pgoutput is the "pgoutput" source: Postgres logical replication
// through the built-in pgoutput plugin and a publication: protocol version
// 1, or version 2 with streaming of large in-progress transactions on
// Postgres 14 and later when stream_in_progress is set (streaming.go).
package pgoutput

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

func init() {
	sources.MustRegister("pgoutput", sources.Plugin{
		New:    New,
		Config: pgrepl.DefaultConfig("<name>"),
		Doc:    "PostgreSQL logical replication with the built-in pgoutput plugin and a publication",
	})
}

// New builds a pgoutput source from its config block; it does no I/O.
func New(decode config.Decoder, env sources.Env) (sources.Source, error) {
	cfg := pgrepl.DefaultConfig(env.Name)
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	cfg.MessagePrefixes = pgrepl.AddPrefixes(cfg.MessagePrefixes, env.MessagePrefixes)
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return pgrepl.New(cfg, env, &plugin{cfg: cfg, source: env.Name, log: log}), nil
}

type plugin struct {
	cfg    pgrepl.Config
	source string
	log    *slog.Logger
	// streaming: the server streams transactions before their commit
	// (Postgres 14 and later, stream_in_progress on); set by Prepare.
	streaming bool
}

func (p *plugin) Name() string { return "pgoutput" }

func (p *plugin) Prepare(ctx context.Context, cat *pgx.Conn, log *slog.Logger) error {
	p.streaming = false
	if p.cfg.StreamInProgress {
		var v int
		if err := cat.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
			return fmt.Errorf("reading the server version: %w", err)
		}
		p.streaming = v >= 140000 // protocol version 2 and streaming came with Postgres 14
		if !p.streaming {
			log.Warn("stream_in_progress needs Postgres 14 or later: large transactions are sent after their commit",
				"source", p.source, "server_version_num", v)
		}
	}
	return pgrepl.EnsurePublication(ctx, cat, log, p.source, p.cfg.Publication, p.cfg.Tables, p.cfg.CreatePublication)
}

func (p *plugin) Check(ctx context.Context, cat *pgx.Conn) ([]config.Check, []string, error) {
	_, tables, checks, err := pgrepl.PublicationChecks(ctx, cat, p.source, p.cfg.Publication, p.cfg.Tables, p.cfg.CreatePublication)
	return checks, tables, err
}

func (p *plugin) Args() []string {
	args := []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", p.cfg.Publication)}
	if p.streaming {
		// Large transactions arrive while they run (streaming.go).
		args = []string{"proto_version '2'", "streaming 'on'", fmt.Sprintf("publication_names '%s'", p.cfg.Publication)}
	}
	if len(p.cfg.MessagePrefixes) > 0 {
		args = append(args, "messages 'true'")
	}
	return args
}

func (p *plugin) NewDecoder(cat *pgx.Conn) pgrepl.Decoder {
	return &decoder{
		log: p.log,
		cat: cat,
		buf: pgrepl.NewTxnBuffer(p.cfg.SpillDir, p.cfg.SpillChanges, p.cfg.SpillBytes),
		spill: func() *pgrepl.TxnBuffer {
			return pgrepl.NewTxnBuffer(p.cfg.SpillDir, p.cfg.SpillChanges, p.cfg.SpillBytes)
		},
		streams:  map[uint32]*inflight{},
		source:   p.source,
		prefixes: p.cfg.MessagePrefixes,
		types:    pgtypes.NewResolver(cat),
		rels:     map[uint32]*cdc.Relation{},
		types2:   map[uint32][]*pgtypes.Type{},
	}
}

// decoder turns pgoutput protocol v1 messages into transactions.
type decoder struct {
	log      *slog.Logger
	cat      *pgx.Conn
	source   string
	prefixes []string
	types    *pgtypes.Resolver
	rels     map[uint32]*cdc.Relation
	types2   map[uint32][]*pgtypes.Type

	attrsWarned bool // the catalog could not say which columns are NOT NULL (warned once)

	in   bool
	txn  *cdc.Txn
	buf  *pgrepl.TxnBuffer
	size int // approximate bytes of the change being decoded

	// Transactions Postgres streams before their commit (streaming.go).
	spill    func() *pgrepl.TxnBuffer // a buffer for one of them
	inStream bool                     // between a stream start and stop
	subXid   uint32                   // the (sub)transaction of the message being decoded
	streams  map[uint32]*inflight     // by top-level xid
	cur      *inflight                // the one of the current block
}

func (d *decoder) InTxn() bool { return d.in || d.inStream }

func (d *decoder) Buffer() *pgrepl.TxnBuffer { return d.buf }

func (d *decoder) Decode(ctx context.Context, walStart cdc.LSN, data []byte) (*cdc.Txn, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("empty pgoutput message at %s", walStart)
	}
	if rawKind(data[0]) {
		return d.decodeRaw(walStart, data) // raw.go
	}
	if streamKind(data[0]) {
		return d.decodeStream(walStart, data) // streaming.go
	}
	msg, err := d.parse(data)
	if err != nil {
		return nil, fmt.Errorf("parsing pgoutput message %q: %w", string(data[:1]), err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		return nil, d.relation(ctx, m)
	case *pglogrepl.TypeMessage, *pglogrepl.OriginMessage:
		// Types are resolved from the catalog; origins are not needed.
	case *pglogrepl.TruncateMessage:
		// One change per table; the transaction may be handed over at any
		// of them (cdc.Txn returned once).
		var live *cdc.Txn
		for _, id := range m.RelationIDs {
			rel, _, err := d.rel(id)
			if err != nil {
				return nil, err
			}
			t, err := d.add(cdc.Change{Op: cdc.OpTruncate, Rel: rel, Schema: rel.Schema, Table: rel.Table, LSN: walStart,
				Cascade:         m.Option&pglogrepl.TruncateOptionCascade != 0,
				RestartIdentity: m.Option&pglogrepl.TruncateOptionRestartIdentity != 0})
			if err != nil {
				return nil, err
			}
			if t != nil {
				live = t
			}
		}
		return live, nil
	case *pglogrepl.LogicalDecodingMessage:
		if !d.wanted(m.Prefix) {
			return nil, nil
		}
		c := cdc.Change{Op: cdc.OpMessage, LSN: cdc.LSN(m.LSN), Prefix: m.Prefix,
			Content: append([]byte(nil), m.Content...), Transactional: m.Transactional}
		if m.Transactional && (d.in || d.inStream) {
			return d.add(c)
		}
		// A non-transactional message is a transaction of its own. Its
		// identity is its LSN + 1: never a record boundary, so it cannot
		// collide with a commit end LSN, and it orders after that commit.
		lsn := cdc.LSN(m.LSN) + 1
		c.Source, c.CommitLSN, c.TxSize = d.source, lsn, 1
		return &cdc.Txn{CommitLSN: lsn, Changes: []cdc.Change{c}}, nil
	}
	return nil, nil
}

func (d *decoder) wanted(prefix string) bool {
	if prefix == pgrepl.HeartbeatPrefix {
		return false // the bridge's own heartbeat: never published
	}
	for _, p := range d.prefixes {
		if p == "*" || p == prefix {
			return true
		}
	}
	return false
}

func (d *decoder) add(c cdc.Change) (*cdc.Txn, error) {
	c.Source = d.source
	if d.inStream {
		return nil, d.addStreamed(c) // streaming.go
	}
	if d.txn == nil {
		// Not reachable with pgoutput v1: changes come between begin and commit.
		d.txn = &cdc.Txn{}
		d.in = true
	}
	size := d.size + len(c.Content) + 64
	d.size = 0
	return d.buf.Add(c, size)
}

// relation records a table's description. Its columns, their types and
// modifiers, key flags and replica identity are the Relation message's,
// as of the change that follows it. The message does not say which
// columns are NOT NULL, nor, with REPLICA IDENTITY FULL (every column
// flagged), which form the primary key: those are read from the catalog
// now, which may be newer than the change (cdc.Relation.Inferred;
// docs/schemas.md).
func (d *decoder) relation(ctx context.Context, m *pglogrepl.RelationMessage) error {
	rel := &cdc.Relation{ID: m.RelationID, Schema: m.Namespace, Table: m.RelationName, ReplicaIdentity: m.ReplicaIdentity,
		Columns: make([]cdc.Column, len(m.Columns)), Inferred: cdc.InferredNotNull}
	types := make([]*pgtypes.Type, len(m.Columns))
	for i, col := range m.Columns {
		t, err := d.types.Lookup(ctx, col.DataType)
		if err != nil {
			return fmt.Errorf("resolving type %d of column %s.%s.%s: %w", col.DataType, m.Namespace, m.RelationName, col.Name, err)
		}
		decl, err := d.types.DeclaredMod(ctx, col.DataType, col.TypeModifier)
		if err != nil {
			return fmt.Errorf("formatting the type of column %s.%s.%s: %w", m.Namespace, m.RelationName, col.Name, err)
		}
		types[i] = t
		rel.Columns[i] = cdc.Column{Name: col.Name, Type: t.Name, OID: col.DataType, Declared: decl, Key: col.Flags&1 != 0}
	}
	attrs, err := attributes(ctx, d.cat, m.RelationID)
	if err != nil {
		if m.ReplicaIdentity == 'f' || ctx.Err() != nil {
			return fmt.Errorf("reading the columns of %s.%s: %w", m.Namespace, m.RelationName, err)
		}
		// NOT NULL is informative (the schema registry's shapes): without
		// the catalog (its connection closed by idle_session_timeout, say)
		// the columns count as nullable.
		if !d.attrsWarned {
			d.attrsWarned = true
			d.log.Warn("cannot read which columns are NOT NULL from the catalog; they count as nullable", "table", m.Namespace+"."+m.RelationName, "error", err)
		}
	}
	for i := range rel.Columns {
		rel.Columns[i].NotNull = attrs[rel.Columns[i].Name].notNull
	}
	if m.ReplicaIdentity == 'f' {
		// With REPLICA IDENTITY FULL pgoutput flags every column; the key
		// consumers want is the primary key.
		rel.Inferred |= cdc.InferredKey
		for i := range rel.Columns {
			rel.Columns[i].Key = attrs[rel.Columns[i].Name].pk
		}
	}
	d.warnIdentity(rel)
	// A new Relation message replaces the old description; changes already
	// decoded keep their pointer to the old one.
	d.rels[m.RelationID] = rel
	d.types2[m.RelationID] = types
	return nil
}

func (d *decoder) rel(id uint32) (*cdc.Relation, []*pgtypes.Type, error) {
	rel, ok := d.rels[id]
	if !ok {
		return nil, nil, fmt.Errorf("change for relation %d before its Relation message", id)
	}
	return rel, d.types2[id], nil
}

// attr is what the catalog says of a column that the Relation message
// does not.
type attr struct{ notNull, pk bool }

// attributes reads, by column name, which columns of relation oid are NOT
// NULL and which form its primary key, as the catalog has them now (none
// when the table is gone).
func attributes(ctx context.Context, cat *pgx.Conn, oid uint32) (map[string]attr, error) {
	rows, err := cat.Query(ctx, `SELECT a.attname::text, a.attnotnull, EXISTS (SELECT 1 FROM pg_catalog.pg_index i
		WHERE i.indrelid = a.attrelid AND i.indisprimary AND a.attnum = ANY (i.indkey))
		FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`, oid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]attr{}
	for rows.Next() {
		var n string
		var a attr
		if err := rows.Scan(&n, &a.notNull, &a.pk); err != nil {
			return nil, err
		}
		out[n] = a
	}
	return out, rows.Err()
}

// warnIdentity reports, when a table's description arrives with a replica
// identity that cannot carry its updates and deletes (the application's
// UPDATE and DELETE on it fail while it is published), what to run. It
// warns again only when the identity changes.
func (d *decoder) warnIdentity(rel *cdc.Relation) {
	if old, ok := d.rels[rel.ID]; ok && old.ReplicaIdentity == rel.ReplicaIdentity {
		return
	}
	q := pgx.Identifier{rel.Schema, rel.Table}.Sanitize()
	name := rel.Schema + "." + rel.Table
	switch rel.ReplicaIdentity {
	case 'n':
		d.log.Warn("table has REPLICA IDENTITY NOTHING: its UPDATEs and DELETEs fail in the application while it is published, and reach no consumer",
			"table", name, "fix", "ALTER TABLE "+q+" REPLICA IDENTITY DEFAULT; (with a primary key) or ALTER TABLE "+q+" REPLICA IDENTITY FULL;")
	case 'd':
		for _, c := range rel.Columns {
			if c.Key {
				return
			}
		}
		d.log.Warn("table has no primary key: its UPDATEs and DELETEs fail in the application while it is published, and changes carry no key",
			"table", name, "fix", "ALTER TABLE "+q+" REPLICA IDENTITY FULL; (or add a primary key)")
	}
}
