package wal2json

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
	"github.com/bridgecdc/bridge/sources/internal/pgrepl"
	"github.com/bridgecdc/bridge/sources/internal/pgtypes"
)

func init() {
	sources.MustRegister("wal2json", sources.Plugin{
		New:    New,
		Config: pgrepl.DefaultConfig("<name>"),
		Doc:    "PostgreSQL logical replication with the wal2json plugin (format version 2); no publication needed",
	})
}

// optNumbersAsText is the wal2json 2.6 option that prints numbers as JSON
// strings, NaN and ±Infinity included; older versions reject it.
const optNumbersAsText = "numeric-data-types-as-string"

// New builds a wal2json source from its config block; it does no I/O.
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
	p := &plugin{cfg: cfg, source: env.Name, log: log, numbersAsText: true}
	return &Source{cfg: cfg, env: env, log: log, p: p, inner: pgrepl.New(cfg, env, p)}, nil
}

// Source is a pgrepl.Source over the wal2json plugin. Open turns the
// server's "plugin not installed" error into a sources.SetupError, and
// falls back to JSON numbers when the plugin is older than 2.6.
type Source struct {
	cfg   pgrepl.Config
	env   sources.Env
	log   *slog.Logger
	p     *plugin
	inner *pgrepl.Source // replaced only inside Open

	expect    sources.Lineage // Expect's, passed on to a replaced inner
	expectEnd cdc.LSN
}

// Expect implements sources.Lineaged.
func (s *Source) Expect(l sources.Lineage, end cdc.LSN) {
	s.expect, s.expectEnd = l, end
	s.inner.Expect(l, end)
}

// Lineage implements sources.Lineaged.
func (s *Source) Lineage() sources.Lineage { return s.inner.Lineage() }

// Open implements sources.Source.
func (s *Source) Open(ctx context.Context, from cdc.LSN) error {
	err := s.inner.Open(ctx, from)
	if err != nil && s.p.numbersAsText && isUnknownOption(err, optNumbersAsText) {
		// wal2json < 2.6. The failed attempt closed its connections; a
		// pgrepl.Source opens once, so start over with a new one.
		s.log.Info("wal2json is older than 2.6: NaN and ±Infinity in float and numeric columns arrive as null (flagged with Bridge-Lossy in NOT NULL columns)")
		p := *s.p
		p.numbersAsText = false
		s.p = &p
		s.inner = pgrepl.New(s.cfg, s.env, s.p)
		s.inner.Expect(s.expect, s.expectEnd)
		err = s.inner.Open(ctx, from)
	}
	return mapError(err, s.p.Name(), s.p.major)
}

// Read implements sources.Source.
func (s *Source) Read(ctx context.Context) (*cdc.Txn, error) { return s.inner.Read(ctx) }

// Ack implements sources.Source.
func (s *Source) Ack(ctx context.Context, upTo cdc.LSN) error { return s.inner.Ack(ctx, upTo) }

// Idle implements sources.Idler.
func (s *Source) Idle() (safe, after cdc.LSN, ok bool) { return s.inner.Idle() }

// Close implements sources.Source.
func (s *Source) Close(ctx context.Context) error { return s.inner.Close(ctx) }

// Reader implements sources.Evicter.
func (s *Source) Reader() sources.SlotReader { return s.inner.Reader() }

// Evict implements sources.Evicter.
func (s *Source) Evict(ctx context.Context, holder sources.SlotReader) error {
	return s.inner.Evict(ctx, holder)
}

// Check implements sources.Checker.
func (s *Source) Check(ctx context.Context, req sources.CheckRequest) []config.Check {
	return s.inner.Check(ctx, req)
}

// mapError turns the server's report that the output plugin's library
// (plugin, "wal2json") is missing into a SetupError with the install
// command; other errors pass unchanged. major is the server's major
// version, 0 when unknown.
func mapError(err error, plugin string, major int) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	// "could not access file \"wal2json\": No such file or directory"
	// (undefined_file), from slot creation or START_REPLICATION.
	if pe.Code == "58P01" && strings.Contains(pe.Message, `"`+plugin+`"`) {
		v := "<major>"
		if major > 0 {
			v = strconv.Itoa(major)
		}
		return &sources.SetupError{
			What: fmt.Sprintf("the %s output plugin is not installed on the PostgreSQL server (%s)", plugin, pe.Message),
			Fix: fmt.Sprintf("install it on the database server, e.g. `apt-get install postgresql-%s-wal2json` (Debian/Ubuntu; RHEL: `dnf install wal2json_%s`), then restart the bridge",
				v, v),
		}
	}
	return err
}

// isUnknownOption reports whether err is wal2json rejecting option name.
func isUnknownOption(err error, name string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.Contains(pe.Message, `option "`+name+`"`) && strings.Contains(pe.Message, "is unknown")
}

type plugin struct {
	cfg           pgrepl.Config
	source        string
	log           *slog.Logger
	numbersAsText bool     // send optNumbersAsText
	major         int      // server major version, set by Prepare
	addTables     []string // tables with partitioned ones' partitions added, set by Prepare
}

