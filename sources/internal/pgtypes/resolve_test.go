package pgtypes

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resolverDB makes a fresh database with a few user types and returns a
// connection to it.
func resolverDB(t *testing.T, name string) *pgx.Conn {
	t.Helper()
	s := server(t)
	s.ExecT(t, "CREATE DATABASE "+name)
	require.NoError(t, s.Exec(t.Context(), name,
		`CREATE TYPE mood AS ENUM ('sad', 'happy')`,
		`CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
		`CREATE DOMAIN posint2 AS posint`,
		`CREATE DOMAIN moods AS mood[]`,
		`CREATE SCHEMA "Odd Schema"`,
		`CREATE TYPE "Odd Schema"."Odd.Type" AS (a int, b text)`,
		`CREATE TABLE t (m mood, p posint2)`,
	))
	return s.Conn(t, name)
}

// TestBuiltinsMatchCatalog checks the built-in table against what the
// catalog query resolves for the same OIDs.
func TestBuiltinsMatchCatalog(t *testing.T) {
	conn := resolverDB(t, "builtins")
	r := NewResolver(conn)
	for oid, want := range builtins {
		t.Run(want.Name, func(t *testing.T) {
			got, _, err := r.query(t.Context(), oid, 0)
			require.NoError(t, err)
			assert.Equal(t, want.Name, got.Name)
			assert.Equal(t, want.Kind, got.Kind)
			assert.Equal(t, string(want.Delim), string(got.Delim))
			if want.Elem == nil {
				assert.Nil(t, got.Elem)
			} else {
				require.NotNil(t, got.Elem)
				assert.Equal(t, want.Elem.OID, got.Elem.OID)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	conn := resolverDB(t, "lookup")
	ctx := t.Context()
	r := NewResolver(conn)
	oidOf := func(name string) uint32 {
		var oid uint32
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::text::regtype::oid`, name).Scan(&oid))
		return oid
	}
	tests := []struct {
		name, wantName string
		kind           Kind
		elem           string
		delim          byte
	}{
		{"int4", "int4", Int, "", ','},
		{"mood", "public.mood", Text, "", ','},
		{"mood[]", "public._mood", Array, "public.mood", ','},
		{"posint", "public.posint", Int, "", ','},
		{"posint2", "public.posint2", Int, "", ','},
		{"posint2[]", "public._posint2", Array, "public.posint2", ','},
		{"moods", "public.moods", Array, "public.mood", ','},
		{"moods[]", "public._moods", Array, "public.moods", ','},
		{`"Odd Schema"."Odd.Type"`, "Odd Schema.Odd.Type", Composite, "", ','},
		{`"Odd Schema"."Odd.Type"[]`, "Odd Schema._Odd.Type", Array, "Odd Schema.Odd.Type", ','},
		{"t", "public.t", Composite, "", ','}, // a table's row type
		{"box[]", "_box", Array, "box", ';'},
		{"information_schema.cardinal_number", "information_schema.cardinal_number", Int, "", ','},
		{"regclass", "regclass", Text, "", ','},
		{"pg_lsn", "pg_lsn", Text, "", ','},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oid := oidOf(tt.name)
			got, err := r.Lookup(ctx, oid)
			require.NoError(t, err)
			assert.Equal(t, oid, got.OID)
			assert.Equal(t, tt.wantName, got.Name)
			assert.Equal(t, tt.kind, got.Kind)
			assert.Equal(t, string(tt.delim), string(got.Delim))
			if tt.elem == "" {
				assert.Nil(t, got.Elem)
			} else {
				require.NotNil(t, got.Elem)
				assert.Equal(t, tt.elem, got.Elem.Name)
			}
			again, err := r.Lookup(ctx, oid)
			require.NoError(t, err)
			assert.Same(t, got, again, "cached")
		})
	}
	t.Run("decodes domain array", func(t *testing.T) {
		typ, err := r.Lookup(ctx, oidOf("moods[]"))
		require.NoError(t, err)
		v, err := typ.DecodeText([]byte(`{"{sad,NULL}",NULL,"{}"}`))
		require.NoError(t, err)
		assert.Equal(t, []any{[]any{"sad", nil}, nil, []any{}}, v)
	})
	t.Run("unknown OID", func(t *testing.T) {
		_, err := r.Lookup(ctx, 999999)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "999999")
	})
}

