package pgrepl

// Snapshots: chunked reads of the published tables between two watermarks
// (DBLog); the runtime interleaves the chunks with the stream
// (bridge/snapshot, docs/snapshots.md).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

// SnapshotConfig is the snapshot block of a Postgres source.
type SnapshotConfig struct {
	// Mode is initial (snapshot every published table at the first start,
	// then stream), never (only `bridge snapshot` snapshots), initial_only
	// (snapshot at the first start, then stop) or when_needed (at the first
	// start and whenever the producer epoch changes). Default never.
	Mode string `koanf:"mode"`
	// ChunkSize is the number of rows read per chunk (keyset pagination by
	// primary key). Default 10000.
	ChunkSize int `koanf:"chunk_size"`
	// ChunkBytes ends a chunk early once its rows hold this many bytes, so
	// very wide rows stay bounded in memory. Default 32MiB.
	ChunkBytes int64 `koanf:"chunk_bytes"`
	// ProgressInterval between progress log lines while a snapshot runs. Default 10s.
	ProgressInterval time.Duration `koanf:"progress_interval"`
	// RequestPoll is how often the running bridge looks for `bridge snapshot`
	// requests in the checkpoint bucket. Default 1s.
	RequestPoll time.Duration `koanf:"request_poll"`
}

// DefaultSnapshotConfig returns the snapshot defaults.
func DefaultSnapshotConfig() SnapshotConfig {
	return SnapshotConfig{Mode: sources.SnapshotNever, ChunkSize: 10000, ChunkBytes: 32 << 20,
		ProgressInterval: 10 * time.Second, RequestPoll: time.Second}
}

func (c *SnapshotConfig) validate() []error {
	var errs []error
	switch c.Mode {
	case sources.SnapshotInitial, sources.SnapshotNever, sources.SnapshotInitialOnly, sources.SnapshotWhenNeeded:
	default:
		errs = append(errs, config.Field("snapshot.mode", "%q is not a snapshot mode: use initial, never, initial_only or when_needed", c.Mode))
	}
	if c.ChunkSize <= 0 {
		errs = append(errs, config.Field("snapshot.chunk_size", "must be > 0, got %d", c.ChunkSize))
	}
	if c.ChunkBytes <= 0 {
		errs = append(errs, config.Field("snapshot.chunk_bytes", "must be > 0, got %d", c.ChunkBytes))
	}
	if c.ProgressInterval <= 0 {
		errs = append(errs, config.Field("snapshot.progress_interval", "must be > 0, got %s", c.ProgressInterval))
	}
	if c.RequestPoll <= 0 {
		errs = append(errs, config.Field("snapshot.request_poll", "must be > 0, got %s", c.RequestPoll))
	}
	return errs
}

var errSnapClosed = errors.New("the source is closed")

// snapState is the snapshot connection and what it learnt of the tables.
type snapState struct {
	mu     sync.Mutex
	conn   *pgx.Conn
	types  *pgtypes.Resolver
	tables map[string]*snapMeta
	// storedGenerated: the publication publishes stored generated
	// columns (PostgreSQL 18's publish_generated_columns = stored), so the
	// snapshot reads them too.
	storedGenerated bool
	// publication: the pgoutput publication whose column lists and row
	// filters (PostgreSQL 15+) the snapshot applies, as the stream does;
	// "" for wal2json and before 15.
	publication string
}

// snapMeta is what a chunk read needs of a table.
type snapMeta struct {
	rel     *cdc.Relation
	types   []*pgtypes.Type
	formats []string // format_type of each column, for casts of parameters
	key     []int    // indexes of the key columns in rel.Columns
	first   string
	next    string
	from    string // SELECT <columns> FROM <table>
	order   string // ORDER BY <key>
	// filter is the publication's row filter for the table, in
	// parentheses; "" when it has none.
	filter string
	// hidden are the table's columns outside the publication's column
	// list, which the snapshot does not read.
	hidden      []string
	publication string
}

