package e2e_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/internal/testseed"
)

const shapeKey = "e2e-shaping-hash-key-0123456789"

func hmacHex(s string) string {
	m := hmac.New(sha256.New, []byte(shapeKey))
	m.Write([]byte(s))
	return hex.EncodeToString(m.Sum(nil))
}

// published is every byte of a stored message a consumer can read: the
// subject, the headers and the payload.
func published(m msg) string {
	var b strings.Builder
	b.WriteString(m.Subject)
	for k, vs := range m.Header {
		for _, v := range vs {
			b.WriteString("\n" + k + ": " + v)
		}
	}
	b.WriteString("\n")
	b.Write(m.Raw)
	return b.String()
}

// shapingRoutes are the routes of TestShapingEveryFormat for bridge name
// in format f: users with a filter, a column left out and three masks;
// the drafts that filter rejects fall through to a second route; an
// outbox table published through a transform.
func shapingRoutes(name, f string) string {
	return fmt.Sprintf(`  - match: { tables: [public.users] }
    sinks: [js]
    format: %[2]s
    subject: "cdc.%[1]s.users.{{.Col.tenant}}.{{.Key.id}}"
    filter: 'op in ["delete", "truncate"] || after.status != "draft" && after.total > 10'
    columns: [{ exclude: [password_hash] }]
    mask:
      - hash: [email]
        hash_key: %[3]s
        redact: [notes]
        truncate: { name: 3 }
  - match: { tables: [public.users] }
    sinks: [js]
    format: %[2]s
    subject: "cdc.%[1]s.drafts.{{.Key.id}}"
    columns: [{ include: [status] }]
  - match: { tables: [public.outbox], ops: [insert] }
    sinks: [js]
    format: %[2]s
    subject: "cdc.%[1]s.outbox.{{.Col.aggregate_type}}.{{.Out.event}}"
    transform: 'after.payload'
`, name, f, shapeKey)
}

