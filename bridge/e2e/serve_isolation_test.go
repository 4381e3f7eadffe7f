package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
)

// The tenant-isolation test: 50 tenants' rows written by a real bridge
// from Postgres, read through `bridge serve` with JWTs whose claims name
// the tenant (serve.auth.where) and the tables (serve.auth.tables_claim).
// Every feed is compared with an oracle computed from the rows written.

const isoTenants = 50

// isoRow is a row of the test tables, as the oracle keeps it.
type isoRow struct {
	ID     int64
	Tenant int64
	Kind   *string // a, b, c or NULL
	Amount int64
	Flag   bool
}

func (r isoRow) get(col string) any {
	switch col {
	case "id":
		return r.ID
	case "tenant_id":
		return r.Tenant
	case "kind":
		if r.Kind == nil {
			return nil
		}
		return *r.Kind
	case "amount":
		return r.Amount
	case "flag":
		return r.Flag
	}
	panic("no column " + col)
}

// isoChange is one change written, with its stream sequence once known.
type isoChange struct {
	Seq           uint64
	Table         string // public.orders, public.items
	Op            string // insert, update, delete
	Before, After *isoRow
	txEnd         int // index in changes of its transaction's last change
}

// isoCond is a random condition: its JSON form (feeds' where) and its
// value on a row whose every column is present (two-valued: a comparison
// with NULL is false, as in feeds).
type isoCond struct {
	Kind string
	Col  string
	Val  any
	Vals []any
	Subs []isoCond
}

func (c isoCond) MarshalJSON() ([]byte, error) {
	var v any
	switch c.Kind {
	case "eq", "ne", "lt", "gt":
		v = []any{c.Col, c.Val}
	case "in":
		v = []any{c.Col, c.Vals}
	case "null", "notnull":
		v = c.Col
	case "and", "or":
		v = c.Subs
	case "not":
		v = c.Subs[0]
	}
	return json.Marshal(map[string]any{c.Kind: v})
}

func (c isoCond) eval(r isoRow) bool {
	var v any
	if c.Col != "" {
		v = r.get(c.Col)
	}
	switch c.Kind {
	case "eq":
		return v != nil && v == c.Val
	case "ne":
		return v != nil && v != c.Val
	case "in":
		return v != nil && slices.Contains(c.Vals, v)
	case "lt":
		return v.(int64) < c.Val.(int64)
	case "gt":
		return v.(int64) > c.Val.(int64)
	case "null":
		return v == nil
	case "notnull":
		return v != nil
	case "and":
		for _, s := range c.Subs {
			if !s.eval(r) {
				return false
			}
		}
		return true
	case "or":
		for _, s := range c.Subs {
			if s.eval(r) {
				return true
			}
		}
		return false
	case "not":
		return !c.Subs[0].eval(r)
	}
	panic("kind " + c.Kind)
}

var isoKinds = []string{"a", "b", "c"}

// randCond makes a condition up to depth deep over the tables' columns,
// tenant_id included, so that filters try to reach other tenants.
func randCond(rng *rand.Rand, depth int) isoCond {
	if depth > 1 && rng.IntN(3) > 0 {
		switch rng.IntN(3) {
		case 0:
			return isoCond{Kind: "not", Subs: []isoCond{randCond(rng, depth-1)}}
		default:
			c := isoCond{Kind: []string{"and", "or"}[rng.IntN(2)]}
			for range 2 + rng.IntN(2) {
				c.Subs = append(c.Subs, randCond(rng, depth-1))
			}
			return c
		}
	}
	switch rng.IntN(8) {
	case 0:
		return isoCond{Kind: []string{"eq", "ne"}[rng.IntN(2)], Col: "tenant_id", Val: int64(1 + rng.IntN(isoTenants))}
	case 1:
		return isoCond{Kind: "in", Col: "tenant_id", Vals: []any{int64(1 + rng.IntN(isoTenants)), int64(1 + rng.IntN(isoTenants))}}
	case 2:
		return isoCond{Kind: []string{"eq", "ne"}[rng.IntN(2)], Col: "kind", Val: isoKinds[rng.IntN(3)]}
	case 3:
		return isoCond{Kind: "in", Col: "kind", Vals: []any{isoKinds[rng.IntN(3)], isoKinds[rng.IntN(3)]}}
	case 4:
		return isoCond{Kind: []string{"lt", "gt"}[rng.IntN(2)], Col: "amount", Val: int64(rng.IntN(100))}
	case 5:
		return isoCond{Kind: []string{"null", "notnull"}[rng.IntN(2)], Col: "kind"}
	case 6:
		return isoCond{Kind: "eq", Col: "flag", Val: rng.IntN(2) == 0}
	default:
		return isoCond{Kind: []string{"lt", "gt"}[rng.IntN(2)], Col: "id", Val: int64(rng.IntN(400))}
	}
}