// SnapshotOptions implements sources.Snapshotter.
func (s *Source) SnapshotOptions() sources.SnapshotOptions {
	c := s.cfg.Snapshot
	return sources.SnapshotOptions{Mode: c.Mode, ChunkSize: c.ChunkSize, ProgressInterval: c.ProgressInterval, Poll: c.RequestPoll}
}

// snapConn returns the snapshot connection, opening it on first use with the
// text formats of the replication connection, so values decode the same.
func (s *Source) snapConn(ctx context.Context) (*snapState, error) {
	s.snap.mu.Lock()
	defer s.snap.mu.Unlock()
	if s.snap.conn != nil && !s.snap.conn.IsClosed() {
		return &s.snap, nil
	}
	ccfg, err := s.connConfig("bridge:" + s.name + ":snapshot")
	if err != nil {
		return nil, err
	}
	for k, v := range map[string]string{"DateStyle": "ISO, MDY",
		"TimeZone": "UTC", "IntervalStyle": "postgres", "extra_float_digits": "3", "bytea_output": "hex",
		// A watermark's commit flushes the WAL, so the walsender sends it at
		// once rather than after wal_writer_delay.
		"synchronous_commit": "on"} {
		ccfg.RuntimeParams[k] = v
	}
	c, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		return nil, fmt.Errorf("opening the snapshot connection to %s: %w", Redact(s.cfg.DSN), explainConnect(s.cfg.DSN, err))
	}
	stored, publication := false, ""
	if s.plugin.Name() == "pgoutput" {
		var version int
		if err := c.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
			_ = c.Close(ctx)
			return nil, fmt.Errorf("reading the server version: %w", err)
		}
		// Column lists and row filters came with PostgreSQL 15,
		// pg_publication.pubgencols with 18.
		if version >= 150000 {
			publication = s.cfg.Publication
		}
		if stored = version >= 180000; stored {
			err := c.QueryRow(ctx, `SELECT pubgencols::text = 's' FROM pg_catalog.pg_publication WHERE pubname = $1`, s.cfg.Publication).Scan(&stored)
			if errors.Is(err, pgx.ErrNoRows) {
				stored, err = false, nil
			}
			if err != nil {
				_ = c.Close(ctx)
				return nil, fmt.Errorf("reading publish_generated_columns of publication %q: %w", s.cfg.Publication, err)
			}
		}
	}
	s.snap.conn, s.snap.types, s.snap.tables, s.snap.storedGenerated, s.snap.publication = c, pgtypes.NewResolver(c), map[string]*snapMeta{}, stored, publication
	return &s.snap, nil
}

func (s *Source) closeSnapshot(ctx context.Context) {
	s.snap.mu.Lock()
	defer s.snap.mu.Unlock()
	if s.snap.conn != nil {
		_ = s.snap.conn.Close(ctx)
		s.snap.conn = nil
	}
}