func (p *plugin) Name() string { return "wal2json" }

// Prepare checks what wal2json needs besides what pgrepl.Check covers. It
// needs no publication; whether the plugin is installed shows when the slot
// is created or streaming starts (see mapError).
func (p *plugin) Prepare(ctx context.Context, cat *pgx.Conn, log *slog.Logger) error {
	checks, _, err := p.Check(ctx, cat)
	if err != nil {
		return err
	}
	if p.addTables, err = withPartitions(ctx, cat, p.cfg.Tables); err != nil {
		return err
	}
	for _, c := range checks {
		switch c.Status {
		case config.CheckFail:
			return &sources.SetupError{What: c.What, Fix: c.Fix}
		case config.CheckWarn:
			log.Warn(c.What, "fix", c.Fix)
		}
	}
	return nil
}

// Check implements pgrepl.Plugin: bytea_output, the configured tables, and
// the tables whose UPDATEs and DELETEs wal2json would skip. It records the
// server's major version for mapError.
func (p *plugin) Check(ctx context.Context, cat *pgx.Conn) ([]config.Check, []string, error) {
	var num int
	if err := cat.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return nil, nil, fmt.Errorf("reading server version: %w", err)
	}
	p.major = num / 10000
	// wal2json prints bytea as the hex output without its "\x"; the escape
	// format would arrive mangled.
	var byteaOut, db string
	if err := cat.QueryRow(ctx, "SELECT current_setting('bytea_output'), current_database()").Scan(&byteaOut, &db); err != nil {
		return nil, nil, fmt.Errorf("reading bytea_output: %w", err)
	}
	if byteaOut != "hex" {
		return []config.Check{{Status: config.CheckFail,
			What: fmt.Sprintf("bytea_output is %q; the wal2json source needs 'hex'", byteaOut),
			Fix:  fmt.Sprintf("ALTER DATABASE %s SET bytea_output = 'hex'; (or drop the role or server setting that changes it)", pgx.Identifier{db}.Sanitize()),
		}}, nil, nil
	}
	checks := []config.Check{{Status: config.CheckOK, What: "bytea_output is hex"}}
	tc, err := tableChecks(ctx, cat, p.source, db, p.cfg.Tables)
	if err != nil {
		return nil, nil, err
	}
	return append(checks, tc...), p.cfg.Tables, nil
}

