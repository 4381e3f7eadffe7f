package pgtypes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query returning at most one row; *pgx.Conn, *pgxpool.Pool
// and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Resolver resolves type OIDs and names to Types and caches them by OID.
// Built-in types resolve without a query. A Resolver is safe for concurrent
// use; it runs at most one query at a time, so the Querier may be a single
// connection that nothing else uses concurrently.
type Resolver struct {
	q   Querier
	sem chan struct{} // held while querying

	mu    sync.RWMutex
	gen   uint64 // bumped by Invalidate; results of older queries are not cached
	types map[uint32]entry
	names map[string]uint32
	fmts  map[typeMod]string // format_type results
}

// typeMod is a type with a modifier (atttypmod; -1 for none).
type typeMod struct {
	oid uint32
	mod int32
}

type entry struct {
	t    *Type
	deps []uint32 // OIDs the Type was built from, its own included
}

// NewResolver returns a Resolver that queries the catalog through q.
func NewResolver(q Querier) *Resolver {
	return &Resolver{q: q, sem: make(chan struct{}, 1), types: map[uint32]entry{}, names: map[string]uint32{}, fmts: map[typeMod]string{}}
}

// maxDepth bounds the chain of domains and array elements followed for one
// type; real chains are short, so only a corrupt catalog reaches it.
const maxDepth = 32

const typeQuery = `SELECT t.typname::text, n.nspname::text, t.typtype::text, t.typelem, t.typbasetype,
	t.typdelim::text, t.typelem <> 0 AND t.typoutput = 'pg_catalog.array_out'::pg_catalog.regproc,
	t.typrelid, (SELECT p.proname::text FROM pg_catalog.pg_proc p WHERE p.oid = t.typinput)
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE t.oid = $1`

// fieldsQuery lists a composite type's attributes as record_out writes
// them: in order, dropped ones left out.
const fieldsQuery = `SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}'), coalesce(array_agg(a.atttypid ORDER BY a.attnum), '{}')
FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`

// Lookup returns the Type with the given OID: from the built-in table, the
// cache, or the catalog (pg_type, following domains to their base type and
// arrays to their element type). ctx bounds waiting for and running queries.
// Only successful results are cached.
func (r *Resolver) Lookup(ctx context.Context, oid uint32) (*Type, error) {
	if t := r.cached(oid); t != nil {
		return t, nil
	}
	if err := r.acquire(ctx); err != nil {
		return nil, fmt.Errorf("looking up type OID %d: %w", oid, err)
	}
	defer r.release()
	t, _, err := r.resolve(ctx, oid, 0)
	return t, err
}

// LookupName resolves a type name as format_type prints it and wal2json
// reports it ("integer", "character varying(20)", "timestamp with time
// zone", "text[]", "public.mood") with the catalog's regtype input, so
// unqualified names follow the Querier's search_path. Name-to-OID results are
// cached too.
func (r *Resolver) LookupName(ctx context.Context, name string) (*Type, error) {
	r.mu.RLock()
	oid, ok := r.names[name]
	r.mu.RUnlock()
	if ok {
		return r.Lookup(ctx, oid)
	}
	if err := r.acquire(ctx); err != nil {
		return nil, fmt.Errorf("looking up type %q: %w", name, err)
	}
	defer r.release()
	r.mu.RLock()
	gen := r.gen
	r.mu.RUnlock()
	if err := r.q.QueryRow(ctx, `SELECT $1::text::pg_catalog.regtype::pg_catalog.oid`, name).Scan(&oid); err != nil {
		return nil, fmt.Errorf("looking up type %q: %w", name, err)
	}
	t, _, err := r.resolve(ctx, oid, 0)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.gen == gen {
		r.names[name] = oid
	}
	r.mu.Unlock()
	return t, nil
}

// Format returns type oid with modifier typmod (a column's atttypmod; -1
// for none) as Postgres' format_type prints it, and wal2json reports a
// column's type: "character varying(20)", "numeric(10,2)", "integer".
// Results are cached.
func (r *Resolver) Format(ctx context.Context, oid uint32, typmod int32) (string, error) {
	if typmod < -1 {
		typmod = -1
	}
	if f, ok := formatBuiltin(oid, typmod); ok {
		return f, nil
	}
	k := typeMod{oid, typmod}
	r.mu.RLock()
	f, ok := r.fmts[k]
	r.mu.RUnlock()
	if ok {
		return f, nil
	}
	if err := r.acquire(ctx); err != nil {
		return "", fmt.Errorf("formatting type OID %d: %w", oid, err)
	}
	defer r.release()
	r.mu.RLock()
	gen := r.gen
	r.mu.RUnlock()
	if err := r.q.QueryRow(ctx, `SELECT pg_catalog.format_type($1, $2)`, oid, typmod).Scan(&f); err != nil {
		return "", fmt.Errorf("formatting type OID %d with modifier %d: %w", oid, typmod, err)
	}
	r.mu.Lock()
	if r.gen == gen {
		r.fmts[k] = f
	}
	r.mu.Unlock()
	return f, nil
}

// Declared returns printed, type oid as format_type printed it with a
// column's modifier (Format, or wal2json's "type"), when the modifier
// shows in it ("character varying(20)"), and "" when it prints as the type
// without one ("integer", "text"): the cdc.Column.Declared of the column.
func (r *Resolver) Declared(ctx context.Context, oid uint32, printed string) (string, error) {
	base, err := r.Format(ctx, oid, -1)
	if err != nil || base == printed {
		return "", err
	}
	return printed, nil
}