// SnapshotTables implements sources.Snapshotter.
func (s *Source) SnapshotTables(ctx context.Context, names []string) ([]sources.SnapshotTable, error) {
	st, err := s.snapConn(ctx)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.conn
	if c == nil {
		return nil, errSnapClosed
	}
	// A new snapshot reads each table's columns, column list and row
	// filter again: they may have changed since the last one on this
	// connection (ALTER TABLE, ALTER PUBLICATION).
	clear(st.tables)
	pgoutput := s.plugin.Name() == "pgoutput"
	// published holds the publication's tables as (schema, table) pairs:
	// "a.b.c" names no table without saying where the schema ends, and a
	// published "a.b".c must not let a request for a."b.c" through.
	var published map[[2]string]bool
	var pairs [][2]string // the tables to read, when the publication's
	if pgoutput {
		rows, err := c.Query(ctx, `SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2`, s.cfg.Publication)
		if err != nil {
			return nil, fmt.Errorf("listing the tables of publication %q: %w", s.cfg.Publication, err)
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
			var p [2]string
			err := r.Scan(&p[0], &p[1])
			return p, err
		})
		if err != nil {
			return nil, fmt.Errorf("listing the tables of publication %q: %w", s.cfg.Publication, err)
		}
		published = map[[2]string]bool{}
		for _, p := range list {
			published[p] = true
		}
		if len(names) == 0 {
			pairs = list
		}
	}
	// Without a publication (wal2json) what streams is tables, its
	// add-tables filter: those exact names; all tables when empty.
	var configured map[string]bool
	if !pgoutput && len(s.cfg.Tables) > 0 {
		configured = map[string]bool{}
		for _, n := range s.cfg.Tables {
			configured[n] = true
		}
	}
	if len(names) == 0 && pairs == nil {
		names = s.cfg.Tables
	}
	if len(names) == 0 && pairs == nil {
		// Unlogged and temporary tables write no WAL: nothing of theirs streams.
		rows, err := c.Query(ctx, `SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1`)
		if err != nil {
			return nil, fmt.Errorf("listing tables: %w", err)
		}
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("listing tables: %w", err)
		}
	}
	var out []sources.SnapshotTable
	var errs []error
	if pairs == nil {
		for _, n := range names {
			schema, table, ok := strings.Cut(n, ".")
			if !ok {
				schema, table = "public", n
			}
			pairs = append(pairs, [2]string{schema, table})
		}
	}
	for _, p := range pairs {
		schema, table := p[0], p[1]
		if published != nil && !published[p] {
			errs = append(errs, &SetupError{
				What: fmt.Sprintf("table %s.%s is not in publication %q, so its changes are not streamed and a snapshot of it could not be kept consistent", schema, table, s.cfg.Publication),
				Fix:  fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pgx.Identifier{s.cfg.Publication}.Sanitize(), pgx.Identifier{schema, table}.Sanitize()),
			})
			continue
		}
		if configured != nil && !configured[schema+"."+table] {
			errs = append(errs, &SetupError{
				What: fmt.Sprintf("table %s.%s is not in sources.%s.config.tables (wal2json's add-tables filter), so its changes are not streamed and a snapshot of it could not be kept consistent", schema, table, s.name),
				Fix:  fmt.Sprintf("add %s.%s to sources.%s.config.tables (a reload applies it), or leave it out of the snapshot", schema, table, s.name),
			})
			continue
		}
		var est float64
		var pk, ri []string
		var kind, persistence string
		err := c.QueryRow(ctx, `SELECT c.reltuples::float8, c.relkind::text, c.relpersistence::text,
			coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE i.indrelid = c.oid AND i.indisprimary), '{}'),
			coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE i.indrelid = c.oid AND i.indisreplident), '{}')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`,
			schema, table).Scan(&est, &kind, &persistence, &pk, &ri)
		if errors.Is(err, pgx.ErrNoRows) {
			errs = append(errs, &SetupError{What: fmt.Sprintf("table %s.%s does not exist", schema, table), Fix: "check the name (schema.table) given to the snapshot"})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the key of %s.%s: %w", schema, table, err)
		}
		if !pgoutput {
			if se, err := unstreamed(ctx, c, schema, table, kind, persistence); err != nil {
				return nil, err
			} else if se != nil {
				errs = append(errs, se)
				continue
			}
		}
		key := pk
		if len(key) == 0 {
			key = ri
		}
		if len(key) == 0 {
			q := pgx.Identifier{schema, table}.Sanitize()
			errs = append(errs, &SetupError{
				What: fmt.Sprintf("table %s.%s has no primary key and no replica identity index: a snapshot cannot read it in key order, nor match its rows with the stream's changes", schema, table),
				Fix: fmt.Sprintf("ALTER TABLE %s ADD PRIMARY KEY (<columns>); or CREATE UNIQUE INDEX <name> ON %s (<not-null columns>); ALTER TABLE %s REPLICA IDENTITY USING INDEX <name>; or leave the table out of the snapshot (bridge snapshot --tables)",
					q, q, q),
			})
			continue
		}
		if est < 0 {
			// Never analyzed (PostgreSQL 14+ reports -1): count once.
			var n int64
			if err := c.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
				return nil, fmt.Errorf("counting the rows of %s.%s: %w", schema, table, err)
			}
			est = float64(n)
		}
		out = append(out, sources.SnapshotTable{Schema: schema, Table: table, Key: key, Estimate: int64(est)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// unstreamed returns why the changes of table schema.table (of relkind
// kind and relpersistence persistence) never reach a source without a
// publication (wal2json), nil when they do: an unlogged or temporary table
// writes no WAL, and a partitioned table's changes are decoded under the
// names of its partitions.
func unstreamed(ctx context.Context, c *pgx.Conn, schema, table, kind, persistence string) (*SetupError, error) {
	q := pgx.Identifier{schema, table}.Sanitize()
	switch {
	case kind == "p":
		rows, err := c.Query(ctx, `SELECT n.nspname::text || '.' || c.relname::text FROM pg_partition_tree($1::regclass) t
			JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.isleaf ORDER BY 1`, q)
		if err != nil {
			return nil, fmt.Errorf("listing the partitions of %s.%s: %w", schema, table, err)
		}
		leaves, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("listing the partitions of %s.%s: %w", schema, table, err)
		}
		fix := "it has no partition yet: leave it out of the snapshot"
		if len(leaves) > 0 {
			fix = "snapshot its partitions instead (--tables " + strings.Join(leaves, ",") + ")"
		}
		return &SetupError{
			What: fmt.Sprintf("table %s.%s is partitioned: wal2json streams its rows' changes under the names of its partitions, so a snapshot of it under its own name could not be kept consistent", schema, table),
			Fix:  fix,
		}, nil
	case persistence == "u":
		return &SetupError{
			What: fmt.Sprintf("table %s.%s is unlogged: its changes are not written to the WAL, so they are never streamed and a snapshot of it could not be kept consistent", schema, table),
			Fix:  fmt.Sprintf("ALTER TABLE %s SET LOGGED; or leave it out of the snapshot", q),
		}, nil
	case persistence != "p":
		return &SetupError{
			What: fmt.Sprintf("table %s.%s is temporary: its changes are never streamed", schema, table),
			Fix:  "leave it out of the snapshot",
		}, nil
	}
	return nil, nil
}

// meta returns (and caches) the columns and queries of t. Called with
// st.mu held.
func (st *snapState) meta(ctx context.Context, t sources.SnapshotTable) (*snapMeta, error) {
	name := t.Name()
	if m := st.tables[name]; m != nil && slices.Equal(keyNames(m), t.Key) {
		return m, nil
	}
	type col struct {
		name, format, bare string
		oid                uint32
		notNull, key       bool
	}
	// The rows' description as the catalog has it when the chunk is read,
	// which is the rows' own: key flags as the sources set them (the
	// replica identity's columns; the primary key's with DEFAULT or FULL),
	// not the snapshot's ordering key.
	rows, err := st.conn.Query(ctx, `SELECT a.attname::text, a.atttypid, format_type(a.atttypid, a.atttypmod), c.oid, c.relreplident::text,
			format_type(a.atttypid, -1), a.attnotnull,
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey)
				AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'f' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped AND (a.attgenerated = '' OR a.attgenerated = 's' AND $3)
		ORDER BY a.attnum`, t.Schema, t.Table, st.storedGenerated)
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", name, err)
	}
	var cols []col
	var relOID uint32
	var ident string
	for rows.Next() {
		var c col
		if err := rows.Scan(&c.name, &c.oid, &c.format, &relOID, &ident, &c.bare, &c.notNull, &c.key); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the columns of %s: %w", name, err)
		}
		cols = append(cols, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", name, err)
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("table %s has no columns, or does not exist any more", name)
	}
	// The publication's column list and row filter: the snapshot reads what
	// the stream carries, no other column and no other row.
	var filter string
	var hidden []string
	if st.publication != "" {
		var published []string
		var rowFilter *string
		err := st.conn.QueryRow(ctx, `SELECT attnames::text[], rowfilter FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3 LIMIT 1`,
			st.publication, t.Schema, t.Table).Scan(&published, &rowFilter)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Not published: SnapshotTables refused it; nothing to narrow.
		case err != nil:
			return nil, fmt.Errorf("reading the column list and row filter of %s in publication %q: %w", name, st.publication, err)
		default:
			if published != nil {
				var left []string
				cols = slices.DeleteFunc(cols, func(c col) bool {
					if slices.Contains(published, c.name) {
						return false
					}
					left = append(left, c.name)
					return true
				})
				hidden = left
				for _, k := range t.Key {
					if slices.Contains(left, k) {
						return nil, &SetupError{
							What: fmt.Sprintf("key column %q of %s is not in the column list of publication %q, so a snapshot, which reads only the published columns, cannot read the table in key order", k, name, st.publication),
							Fix: fmt.Sprintf("add it to the list, in one transaction: BEGIN; ALTER PUBLICATION %[1]s DROP TABLE %[2]s; ALTER PUBLICATION %[1]s ADD TABLE %[2]s (%[3]s); COMMIT; or leave the table out of the snapshot",
								pgx.Identifier{st.publication}.Sanitize(), pgx.Identifier{t.Schema, t.Table}.Sanitize(), quoteIdents(append(slices.Clone(published), k))),
						}
					}
				}
			}
			if rowFilter != nil && *rowFilter != "" {
				filter = "(" + *rowFilter + ")"
			}
		}
	}
	m := &snapMeta{rel: &cdc.Relation{ID: relOID, Schema: t.Schema, Table: t.Table, ReplicaIdentity: ident[0]}}
	var sel, order, keyTuple, params []string
	for _, c := range cols {
		typ, err := st.types.Lookup(ctx, c.oid)
		if err != nil {
			return nil, fmt.Errorf("resolving the type of %s.%s: %w", name, c.name, err)
		}
		decl := ""
		if c.format != c.bare {
			decl = c.format
		}
		m.rel.Columns = append(m.rel.Columns, cdc.Column{Name: c.name, Type: typ.Name, OID: c.oid, Declared: decl, NotNull: c.notNull, Key: c.key})
		m.types = append(m.types, typ)
		m.formats = append(m.formats, c.format)
		sel = append(sel, pgx.Identifier{c.name}.Sanitize())
	}
	for i, k := range t.Key {
		j := slices.IndexFunc(cols, func(c col) bool { return c.name == k })
		if j < 0 {
			return nil, fmt.Errorf("key column %q of %s is not a readable column", k, name)
		}
		m.key = append(m.key, j)
		id := pgx.Identifier{k}.Sanitize()
		order = append(order, id)
		keyTuple = append(keyTuple, id)
		params = append(params, fmt.Sprintf("$%d::%s", i+1, cols[j].format))
	}
	from := "SELECT " + strings.Join(sel, ", ") + " FROM " + pgx.Identifier{t.Schema, t.Table}.Sanitize()
	tail := " ORDER BY " + strings.Join(order, ", ") + " LIMIT $%d"
	m.from, m.order, m.filter, m.hidden, m.publication = from, " ORDER BY "+strings.Join(order, ", "), filter, hidden, st.publication
	after := "(" + strings.Join(keyTuple, ", ") + ") > (" + strings.Join(params, ", ") + ")"
	if filter != "" {
		m.first = from + " WHERE " + filter + fmt.Sprintf(tail, 1)
		m.next = from + " WHERE " + filter + " AND " + after + fmt.Sprintf(tail, len(t.Key)+1)
	} else {
		m.first = from + fmt.Sprintf(tail, 1)
		m.next = from + " WHERE " + after + fmt.Sprintf(tail, len(t.Key)+1)
	}
	st.tables[name] = m
	return m, nil
}