// partitions maps each partitioned table among tables to its partitions
// (every level), in name order.
func partitions(ctx context.Context, cat *pgx.Conn, tables []string) (map[string][]string, error) {
	out := map[string][]string{}
	if len(tables) == 0 {
		return out, nil
	}
	rows, err := cat.Query(ctx, `SELECT rn.nspname::text || '.' || r.relname::text, n.nspname::text || '.' || c.relname::text
		FROM pg_class r JOIN pg_namespace rn ON rn.oid = r.relnamespace
		CROSS JOIN LATERAL pg_partition_tree(r.oid) t
		JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE r.relkind = 'p' AND rn.nspname::text || '.' || r.relname::text = ANY ($1) AND t.relid <> r.oid
		ORDER BY 1, 2`, tables)
	if err != nil {
		return nil, fmt.Errorf("listing the partitions of the configured tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var root, part string
		if err := rows.Scan(&root, &part); err != nil {
			return nil, fmt.Errorf("listing the partitions of the configured tables: %w", err)
		}
		out[root] = append(out[root], part)
	}
	return out, rows.Err()
}

// withPartitions returns tables with each partitioned table's partitions
// added after it: wal2json reports a partitioned table's changes under the
// names of its partitions, and add-tables matches those names. nil when no
// table is partitioned.
func withPartitions(ctx context.Context, cat *pgx.Conn, tables []string) ([]string, error) {
	parts, err := partitions(ctx, cat, tables)
	if err != nil || len(parts) == 0 {
		return nil, err
	}
	var out []string
	for _, t := range tables {
		out = append(out, t)
		out = append(out, parts[t]...)
	}
	return out, nil
}

// tableChecks warns about configured tables that do not exist, and
// streamed tables whose UPDATEs and DELETEs wal2json skips for lack of a
// replica identity.
func tableChecks(ctx context.Context, cat *pgx.Conn, source, db string, tables []string) ([]config.Check, error) {
	rows, err := cat.Query(ctx, `SELECT n.nspname::text, c.relname::text, c.relreplident::text,
			EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
		ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	want := map[string]bool{}
	for _, t := range tables {
		want[t] = true
	}
	have := map[string]bool{}
	var noIdent []string
	for rows.Next() {
		var schema, table, ident string
		var pk bool
		if err := rows.Scan(&schema, &table, &ident, &pk); err != nil {
			rows.Close()
			return nil, fmt.Errorf("listing tables: %w", err)
		}
		name := schema + "." + table
		have[name] = true
		if len(want) > 0 && !want[name] {
			continue
		}
		if ident == "n" || ident == "d" && !pk {
			noIdent = append(noIdent, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	var checks []config.Check
	key := fmt.Sprintf("sources.%s.config.tables", source)
	parts, err := partitions(ctx, cat, tables)
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if ps, ok := parts[t]; ok {
			checks = append(checks, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("table %s is partitioned: wal2json reports its changes under its partitions' names (%s), which the source adds to its add-tables filter when it starts; a partition attached later streams only after the source restarts, and a detached one streams until then",
					t, strings.Join(ps, ", ")),
				Fix: fmt.Sprintf("restart the bridge after attaching or detaching a partition, or use the pgoutput source, which follows partitions as they change and can name the changes %s", t)})
		}
	}
	for _, t := range tables {
		if !have[t] {
			checks = append(checks, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("configured table %s does not exist (yet) in database %q; its changes stream once it is created", t, db),
				Fix:  fmt.Sprintf("create it, or remove it from %s (names are case-sensitive)", key)})
		}
	}
	if len(noIdent) > 0 {
		shown := noIdent
		if len(shown) > 20 {
			shown = shown[:20]
		}
		checks = append(checks, config.Check{Status: config.CheckWarn,
			What: fmt.Sprintf("%d tables without a primary key or replica identity: wal2json skips their UPDATEs and DELETEs (a server-log WARNING each): %s",
				len(noIdent), strings.Join(shown, ", ")),
			Fix: "ALTER TABLE <table> REPLICA IDENTITY FULL; (or add a primary key)"})
	}
	return checks, nil
}

func (p *plugin) Args() []string {
	args := []string{
		`"format-version" '2'`,
		`"include-transaction" '1'`,
		`"include-xids" '1'`,
		`"include-timestamp" '1'`,
		`"include-lsn" '1'`,
		`"include-types" '1'`,
		`"include-type-oids" '1'`,
		`"include-typmod" '1'`, // the default, said: types with their modifiers (schema registry)
		`"include-pk" '1'`,     // the primary key as of each change
		`"include-not-null" '1'`,
		`"actions" 'insert,update,delete,truncate'`,
	}
	if p.numbersAsText {
		args = append(args, `"`+optNumbersAsText+`" '1'`)
	}
	if tables := p.cfg.Tables; len(tables) > 0 {
		if p.addTables != nil {
			tables = p.addTables
		}
		args = append(args, `"add-tables" `+literal(AddTables(tables)))
	}
	if v, ok := msgPrefixes(p.cfg.MessagePrefixes); ok {
		args = append(args, `"add-msg-prefixes" `+literal(v))
	}
	return args
}

// AddTables returns wal2json's add-tables value for "schema.table" names:
// comma-separated, with space, quote, comma, period, asterisk and backslash
// escaped by a backslash inside each name.
func AddTables(tables []string) string {
	out := make([]string, len(tables))
	for i, t := range tables {
		schema, table, _ := strings.Cut(t, ".")
		out[i] = escapeName(schema) + "." + escapeName(table)
	}
	return strings.Join(out, ",")
}

func escapeName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(` ',.*\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

var simplePrefix = regexp.MustCompile(`^[^\s,\\]+$`)

// msgPrefixes returns the add-msg-prefixes value that lets wal2json drop
// unwanted messages early. wal2json cannot escape a comma, a space or a
// backslash in a prefix, so with such a prefix, with "*" or with none, the
// option is left out; the decoder filters in every case.
func msgPrefixes(prefixes []string) (string, bool) {
	if len(prefixes) == 0 {
		return "", false
	}
	for _, p := range prefixes {
		if p == "*" || !simplePrefix.MatchString(p) {
			return "", false
		}
	}
	return strings.Join(prefixes, ","), true
}

// literal quotes s as a SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (p *plugin) NewDecoder(cat *pgx.Conn) pgrepl.Decoder {
	return newDecoder(p.source, p.cfg.MessagePrefixes, cat, pgtypes.NewResolver(cat),
		pgrepl.NewTxnBuffer(p.cfg.SpillDir, p.cfg.SpillChanges, p.cfg.SpillBytes), p.log)
}

var _ sources.Source = (*Source)(nil)
var _ sources.Idler = (*Source)(nil)

// SnapshotOptions implements sources.Snapshotter.
func (s *Source) SnapshotOptions() sources.SnapshotOptions { return s.inner.SnapshotOptions() }

// SnapshotTables implements sources.Snapshotter.
func (s *Source) SnapshotTables(ctx context.Context, names []string) ([]sources.SnapshotTable, error) {
	return s.inner.SnapshotTables(ctx, names)
}

// ReadChunk implements sources.Snapshotter.
func (s *Source) ReadChunk(ctx context.Context, t sources.SnapshotTable, after []string, limit int, id string) (*sources.Chunk, error) {
	return s.inner.ReadChunk(ctx, t, after, limit, id)
}

var _ sources.Snapshotter = (*Source)(nil)

var _ sources.Evicter = (*Source)(nil)
var _ sources.Lineaged = (*Source)(nil)