// TestShapingEveryFormat runs one bridge per format against one database:
// an initial snapshot, inserts, a filtered insert falling through to the
// next route, an update leaving a TOASTed column unchanged, a delete, an
// outbox insert through a transform and a truncate. Each message has the
// route's subject, the row as shaped, the masked columns listed where the
// format puts them, and no byte of a left-out or masked value.
func TestShapingEveryFormat(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE users (id int PRIMARY KEY, email text, password_hash text, name text, notes text,
			status text, total numeric, tenant int, bio text)`,
		`ALTER TABLE users ALTER COLUMN bio SET STORAGE EXTERNAL`,
		`CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_type text, aggregate_id text, payload jsonb)`,
		`INSERT INTO users VALUES (1, 'snap@example.com', 'pwhash-snapshot', 'Snapshotted', 'note-snapshot', 'paid', 150.5, 7, 'bio')`)
	formats := []string{"native", "debezium", "cloudevents"}
	runs := map[string]*running{}
	for _, f := range formats {
		name := "sh" + f[:3]
		p := e.configRoutes(name, "      snapshot:\n        mode: initial\n        request_poll: 200ms", shapingRoutes(name, f))
		runs[f] = e.start(p)
	}
	for _, f := range formats {
		name := "sh" + f[:3]
		waitSlotActive(t, e, "slot_"+name)
		e.waitSnapshotDone(name, 2*time.Minute, nil)
	}
	big := strings.Repeat("toasted-", 2000)
	e.pg.ExecT(t,
		`INSERT INTO users VALUES (2, 'ann@example.com', 'pwhash-ann', 'Annabelle', 'note-ann', 'paid', 200.25, 7, '`+big+`')`,
		`INSERT INTO users VALUES (3, 'bob@example.com', 'pwhash-bob', 'Bobby', 'note-bob', 'draft', 5, 8, 'short')`,
		`INSERT INTO users VALUES (4, 'cheap@example.com', 'pwhash-cheap', 'Cheapskate', 'note-cheap', 'paid', 1, 8, 'short')`,
		`UPDATE users SET status = 'shipped' WHERE id = 2`,
		`DELETE FROM users WHERE id = 3`,
		`INSERT INTO outbox (aggregate_type, aggregate_id, payload) VALUES ('order', 'o-1', '{"event": "created", "order": "o-1", "lines": [1, 2]}')`,
		`TRUNCATE users`)

	secrets := []string{"pwhash", "ann@example.com", "bob@example.com", "snap@example.com", "cheap@example.com",
		"note-", "Annabelle", "abelle", "Snapshotted", "pshotted", "Bobby", "Cheapskate"}
	for _, f := range formats {
		t.Run(f, func(t *testing.T) {
			name := "sh" + f[:3]
			ms := e.waitCount("CDC_"+name, 8, time.Minute)
			require.Len(t, ms, 8, "snapshot read, insert 2, insert 3 (drafts), insert 4 (drafts), update 2, delete 3, outbox, truncate")
			var subjects []string
			for _, m := range ms {
				subjects = append(subjects, m.Subject)
				p := published(m)
				for _, s := range secrets {
					require.NotContains(t, p, s, "message %d (%s)", m.Seq, m.Subject)
				}
			}
			pre := "cdc." + name + "."
			require.Equal(t, []string{pre + "users.7.1", pre + "users.7.2", pre + "drafts.3", pre + "drafts.4", pre + "users.7.2",
				pre + "users._.3", pre + "outbox.order.created", pre + "users._._"}, subjects)

			// The rows, wherever the format puts them.
			row := func(m msg, img string) map[string]any {
				body := m.Body
				if f == "cloudevents" {
					body = body["data"].(map[string]any)
				}
				r, _ := body[img].(map[string]any)
				return r
			}
			maskedOf := func(m msg) any {
				switch f {
				case "debezium":
					return m.Body["source"].(map[string]any)["masked"]
				case "cloudevents":
					require.Equal(t, "email=hash,name=truncate,notes=redact", m.Body["pgmasked"])
					return m.Body["data"].(map[string]any)["masked"]
				}
				return m.Body["masked"]
			}
			wantMasked := map[string]any{"email": "hash", "name": "truncate", "notes": "redact"}
			for _, i := range []int{0, 1, 4, 5} {
				require.Equal(t, "email=hash,name=truncate,notes=redact", ms[i].Header.Get("Bridge-Masked"), "message %d", i)
				require.Equal(t, wantMasked, maskedOf(ms[i]), "message %d", i)
			}
			snap := row(ms[0], "after")
			require.Equal(t, hmacHex("snap@example.com"), snap["email"])
			require.Equal(t, "Sna", snap["name"])
			require.Contains(t, snap, "notes")
			require.Nil(t, snap["notes"])
			require.NotContains(t, snap, "password_hash")
			ins := row(ms[1], "after")
			require.Equal(t, hmacHex("ann@example.com"), ins["email"])
			require.Equal(t, "Ann", ins["name"])
			require.Equal(t, big, ins["bio"])
			require.Equal(t, map[string]any{"id": 3.0, "status": "draft"}, row(ms[2], "after"), "the drafts route publishes only the key and status")
			require.Empty(t, ms[2].Header.Get("Bridge-Masked"))
			require.Empty(t, ms[7].Header.Get("Bridge-Masked"), "a truncate has no row to mask")
			upd := row(ms[4], "after")
			require.Equal(t, "shipped", upd["status"])
			require.Equal(t, hmacHex("ann@example.com"), upd["email"])
			switch f {
			case "debezium":
				require.Equal(t, "__debezium_unavailable_value", upd["bio"], "an unchanged TOAST value stays unchanged")
			default:
				require.NotContains(t, upd, "bio")
			}
			if f == "debezium" {
				require.Equal(t, map[string]any{"id": 3.0, "email": nil, "name": nil, "notes": nil, "status": nil, "total": nil, "tenant": nil, "bio": nil}, row(ms[5], "before"))
			} else {
				require.Equal(t, map[string]any{"id": 3.0}, row(ms[5], "before"))
			}
			// The outbox body is the payload column, as written.
			body := ms[6].Body
			if f == "cloudevents" {
				require.Equal(t, "io.bridgecdc.insert", body["type"])
				body = body["data"].(map[string]any)
			}
			require.Equal(t, map[string]any{"event": "created", "order": "o-1", "lines": []any{1.0, 2.0}}, body)
		})
	}
}

// TestShapingErrorStopsAndResumes: a filter naming a column the table
// does not have stops the bridge on the table's first change, with the
// route's YAML path, the CEL position and the table; nothing is
// published or acknowledged past it, so once the filter is fixed the
// change arrives, once.
func TestShapingErrorStopsAndResumes(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, status text, total numeric)`)
	bad := e.configRoutes("shbad", "", `  - sinks: [js]
    subject: "cdc.shbad.{{.Table}}"
    filter: 'after.totl > 10.0'
`)
	r := e.start(bad)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO orders VALUES (1, 'paid', 50)`)
	err := r.stopped(t, 60*time.Second, "with a filter naming a missing column")
	require.ErrorContains(t, err, "routes[0].filter:1:6: undefined field 'totl' (checked against public.orders)")
	time.Sleep(300 * time.Millisecond)
	require.Empty(t, e.messages("CDC_shbad"), "nothing is published past the failing change")

	good := withConfig(t, bad, "after.totl", "after.total")
	r = e.start(good)
	ms := e.waitCount("CDC_shbad", 1, time.Minute)
	time.Sleep(500 * time.Millisecond)
	ms = e.messages("CDC_shbad")
	require.Len(t, ms, 1)
	require.Equal(t, "cdc.shbad.orders", ms[0].Subject)
	r.stop(t)
}

// TestValidateConnectShaping: `validate --connect` type-checks each
// route's filter, columns, masks and transform against the catalog: a
// misspelt column in a filter, a truncated number, a key left out and a
// glob rule naming a column no table has each fail with the YAML path and
// the table's columns; a correct route passes, naming the tables.
func TestValidateConnectShaping(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE orders (id int PRIMARY KEY, status text, total numeric, email text)`,
		`CREATE TABLE users (id int PRIMARY KEY, email text, password_hash text)`)
	good := e.configRoutes("vcs", "", `  - match: { tables: [public.orders] }
    sinks: [js]
    subject: "cdc.vcs.{{.Table}}"
    filter: 'after.status in ["paid", "shipped"] && after.total > 100'
    mask: [{ hash: [email], hash_key: `+shapeKey+` }]
  - match: { tables: [public.*] }
    sinks: [js]
    subject: "cdc.vcs.{{.Table}}"
    columns: [{ exclude: [password_hash] }]
`)
	code, out, errs := execCLI(t, "validate", "--connect", "-c", good)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errs)
	requireLine(t, out, "ok", "routes[0] filter, mask: checked against public.orders")
	requireLine(t, out, "ok", "routes[1] columns: checked against public.orders, public.users") // routes[0] filters: orders may reach routes[1]

	bad := withConfig(t, good, "after.status in", "after.statuss in", "exclude: [password_hash]", "exclude: [pasword_hash]")
	bad = withConfig(t, bad, "mask: [{ hash: [email]", "mask: [{ truncate: { total: 2 }, hash: [email]")
	code, out, _ = execCLI(t, "validate", "--connect", "-c", bad)
	require.Equal(t, 1, code, out)
	requireLine(t, out, "FAIL", "routes[0].filter:1:6: undefined field 'statuss' (checked against public.orders)")
	requireLine(t, out, "FAIL", "routes[0].mask[0].truncate.total: public.orders.total is numeric, and truncate applies to text and bytea columns")
	requireLine(t, out, "FAIL", `routes[1].columns[0].exclude[0]: no table the rule applies to has a column "pasword_hash"`)
	require.Contains(t, out, "fix: the columns of public.orders: id int4 (int, key), status text (string), total numeric (double), email text (string)")

	keyOut := withConfig(t, good, "exclude: [password_hash]", "exclude: [id]")
	code, out, _ = execCLI(t, "validate", "--connect", "-c", keyOut)
	require.Equal(t, 1, code, out)
	requireLine(t, out, "FAIL", `routes[1].columns[0].exclude[0]: "id" is part of the key of public.users, which every message keeps`)
}