// DeclaredMod returns the cdc.Column.Declared of a column of type oid with
// modifier typmod (pgoutput's Relation message, the catalog's atttypmod):
// "" without one.
func (r *Resolver) DeclaredMod(ctx context.Context, oid uint32, typmod int32) (string, error) {
	if typmod < 0 {
		return "", nil
	}
	printed, err := r.Format(ctx, oid, typmod)
	if err != nil {
		return "", err
	}
	return r.Declared(ctx, oid, printed)
}

// Invalidate forgets the type with the given OID and every cached type built
// from it (arrays of it, domains over it), and the names that resolved to
// them, so the next lookup reads the catalog again. Call it after ALTER TYPE
// or ALTER DOMAIN, or when a source reports a type change. Built-in types are
// never forgotten.
func (r *Resolver) Invalidate(oid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	for k, e := range r.types {
		if slices.Contains(e.deps, oid) {
			delete(r.types, k)
		}
	}
	for n, o := range r.names {
		if _, ok := r.types[o]; !ok && builtins[o] == nil {
			delete(r.names, n)
		}
	}
	for k := range r.fmts {
		if k.oid == oid {
			delete(r.fmts, k)
		}
	}
}

// Reset forgets every cached type and name except the built-in types, for
// when a source cannot tell which types changed (a dropped and re-created
// type keeps its name but not its OID).
func (r *Resolver) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	clear(r.types)
	clear(r.names)
	clear(r.fmts)
}

func (r *Resolver) cached(oid uint32) *Type {
	if t := builtins[oid]; t != nil {
		return t
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.types[oid].t
}

func (r *Resolver) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Resolver) release() { <-r.sem }

// resolve returns the Type for oid and the OIDs it depends on, querying the
// catalog when needed. The caller holds the query semaphore.
func (r *Resolver) resolve(ctx context.Context, oid uint32, depth int) (*Type, []uint32, error) {
	if t := builtins[oid]; t != nil {
		return t, nil, nil
	}
	r.mu.RLock()
	e, ok := r.types[oid]
	gen := r.gen
	r.mu.RUnlock()
	if ok {
		return e.t, e.deps, nil
	}
	if depth > maxDepth {
		return nil, nil, fmt.Errorf("looking up type OID %d: domain or array chain longer than %d", oid, maxDepth)
	}
	t, deps, err := r.query(ctx, oid, depth)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	if r.gen == gen {
		r.types[oid] = entry{t: t, deps: deps}
	}
	r.mu.Unlock()
	return t, deps, nil
}

// query reads one type from the catalog, resolving the types it refers to.
func (r *Resolver) query(ctx context.Context, oid uint32, depth int) (*Type, []uint32, error) {
	var (
		name, nsp, typtype, delim string
		elem, base, relid         uint32
		isArray                   bool
		input                     *string
	)
	err := r.q.QueryRow(ctx, typeQuery, oid).Scan(&name, &nsp, &typtype, &elem, &base, &delim, &isArray, &relid, &input)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fmt.Errorf("looking up type OID %d: no such type", oid)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("looking up type OID %d: %w", oid, err)
	}
	t := &Type{OID: oid, Name: name, Kind: Text, Delim: ','}
	if nsp != "pg_catalog" {
		t.Name = nsp + "." + name
	}
	if len(delim) == 1 {
		t.Delim = delim[0]
	}
	deps := []uint32{oid}
	switch {
	case typtype == "d" && base != 0:
		b, bdeps, err := r.resolve(ctx, base, depth+1)
		if err != nil {
			return nil, nil, fmt.Errorf("looking up base type of %s: %w", t.Name, err)
		}
		t.Kind, t.Elem, t.Delim, t.Fields, t.names = b.Kind, b.Elem, b.Delim, b.Fields, b.names
		deps = append(deps, bdeps...)
	case isArray:
		e, edeps, err := r.resolve(ctx, elem, depth+1)
		if err != nil {
			return nil, nil, fmt.Errorf("looking up element type of %s: %w", t.Name, err)
		}
		t.Kind, t.Elem, t.Delim = Array, e, e.Delim
		deps = append(deps, edeps...)
	case typtype == "b" && nsp == "pg_catalog":
		t.Kind = builtinKinds[name]
	case typtype == "b" && input != nil && (name == "geometry" && *input == "geometry_in" || name == "geography" && *input == "geography_in"):
		// PostGIS, in whichever schema it was installed.
		t.Kind = Geometry
		if name == "geography" {
			t.Kind = Geography
		}
	case typtype == "c" && relid != 0:
		var names []string
		var oids []uint32
		if err := r.q.QueryRow(ctx, fieldsQuery, relid).Scan(&names, &oids); err != nil {
			return nil, nil, fmt.Errorf("looking up the fields of %s: %w", t.Name, err)
		}
		t.Kind, t.names, t.Fields = Composite, names, make([]Field, len(names))
		for i, n := range names {
			f, fdeps, err := r.resolve(ctx, oids[i], depth+1)
			if err != nil {
				return nil, nil, fmt.Errorf("looking up the type of field %s of %s: %w", n, t.Name, err)
			}
			t.Fields[i] = Field{Name: n, Type: f}
			deps = append(deps, fdeps...)
		}
	}
	return t, deps, nil
}