func keyNames(m *snapMeta) []string {
	out := make([]string, len(m.key))
	for i, j := range m.key {
		out[i] = m.rel.Columns[j].Name
	}
	return out
}

// ReadChunk implements sources.Snapshotter.
func (s *Source) ReadChunk(ctx context.Context, t sources.SnapshotTable, after []string, limit int, id string) (*sources.Chunk, error) {
	st, err := s.snapConn(ctx)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.conn == nil {
		return nil, errSnapClosed
	}
	m, err := st.meta(ctx, t)
	if err != nil {
		return nil, err
	}
	emit := func(kind string) error {
		if _, err := st.conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", sources.SnapshotPrefix, sources.WatermarkContent(kind, id)); err != nil {
			return fmt.Errorf("emitting the %s watermark of snapshot chunk %s of %s: %w", kind, id, t.Name(), err)
		}
		return nil
	}
	if err := emit("low"); err != nil {
		return nil, err
	}
	sql, args := m.first, [][]byte{fmt.Appendf(nil, "%d", limit)}
	if len(t.Where) > 0 || t.Until != nil {
		if sql, args, err = m.filtered(t, after, limit); err != nil {
			return nil, err
		}
	} else if after != nil {
		if len(after) != len(m.key) {
			return nil, fmt.Errorf("snapshot of %s: resume key has %d values, the table's key %d", t.Name(), len(after), len(m.key))
		}
		sql, args = m.next, nil
		for _, v := range after {
			args = append(args, []byte(v))
		}
		args = append(args, fmt.Appendf(nil, "%d", limit))
	}
	ch := &sources.Chunk{Rel: m.rel}
	rr := st.conn.PgConn().ExecParams(ctx, sql, args, nil, nil, nil)
	var size int64
	var last [][]byte
	for rr.NextRow() {
		vals := rr.Values()
		row := make([]any, len(vals))
		for i, v := range vals {
			size += int64(len(v)) + 16
			if v == nil {
				continue
			}
			if row[i], err = m.types[i].DecodeText(v); err != nil {
				_, _ = rr.Close()
				return nil, fmt.Errorf("snapshot of %s, column %s: %w", t.Name(), m.rel.Columns[i].Name, err)
			}
		}
		ch.Rows = append(ch.Rows, row)
		last = last[:0]
		for _, j := range m.key {
			last = append(last, vals[j])
		}
		ch.Last = make([]string, len(last))
		for i, v := range last {
			ch.Last[i] = string(v)
		}
		if size >= s.cfg.Snapshot.ChunkBytes {
			ch.Partial = true
			break // the rest is the next chunk's
		}
	}
	if _, err := rr.Close(); err != nil {
		return nil, fmt.Errorf("reading a snapshot chunk of %s: %w", t.Name(), err)
	}
	if err := emit("high"); err != nil {
		return nil, err
	}
	return ch, nil
}