// shapeType is a column type of the end-to-end property test and how to
// make a value no other byte of a message holds.
type shapeType struct {
	sql  string
	gen  func(rng *rand.Rand) (lit string, needles []string)
	text bool // truncate applies
}

func secretWord(rng *rand.Rand) string {
	const alpha = "ghijklmnopqrstuvwxyz"
	b := make([]byte, 14)
	for i := range b {
		b[i] = alpha[rng.IntN(len(alpha))]
	}
	return string(b)
}

var shapeTypes = []shapeType{
	{"text", func(rng *rand.Rand) (string, []string) {
		s := "zz" + secretWord(rng)
		return "'" + s + "'", []string{s[3:]}
	}, true},
	{"varchar(40)", func(rng *rand.Rand) (string, []string) {
		s := "zz" + secretWord(rng)
		return "'" + s + "'", []string{s[3:]}
	}, true},
	{"bigint", func(rng *rand.Rand) (string, []string) {
		v := strconv.FormatInt(int64(9e15)+rng.Int64N(9e14), 10)
		return v, []string{v}
	}, false},
	{"jsonb", func(rng *rand.Rand) (string, []string) {
		s := secretWord(rng)
		return `'{"k": "` + s + `"}'`, []string{s}
	}, false},
	{"bytea", func(rng *rand.Rand) (string, []string) {
		s := "zz" + secretWord(rng)
		return `'\x` + hex.EncodeToString([]byte(s)) + `'`, []string{base64.StdEncoding.EncodeToString([]byte(s))}
	}, true},
}