// isoTables is what a tenant's token grants: odd tenants read both
// tables, even ones only orders.
func isoTables(tenant int64) []string {
	if tenant%2 == 1 {
		return []string{"public.items", "public.orders"}
	}
	return []string{"public.orders"}
}

// isoGot is one change as a feed delivered it.
type isoGot struct {
	Seq    uint64         `json:"seq"`
	Op     string         `json:"op"`
	Moved  string         `json:"moved"`
	Table  string         `json:"table"`
	Key    map[string]any `json:"key"`
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
}

// expect returns what a feed of tenant reading tables with filter f
// (nil: none) and ops (nil: all) gets after stream sequence from: the
// oracle's changes through feeds' rules for rows moving into and out of a
// condition, one line per change.
func expect(changes []isoChange, tenant int64, tables []string, f *isoCond, ops []string, from uint64) []string {
	cond := func(r *isoRow) bool { return r.Tenant == tenant && (f == nil || f.eval(*r)) }
	var out []string
	for _, c := range changes {
		if c.Seq <= from || !slices.Contains(tables, c.Table) || (ops != nil && !slices.Contains(ops, c.Op)) {
			continue
		}
		op := ""
		switch c.Op {
		case "insert":
			if cond(c.After) {
				op = "insert"
			}
		case "delete":
			if cond(c.Before) {
				op = "delete"
			}
		case "update":
			a, b := cond(c.After), cond(c.Before)
			switch {
			case a && b:
				op = "update"
			case a:
				op = "insert/in"
			case b:
				op = "delete/out"
			}
		}
		if op != "" {
			out = append(out, fmt.Sprintf("%d %s %s", c.Seq, c.Table, op))
		}
	}
	return out
}

// lines checks that every row image a tenant got is its own and returns
// the changes as expect writes them.
func lines(t *testing.T, tenant int64, got []isoGot) []string {
	t.Helper()
	var out []string
	for _, g := range got {
		for name, img := range map[string]map[string]any{"before": g.Before, "after": g.After} {
			if img != nil && img["tenant_id"] != float64(tenant) {
				t.Fatalf("tenant %d got a row of tenant %v (%s of seq %d, %s %s)", tenant, img["tenant_id"], name, g.Seq, g.Table, g.Op)
			}
		}
		op := g.Op
		if g.Moved != "" {
			op += "/" + g.Moved
		}
		out = append(out, fmt.Sprintf("%d %s %s", g.Seq, g.Table, op))
	}
	return out
}