func TestLookupName(t *testing.T) {
	conn := resolverDB(t, "lookupname")
	ctx := t.Context()
	r := NewResolver(conn)
	tests := []struct{ in, want string }{
		{"integer", "int4"},
		{"smallint", "int2"},
		{"bigint", "int8"},
		{"double precision", "float8"},
		{"real", "float4"},
		{"boolean", "bool"},
		{"character varying(20)", "varchar"},
		{"character varying", "varchar"},
		{"character(3)", "bpchar"},
		{`"char"`, "char"},
		{"numeric(10,2)", "numeric"},
		{"timestamp with time zone", "timestamptz"},
		{"timestamp(3) without time zone", "timestamp"},
		{"time with time zone", "timetz"},
		{"bit varying(5)", "varbit"},
		{"text[]", "_text"},
		{"integer[]", "_int4"},
		{"jsonb", "jsonb"},
		{"mood", "public.mood"},
		{"public.mood", "public.mood"},
		{"mood[]", "public._mood"},
		{"public.posint", "public.posint"},
		{`"Odd Schema"."Odd.Type"`, "Odd Schema.Odd.Type"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := r.LookupName(ctx, tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Name)
			again, err := r.LookupName(ctx, tt.in)
			require.NoError(t, err)
			assert.Same(t, got, again)
		})
	}
	_, err := r.LookupName(ctx, "no_such_type")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_such_type")
}