// TestShapingPropertyEndToEnd: through real bridges, for random column
// sets, include/exclude/mask configurations and formats (seeded, logged),
// no value of a left-out or masked column is in any byte of any stored
// message, subject and headers included.
func TestShapingPropertyEndToEnd(t *testing.T) {
	defer parallel(t)()
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "BRIDGE_PROPERTY_SEED"), 11))
	e := newEnv(t)
	const bridges, rows = 3, 25
	type plan struct {
		name, table string
		types       []shapeType
		hidden      map[int]bool // column index → left out or masked (for truncate: the tail)
		cfg         string
	}
	var plans []plan
	for b := range bridges {
		p := plan{name: fmt.Sprintf("shp%d", b), table: fmt.Sprintf("prop%d", b), hidden: map[int]bool{}}
		ncol := 3 + rng.IntN(5)
		cols := []string{"id bigint PRIMARY KEY"}
		for i := range ncol {
			st := shapeTypes[rng.IntN(len(shapeTypes))]
			p.types = append(p.types, st)
			cols = append(cols, fmt.Sprintf("c%d %s", i, st.sql))
		}
		e.pg.ExecT(t, fmt.Sprintf(`CREATE TABLE %s (%s)`, p.table, strings.Join(cols, ", ")))
		var colCfg, redact, hash, trunc []string
		mode := rng.IntN(3)
		for i, st := range p.types {
			n := fmt.Sprintf("c%d", i)
			switch {
			case mode == 0 && rng.IntN(2) == 0:
				p.hidden[i] = true // not included
				continue
			case mode == 0:
				colCfg = append(colCfg, n)
			case mode == 1 && rng.IntN(3) == 0:
				colCfg = append(colCfg, n)
				p.hidden[i] = true
				continue
			}
			switch rng.IntN(4) {
			case 0:
				redact = append(redact, n)
				p.hidden[i] = true
			case 1:
				hash = append(hash, n)
				p.hidden[i] = true
			case 2:
				if st.text {
					trunc = append(trunc, n+": 3")
					p.hidden[i] = true
				}
			}
		}
		var y strings.Builder
		f := []string{"native", "debezium", "cloudevents"}[rng.IntN(3)]
		subjCol := "id"
		for i := range p.types {
			if !slices.Contains(colCfg, fmt.Sprintf("c%d", i)) && mode == 1 || mode == 0 && slices.Contains(colCfg, fmt.Sprintf("c%d", i)) {
				if rng.IntN(2) == 0 {
					subjCol = fmt.Sprintf("c%d", i)
				}
			}
		}
		fmt.Fprintf(&y, "  - match: { tables: [public.%s] }\n    sinks: [js]\n    format: %s\n    subject: \"cdc.%s.{{.Table}}.{{.Col.%s}}\"\n", p.table, f, p.name, subjCol)
		switch {
		case mode == 0 && len(colCfg) > 0:
			fmt.Fprintf(&y, "    columns: [{ include: [%s] }]\n", strings.Join(colCfg, ", "))
		case mode == 0:
			fmt.Fprintf(&y, "    columns: [{ include: [id] }]\n")
		case mode == 1 && len(colCfg) > 0:
			fmt.Fprintf(&y, "    columns: [{ tables: [public.%s], exclude: [%s] }]\n", p.table, strings.Join(colCfg, ", "))
		}
		if len(redact)+len(hash)+len(trunc) > 0 {
			fmt.Fprintf(&y, "    mask:\n      - redact: [%s]\n        hash: [%s]\n        hash_key: %s\n        truncate: { %s }\n",
				strings.Join(redact, ", "), strings.Join(hash, ", "), shapeKey, strings.Join(trunc, ", "))
		}
		p.cfg = y.String()
		t.Logf("%s (%s): %v\n%s", p.name, p.table, colTypes(p.types), p.cfg)
		plans = append(plans, p)
	}
	for _, p := range plans {
		e.start(e.configRoutes(p.name, "", p.cfg))
		waitSlotActive(t, e, "slot_"+p.name)
	}
	needles := make([][]string, bridges)
	for b, p := range plans {
		for r := 1; r <= rows; r++ {
			vals := []string{strconv.Itoa(r)}
			for i, st := range p.types {
				lit, ns := st.gen(rng)
				if rng.IntN(8) == 0 {
					lit, ns = "NULL", nil
				}
				vals = append(vals, lit)
				if p.hidden[i] {
					needles[b] = append(needles[b], ns...)
				}
			}
			e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO %s VALUES (%s)`, p.table, strings.Join(vals, ", ")))
		}
		e.pg.ExecT(t, fmt.Sprintf(`UPDATE %s SET id = id + 1000 WHERE id %% 5 = 0`, p.table), fmt.Sprintf(`DELETE FROM %s WHERE id %% 7 = 0`, p.table))
	}
	for b, p := range plans {
		ms := e.waitCount("CDC_"+p.name, rows+rows/5+rows/7, 2*time.Minute)
		for _, m := range ms {
			pub := published(m)
			for _, n := range needles[b] {
				require.NotContains(t, pub, n, "%s: message %d (%s) publishes a left-out or masked value", p.name, m.Seq, m.Subject)
			}
		}
	}
}

func colTypes(ts []shapeType) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.sql)
	}
	return out
}

// TestShapingFilterKill9: with a filter and masks on the route, the
// bridge is killed with SIGKILL again and again while rows are committed;
// every row the filter takes arrives exactly once, none it rejects does,
// and no masked value is ever published.
func TestShapingFilterKill9(t *testing.T) {
	defer parallel(t)()
	bin := bridgeBinary(t)
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE events (id bigint PRIMARY KEY, kind text, secret text, pad text)`)
	cfg := e.configRoutes("shkill", "", `  - sinks: [js]
    subject: "cdc.shkill.{{.Table}}.{{.Col.kind}}"
    filter: 'op == "insert" && after.id % 3 != 0'
    columns: [{ exclude: [pad] }]
    mask: [{ hash: [secret], hash_key: `+shapeKey+` }]
`)
	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_shkill")

	const total = 3000
	var committed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn := e.pg.Conn(t, "")
		for id := 1; id <= total; id += 10 {
			var vals []string
			for k := id; k < id+10; k++ {
				vals = append(vals, fmt.Sprintf("(%d, 'k%d', 'secret-%d-xyzzy', 'pad-%d-plugh')", k, k%4, k, k))
			}
			if _, err := conn.Exec(t.Context(), `INSERT INTO events VALUES `+strings.Join(vals, ", ")); err != nil {
				t.Errorf("insert: %v", err)
				return
			}
			committed.Store(int64(id + 9))
			time.Sleep(10 * time.Millisecond) // a few seconds of writes: the kills land mid-stream
		}
	}()
	kills := 0
	for committed.Load() < total || kills < 4 {
		time.Sleep(time.Duration(300+rand.N(700)) * time.Millisecond)
		p.kill9(t)
		kills++
		p = startProc(t, bin, cfg)
	}
	wg.Wait()
	want := 0
	for id := 1; id <= total; id++ {
		if id%3 != 0 {
			want++
		}
	}
	ms := e.waitCount("CDC_shkill", want, 2*time.Minute)
	time.Sleep(time.Second)
	ms = e.messages("CDC_shkill")
	p.term(t)
	t.Logf("killed the bridge %d times; %d messages", kills, len(ms))
	checkOrdered(t, ms)
	seen := map[int64]bool{}
	for _, m := range ms {
		pub := published(m)
		require.NotContains(t, pub, "xyzzy")
		require.NotContains(t, pub, "plugh")
		after := m.Body["after"].(map[string]any)
		id := int64(after["id"].(float64))
		require.NotZero(t, id%3, "row %d: the filter rejects it", id)
		require.False(t, seen[id], "row %d published twice", id)
		seen[id] = true
		require.Equal(t, hmacHex(fmt.Sprintf("secret-%d-xyzzy", id)), after["secret"])
		require.Equal(t, fmt.Sprintf("cdc.shkill.events.k%d", id%4), m.Subject)
	}
	require.Len(t, seen, want, "every row the filter takes arrives")
}