var (
	_ sources.Snapshotter  = (*Source)(nil)
	_ sources.WhereChecker = (*Source)(nil)
)

// whereOps are the comparison operators a where may use (sources.Cond).
var whereOps = map[string]bool{"=": true, "<>": true, "<": true, "<=": true, ">": true, ">=": true}

// filtered returns the query of a chunk of t restricted by t.Where and
// t.Until, and its parameters: each column of the where is checked to be
// one of the table's and quoted as an identifier, each value is a
// parameter cast to the column's type, so a where never adds SQL of its
// own.
func (m *snapMeta) filtered(t sources.SnapshotTable, after []string, limit int) (string, [][]byte, error) {
	var conds []string
	if m.filter != "" {
		conds = append(conds, m.filter)
	}
	var args [][]byte
	param := func(v string, col int) string {
		args = append(args, []byte(v))
		return fmt.Sprintf("$%d::%s", len(args), m.formats[col])
	}
	// keyCond compares the key with the values of bound.
	keyCond := func(what string, bound []string, op string) error {
		if len(bound) != len(m.key) {
			return fmt.Errorf("snapshot of %s: %s key has %d values, the table's key %d", t.Name(), what, len(bound), len(m.key))
		}
		var keys, ps []string
		for i, j := range m.key {
			keys = append(keys, pgx.Identifier{m.rel.Columns[j].Name}.Sanitize())
			ps = append(ps, param(bound[i], j))
		}
		conds = append(conds, "("+strings.Join(keys, ", ")+") "+op+" ("+strings.Join(ps, ", ")+")")
		return nil
	}
	if after != nil {
		if err := keyCond("resume", after, ">"); err != nil {
			return "", nil, err
		}
	}
	if t.Until != nil {
		if err := keyCond("bounding", t.Until, "<="); err != nil {
			return "", nil, err
		}
	}
	for _, c := range t.Where {
		j := slices.IndexFunc(m.rel.Columns, func(col cdc.Column) bool { return col.Name == c.Column })
		if j < 0 {
			names := make([]string, len(m.rel.Columns))
			for i, col := range m.rel.Columns {
				names[i] = col.Name
			}
			if slices.Contains(m.hidden, c.Column) {
				return "", nil, &SetupError{What: fmt.Sprintf("the snapshot's where names column %q of table %s, which is not in the column list of publication %q (the snapshot reads only the published columns)", c.Column, t.Name(), m.publication),
					Fix: "use one of its published columns: " + strings.Join(names, ", ")}
			}
			return "", nil, &SetupError{What: fmt.Sprintf("the snapshot's where names column %q, which table %s does not have", c.Column, t.Name()),
				Fix: "use one of its columns: " + strings.Join(names, ", ")}
		}
		id := pgx.Identifier{c.Column}.Sanitize()
		switch {
		case c.Op == "is null" && len(c.Values) == 0:
			conds = append(conds, id+" IS NULL")
		case c.Op == "is not null" && len(c.Values) == 0:
			conds = append(conds, id+" IS NOT NULL")
		case c.Op == "in" && len(c.Values) > 0:
			ps := make([]string, len(c.Values))
			for i, v := range c.Values {
				ps[i] = param(v, j)
			}
			conds = append(conds, id+" IN ("+strings.Join(ps, ", ")+")")
		case whereOps[c.Op] && len(c.Values) == 1:
			conds = append(conds, id+" "+c.Op+" "+param(c.Values[0], j))
		default:
			return "", nil, fmt.Errorf("snapshot of %s: condition on %s has operator %q and %d values", t.Name(), c.Column, c.Op, len(c.Values))
		}
	}
	args = append(args, fmt.Appendf(nil, "%d", limit))
	sql := m.from
	if len(conds) > 0 {
		sql += " WHERE " + strings.Join(conds, " AND ")
	}
	sql += m.order + fmt.Sprintf(" LIMIT $%d", len(args))
	return sql, args, nil
}

// CheckWhere implements sources.WhereChecker: it runs t's filtered query
// with LIMIT 0, so Postgres checks every column and converts every value.
func (s *Source) CheckWhere(ctx context.Context, t sources.SnapshotTable) error {
	st, err := s.snapConn(ctx)
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.conn == nil {
		return errSnapClosed
	}
	m, err := st.meta(ctx, t)
	if err != nil {
		return err
	}
	sql, args, err := m.filtered(t, nil, 0)
	if err != nil {
		return err
	}
	rr := st.conn.PgConn().ExecParams(ctx, sql, args, nil, nil, nil)
	for rr.NextRow() {
	}
	if _, err := rr.Close(); err != nil {
		return &SetupError{What: fmt.Sprintf("the snapshot's where %s does not apply to table %s: %v", sources.FormatWhere(t.Where), t.Name(), err),
			Fix: "give each column a literal of its type (text in quotes: 'x'; numbers bare; timestamps as '2024-01-31 12:00:00+00')"}
	}
	return nil
}

// quoteIdents joins names as SQL identifiers, quoted where needed.
func quoteIdents(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(out, ", ")
}