func TestInvalidate(t *testing.T) {
	conn := resolverDB(t, "invalidate")
	ctx := t.Context()
	s := server(t)
	r := NewResolver(conn)
	var moodOID, arrOID, moodsOID uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT 'mood'::regtype::oid, 'mood[]'::regtype::oid, 'moods'::regtype::oid`).Scan(&moodOID, &arrOID, &moodsOID))
	for _, oid := range []uint32{moodOID, arrOID, moodsOID} {
		_, err := r.Lookup(ctx, oid)
		require.NoError(t, err)
	}
	byName, err := r.LookupName(ctx, "mood")
	require.NoError(t, err)
	assert.Equal(t, "public.mood", byName.Name)
	_, err = r.LookupName(ctx, "integer")
	require.NoError(t, err)

	require.NoError(t, s.Exec(ctx, "invalidate", `ALTER TYPE mood RENAME TO feeling`))
	got, err := r.Lookup(ctx, moodOID)
	require.NoError(t, err)
	assert.Equal(t, "public.mood", got.Name, "cached until invalidated")

	r.Invalidate(moodOID)
	got, err = r.Lookup(ctx, moodOID)
	require.NoError(t, err)
	assert.Equal(t, "public.feeling", got.Name)
	arr, err := r.Lookup(ctx, arrOID)
	require.NoError(t, err)
	assert.Equal(t, "public._feeling", arr.Name, "array of an invalidated type is re-read")
	assert.Equal(t, "public.feeling", arr.Elem.Name)
	moods, err := r.Lookup(ctx, moodsOID)
	require.NoError(t, err)
	assert.Equal(t, "public.feeling", moods.Elem.Name, "domain over an array of it is re-read")
	_, err = r.LookupName(ctx, "mood")
	require.Error(t, err, "the old name is forgotten")
	r.mu.RLock()
	_, kept := r.names["integer"]
	r.mu.RUnlock()
	assert.True(t, kept, "names of built-in types survive")

	r.Invalidate(23) // built-in: a no-op
	i4, err := r.Lookup(ctx, 23)
	require.NoError(t, err)
	assert.Equal(t, "int4", i4.Name)

	r.Reset()
	r.mu.RLock()
	assert.Empty(t, r.types)
	assert.Empty(t, r.names)
	r.mu.RUnlock()
}

// countingQuerier counts queries and can fail them.
type countingQuerier struct {
	q     Querier
	n     atomic.Int32
	fail  atomic.Bool
	inUse atomic.Int32
}

func (c *countingQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	if c.inUse.Add(1) > 1 {
		panic("concurrent queries")
	}
	defer c.inUse.Add(-1)
	if c.fail.Load() {
		return errRow{errors.New("boom")}
	}
	// Scan runs after QueryRow returns; read the row now so the
	// single-query check covers it.
	return bufferedRow(c.q.QueryRow(ctx, sql, args...), sql)
}

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }

// bufferedRow scans the catalog query's columns eagerly.
func bufferedRow(row pgx.Row, sql string) pgx.Row {
	if sql == typeQuery {
		var (
			name, nsp, typtype, delim string
			elem, base, relid         uint32
			isArray                   bool
			input                     *string
		)
		err := row.Scan(&name, &nsp, &typtype, &elem, &base, &delim, &isArray, &relid, &input)
		return funcRow(func(dst ...any) error {
			if err != nil {
				return err
			}
			*dst[0].(*string), *dst[1].(*string), *dst[2].(*string) = name, nsp, typtype
			*dst[3].(*uint32), *dst[4].(*uint32), *dst[5].(*string), *dst[6].(*bool) = elem, base, delim, isArray
			*dst[7].(*uint32), *dst[8].(**string) = relid, input
			return nil
		})
	}
	if sql == fieldsQuery {
		var names []string
		var oids []uint32
		err := row.Scan(&names, &oids)
		return funcRow(func(dst ...any) error {
			if err != nil {
				return err
			}
			*dst[0].(*[]string), *dst[1].(*[]uint32) = names, oids
			return nil
		})
	}
	var oid uint32
	err := row.Scan(&oid)
	return funcRow(func(dst ...any) error {
		if err != nil {
			return err
		}
		*dst[0].(*uint32) = oid
		return nil
	})
}

type funcRow func(...any) error

func (f funcRow) Scan(dst ...any) error { return f(dst...) }

func TestResolverErrorsAreNotCached(t *testing.T) {
	conn := resolverDB(t, "errors")
	ctx := t.Context()
	cq := &countingQuerier{q: conn}
	r := NewResolver(cq)
	var oid uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT 'mood[]'::regtype::oid`).Scan(&oid))

	cq.fail.Store(true)
	_, err := r.Lookup(ctx, oid)
	require.ErrorContains(t, err, "boom")
	_, err = r.LookupName(ctx, "mood")
	require.ErrorContains(t, err, "boom")

	cq.fail.Store(false)
	got, err := r.Lookup(ctx, oid)
	require.NoError(t, err)
	assert.Equal(t, "public._mood", got.Name)
	n := cq.n.Load()
	_, err = r.Lookup(ctx, oid)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, got.Elem.OID)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, 1007)
	require.NoError(t, err)
	assert.Equal(t, n, cq.n.Load(), "cached and built-in types need no query")

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Lookup(canceled, 999998)
	require.ErrorIs(t, err, context.Canceled)
}

func TestResolverConcurrent(t *testing.T) {
	conn := resolverDB(t, "concurrent")
	ctx := t.Context()
	cq := &countingQuerier{q: conn}
	r := NewResolver(cq)
	names := []string{"mood", "mood[]", "posint", "posint2", "moods", "moods[]", "integer", "text[]", `"Odd Schema"."Odd.Type"`, "t"}
	oids := make([]uint32, len(names))
	want := make([]string, len(names))
	for i, n := range names {
		require.NoError(t, conn.QueryRow(ctx, `SELECT $1::text::regtype::oid`, n).Scan(&oids[i]))
		typ, err := NewResolver(conn).Lookup(ctx, oids[i])
		require.NoError(t, err)
		want[i] = typ.Name
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 16 {
		wg.Go(func() {
			for i := range 50 {
				k := (g + i) % len(names)
				var typ *Type
				var err error
				if i%2 == 0 {
					typ, err = r.Lookup(ctx, oids[k])
				} else {
					typ, err = r.LookupName(ctx, names[k])
				}
				if err != nil {
					errs <- err
					return
				}
				if typ.Name != want[k] {
					errs <- fmt.Errorf("%s resolved to %s, want %s", names[k], typ.Name, want[k])
					return
				}
				if i%10 == 0 {
					r.Invalidate(oids[(k+1)%len(oids)])
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