// TestServeTenantIsolation: no row of another tenant ever reaches a
// caller, whatever filter, resume token or table it asks for; and each
// caller gets exactly its own rows (so an empty answer cannot pass).
func TestServeTenantIsolation(t *testing.T) {
	defer parallel(t)()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("BRIDGE_TEST_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "BRIDGE_TEST_SEED")
	}
	t.Logf("seed %d (BRIDGE_TEST_SEED=%d replays the same writes and filters)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))

	e := newEnv(t)
	for _, tbl := range []string{"orders", "items"} {
		e.pg.ExecT(t, fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, tenant_id bigint NOT NULL, kind text, amount bigint NOT NULL, flag boolean NOT NULL)`, tbl),
			fmt.Sprintf(`ALTER TABLE %s REPLICA IDENTITY FULL`, tbl))
	}
	e.start(e.config("iso", ""))
	waitSlotActive(t, e, "slot_iso")

	// The writes: transactions mixing tenants and tables; inserts,
	// updates (some moving a row to another tenant) and deletes.
	conn := e.pg.Conn(t, "")
	rows := map[string]map[int64]*isoRow{"public.orders": {}, "public.items": {}}
	var changes []isoChange
	nextID := int64(1)
	randRow := func(id int64) *isoRow {
		r := &isoRow{ID: id, Tenant: int64(1 + rng.IntN(isoTenants)), Amount: int64(rng.IntN(100)), Flag: rng.IntN(2) == 0}
		if k := rng.IntN(4); k < 3 {
			r.Kind = &isoKinds[k]
		}
		return r
	}
	anyRow := func(tbl string) *isoRow {
		ids := make([]int64, 0, len(rows[tbl]))
		for id := range rows[tbl] {
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return nil
		}
		slices.Sort(ids)
		return rows[tbl][ids[rng.IntN(len(ids))]]
	}
	for range 300 {
		first := len(changes)
		err := pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
			for range 1 + rng.IntN(5) {
				tbl := []string{"public.orders", "public.items"}[rng.IntN(2)]
				name := strings.TrimPrefix(tbl, "public.")
				old := anyRow(tbl)
				switch n := rng.IntN(10); {
				case old == nil || n < 5:
					r := randRow(nextID)
					nextID++
					if _, err := tx.Exec(t.Context(), `INSERT INTO `+name+` VALUES ($1, $2, $3, $4, $5)`, r.ID, r.Tenant, r.Kind, r.Amount, r.Flag); err != nil {
						return err
					}
					rows[tbl][r.ID] = r
					changes = append(changes, isoChange{Table: tbl, Op: "insert", After: r})
				case n < 8:
					r := *old
					r.Amount = int64(rng.IntN(100))
					if rng.IntN(3) == 0 {
						r.Kind = randRow(0).Kind
					}
					if rng.IntN(5) == 0 {
						r.Tenant = int64(1 + rng.IntN(isoTenants)) // moves to another tenant
					}
					if _, err := tx.Exec(t.Context(), `UPDATE `+name+` SET tenant_id = $2, kind = $3, amount = $4 WHERE id = $1`, r.ID, r.Tenant, r.Kind, r.Amount); err != nil {
						return err
					}
					before := *old
					rows[tbl][r.ID] = &r
					changes = append(changes, isoChange{Table: tbl, Op: "update", Before: &before, After: &r})
				default:
					if _, err := tx.Exec(t.Context(), `DELETE FROM `+name+` WHERE id = $1`, old.ID); err != nil {
						return err
					}
					delete(rows[tbl], old.ID)
					changes = append(changes, isoChange{Table: tbl, Op: "delete", Before: old})
				}
			}
			return nil
		})
		require.NoError(t, err)
		for k := first; k < len(changes); k++ {
			changes[k].txEnd = len(changes) - 1
		}
	}
	// Each change is one message, in commit order: align the oracle with
	// the stream's sequences, checking table and op on the way.
	msgs := e.waitCount("CDC_iso", len(changes), 2*time.Minute)
	require.Len(t, msgs, len(changes))
	for i, m := range msgs {
		require.Equal(t, changes[i].Table, m.Header.Get("Bridge-Table"), "message %d", m.Seq)
		require.Equal(t, changes[i].Op, m.Header.Get("Bridge-Op"), "message %d", m.Seq)
		changes[i].Seq = m.Seq
	}

	base := startFeeds(t, e, "CDC_iso", config.Serve{
		Listen: "127.0.0.1:0",
		Auth: config.ServeAuth{
			HS256Secret: testSecret, Leeway: 30 * time.Second, TablesClaim: "tables", QueryToken: true,
			Where: map[string]any{"eq": []any{"tenant_id", "{{.claims.tenant_id}}"}},
		},
	})
	token := func(tenant any, tables []string) string {
		c := jwt.MapClaims{"sub": fmt.Sprint("user-", tenant), "tenant_id": tenant, "exp": time.Now().Add(time.Hour).Unix()}
		if tables != nil {
			c["tables"] = tables
		}
		return mint(t, testSecret, c)
	}
	// read follows a feed from token from (long-poll) until it is up to
	// date; the status of the first refused request ends it.
	read := func(tok string, q url.Values, from string) ([]isoGot, int) {
		var got []isoGot
		q.Set("token", from)
		q.Set("timeout", "100ms")
		for {
			resp, body := get(t, base, q, http.Header{"Authorization": {"Bearer " + tok}})
			if resp.StatusCode != http.StatusOK {
				return got, resp.StatusCode
			}
			for _, raw := range body.Changes {
				var g isoGot
				require.NoError(t, json.Unmarshal(raw, &g))
				got = append(got, g)
			}
			if body.UpToDate {
				return got, http.StatusOK
			}
			q.Set("token", body.Token)
		}
	}
	start := changes[0].Seq - 1
	streamID := strings.Split(mustPosition(t, base, token(1, isoTables(1))), ".")[0]
	at := func(seq uint64) string { return fmt.Sprintf("%s.%d", streamID, seq) }

	delivered := 0
	for tenant := int64(1); tenant <= isoTenants; tenant++ {
		tok := token(tenant, isoTables(tenant))
		check := func(what string, q url.Values, f *isoCond, ops []string, from uint64) {
			got, code := read(tok, q, at(from))
			require.Equal(t, http.StatusOK, code, "tenant %d, %s", tenant, what)
			want := expect(changes, tenant, isoTables(tenant), f, ops, from)
			require.Equal(t, want, lines(t, tenant, got), "tenant %d, %s (query %s)", tenant, what, q.Encode())
			delivered += len(got)
		}
		check("no filter", url.Values{}, nil, nil, start)
		for i := range 3 {
			f := randCond(rng, 4)
			b, err := json.Marshal(f)
			require.NoError(t, err)
			q := url.Values{"where": {string(b)}}
			var ops []string
			if rng.IntN(3) == 0 {
				ops = []string{"insert", "update", "delete"}[:1+rng.IntN(2)]
				q.Set("ops", strings.Join(ops, ","))
			}
			check(fmt.Sprintf("random filter %d", i), q, &f, ops, start)
		}
		// Filters that try to widen to another tenant's rows.
		other := 1 + (tenant+int64(rng.IntN(isoTenants-1)))%isoTenants
		widen := isoCond{Kind: "or", Subs: []isoCond{{Kind: "eq", Col: "tenant_id", Val: other}, {Kind: "notnull", Col: "id"}}}
		b, _ := json.Marshal(widen)
		check("or: [tenant_id = other]", url.Values{"where": {string(b)}}, &widen, nil, start)
		notMe := isoCond{Kind: "not", Subs: []isoCond{{Kind: "eq", Col: "tenant_id", Val: tenant}}}
		b, _ = json.Marshal(notMe)
		check("not tenant_id = me", url.Values{"where": {string(b)}}, &notMe, nil, start)

		// Another tenant's resume token: a position, nothing more.
		otherGot, code := read(token(other, isoTables(other)), url.Values{}, at(start))
		require.Equal(t, http.StatusOK, code)
		if len(otherGot) > 0 {
			// A token is at a transaction boundary: the end of the
			// transaction of the other tenant's middle row.
			mid := otherGot[len(otherGot)/2].Seq
			i := slices.IndexFunc(changes, func(c isoChange) bool { return c.Seq == mid })
			require.GreaterOrEqual(t, i, 0)
			mid = changes[changes[i].txEnd].Seq
			check("another tenant's token", url.Values{}, nil, nil, mid)
			// The same over SSE, as Last-Event-ID (and the token in the
			// query, as a browser's EventSource sends it).
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			q := url.Values{"access_token": {tok}}
			resp := openSSE(t, ctx, base, q, at(mid))
			evs := readSSE(resp.Body, func(ev sseEvent) bool { return ev.event == "up-to-date" })
			resp.Body.Close()
			cancel()
			var got []isoGot
			for _, ev := range evs {
				if ev.event != "changes" {
					continue
				}
				var body struct {
					Changes []isoGot `json:"changes"`
				}
				require.NoError(t, json.Unmarshal([]byte(ev.data), &body))
				got = append(got, body.Changes...)
			}
			require.Equal(t, expect(changes, tenant, isoTables(tenant), nil, nil, mid), lines(t, tenant, got), "tenant %d over SSE from tenant %d's event id", tenant, other)
		}

		// Tables outside the claim.
		if tenant%2 == 0 {
			_, code := read(tok, url.Values{"tables": {"public.items"}}, at(start))
			require.Equal(t, http.StatusForbidden, code, "tenant %d asks for a table its token does not grant", tenant)
			_, code = read(tok, url.Values{"tables": {"public.orders,public.items"}}, at(start))
			require.Equal(t, http.StatusForbidden, code)
		}
	}
	require.Positive(t, delivered)
	t.Logf("%d changes written, %d delivered across %d tenants' feeds", len(changes), delivered, isoTenants)

	// Crafted tokens.
	for name, tc := range map[string]struct {
		token string
		code  int
	}{
		"another tenant's claims, wrong key": {mint(t, strings.Repeat("k", 40), jwt.MapClaims{"tenant_id": 1, "tables": isoTables(1), "exp": time.Now().Add(time.Hour).Unix()}), http.StatusUnauthorized},
		"alg none":                           {noneToken(t, jwt.MapClaims{"tenant_id": 1, "tables": isoTables(1), "exp": time.Now().Add(time.Hour).Unix()}), http.StatusUnauthorized},
		"expired":                            {mint(t, testSecret, jwt.MapClaims{"tenant_id": 1, "tables": isoTables(1), "exp": time.Now().Add(-time.Hour).Unix()}), http.StatusUnauthorized},
		"no tenant claim":                    {token(nil, isoTables(1)), http.StatusForbidden},
		"every tenant as a list":             {token([]int{1, 2, 3}, isoTables(1)), http.StatusForbidden},
		"a condition as the tenant":          {token(map[string]any{"notnull": "id"}, isoTables(1)), http.StatusForbidden},
		"no tables claim":                    {token(1, nil), http.StatusForbidden},
		"an injection as the tenant":         {token(`1"]},{"notnull":"id"},{"eq":["x","`, isoTables(1)), http.StatusOK},
	} {
		got, code := read(tc.token, url.Values{}, at(start))
		require.Equal(t, tc.code, code, name)
		require.Empty(t, got, name)
	}
}
