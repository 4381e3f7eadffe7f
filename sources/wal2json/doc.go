// Package wal2json is the "wal2json" source: Postgres logical replication
// through the wal2json output plugin (format version 2, one JSON object per
// change), over the same replication core as pgoutput. It emits the same
// changes as the pgoutput source, value for value and with the same
// identities (commit end LSN and ordinal), except where wal2json's output
// cannot carry the information; those differences are listed below.
//
// wal2json needs no publication; `tables` becomes its add-tables filter and
// `publication`/`create_publication` are ignored. The plugin must be
// installed on the server (Debian/Ubuntu: `apt-get install
// postgresql-<major>-wal2json`); a server without it is reported as a setup
// error with that command, and so is a bytea_output other than 'hex'
// (wal2json strips the first two characters of a bytea's text). Large
// transactions spill to disk past spill_changes/spill_bytes, as with
// pgoutput. A snapshot reads only tables the stream carries: those in
// tables (exact names), or every logged table when it is empty, never an
// unlogged, temporary or partitioned one (wal2json streams a partitioned
// table's changes under its partitions' names); any other is refused with
// the fix, as pgoutput refuses a table outside its publication.
//
// Differences from pgoutput, forced by wal2json 2.5 and earlier:
//
//   - NaN, Infinity and -Infinity in float4, float8 and numeric columns
//     arrive as JSON null. In a NOT NULL column the value is known to be
//     lost: it becomes null and the change carries the header Bridge-Lossy
//     with the names of such columns, comma-separated. In a nullable column
//     it cannot be told from NULL and becomes null unflagged. wal2json 2.6
//     and later send numbers as strings (numeric-data-types-as-string), the
//     source uses that when the server accepts it, and nothing is lost.
//   - TRUNCATE's CASCADE and RESTART IDENTITY options are not reported:
//     Cascade and RestartIdentity are always false.
//   - Message content is a C string to wal2json: it ends at the first NUL
//     byte.
//   - Tables whose replica identity cannot carry updates and deletes
//     (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key): pgoutput
//     makes such UPDATEs and DELETEs fail on the server while the table is
//     published; wal2json lets them commit and skips them with a server-log
//     WARNING. The source warns about such tables when it starts.
//   - wal2json says, for every insert and update, each column's name,
//     type with its modifier (include-typmod), OID and NOT NULL
//     (include-not-null), and each change's primary key (include-pk), as
//     of the change: the source checks the description it caches (from
//     the catalog, or from an earlier change) against them, and describes
//     the table by the change when they disagree (DDL since), with a
//     warning. Key flags are the primary key's with REPLICA IDENTITY
//     DEFAULT or FULL, exact; with USING INDEX the identity index's,
//     checked against each update's and delete's identity. What wal2json
//     does not say comes from the catalog (cdc.Relation.Inferred): the
//     replica identity itself, and the columns a change does not carry
//     (a delete's non-key columns; an update's unchanged TOAST values,
//     described as the table's change before had them).
//
// Example (bridge.yaml):
//
//	sources:
//	  shop:
//	    type: wal2json
//	    config:
//	      dsn: "postgres://bridge@db:5432/shop"
//	      slot: bridge_shop_wal2json       # created with the wal2json plugin when missing
//	      tables: [public.orders, public.customers]   # add-tables; empty: all tables
//	      message_prefixes: ["shop"]
//	      status_interval: 10s
package wal2json
