package feeds

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// spec is a random feed: its filter and the same predicate written
// independently in Go, for the oracle.
type spec struct {
	name   string
	filter Filter
	pred   func(o *order) bool
}

var statuses = []string{"open", "paid", "void", "sent"}
var tagSet = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}

func randomSpec(r *rand.Rand) spec {
	t := int64(r.IntN(200))
	switch r.IntN(8) {
	case 0:
		return spec{fmt.Sprintf("tenant=%d", t), Filter{Where: Eq("tenant", t).Ptr()},
			func(o *order) bool { return o.Tenant == t }}
	case 1:
		s1, s2 := statuses[r.IntN(4)], statuses[r.IntN(4)]
		return spec{fmt.Sprintf("tenant=%d&status in %s,%s", t, s1, s2),
			Filter{Tables: []string{"public.orders"}, Where: And(Eq("tenant", t), In("status", s1, s2)).Ptr(), Columns: []string{"id", "status"}},
			func(o *order) bool { return o.Tenant == t && (o.Status == s1 || o.Status == s2) }}
	case 2:
		a, b := tagSet[r.IntN(len(tagSet))], tagSet[r.IntN(len(tagSet))]
		return spec{"tags@>" + a + b, Filter{Where: Contains("tags", a, b).Ptr()},
			func(o *order) bool { return hasTag(o, a) && hasTag(o, b) }}
	case 3:
		x := int64(900 + r.IntN(100))
		return spec{fmt.Sprintf("amount>=%d", x), Filter{Where: Gte("amount", x).Ptr(), Columns: []string{"amount"}},
			func(o *order) bool { return float64(o.Amount)+0.5 >= float64(x) }}
	case 4:
		t2 := int64(r.IntN(200))
		return spec{fmt.Sprintf("tenant=%d|tenant=%d", t, t2), Filter{Where: Or(Eq("tenant", t), Eq("tenant", t2)).Ptr()},
			func(o *order) bool { return o.Tenant == t || o.Tenant == t2 }}
	case 5:
		k := int64(r.IntN(300))
		return spec{fmt.Sprintf("id=%d", k), Filter{Where: Eq("id", k).Ptr()},
			func(o *order) bool { return o.ID == k }}
	case 6:
		return spec{"tenant=t&not void&note null", Filter{Where: And(Eq("tenant", t), Not(Eq("status", "void")), IsNull("note")).Ptr()},
			func(o *order) bool { return o.Tenant == t && o.Status != "void" && o.Note == nil }}
	default:
		return spec{fmt.Sprintf("tenant in %d..%d, amount<500", t, t+3), Filter{Where: And(In("tenant", t, t+1, t+2), Lt("amount", 500)).Ptr()},
			func(o *order) bool { return o.Tenant >= t && o.Tenant <= t+2 && float64(o.Amount)+0.5 < 500 }}
	}
}

func hasTag(o *order, tag string) bool {
	for _, x := range o.Tags {
		if x == tag {
			return true
		}
	}
	return false
}

// workload makes random transactions over a set of live orders.
type workload struct {
	r    *rand.Rand
	g    *gen
	live map[int64]order
	next int64
}

func (w *workload) randomOrder(id int64) order {
	o := order{ID: id, Tenant: int64(w.r.IntN(200)), Status: statuses[w.r.IntN(4)], Amount: int64(w.r.IntN(1000))}
	for _, tg := range tagSet {
		if w.r.IntN(5) == 0 {
			o.Tags = append(o.Tags, tg)
		}
	}
	if w.r.IntN(3) == 0 {
		o.Note = strp("n")
	}
	return o
}

func (w *workload) tx() []cdc.Change {
	var ops []op
	for range 1 + w.r.IntN(4) {
		switch p := w.r.IntN(10); {
		case p < 3 || len(w.live) < 10:
			o := w.randomOrder(w.next)
			w.next++
			w.live[o.ID] = o
			ops = append(ops, ins(o))
		case p < 9:
			id := w.pick()
			a := w.live[id]
			b := w.randomOrder(id)
			if w.r.IntN(2) == 0 { // often a small change that keeps most filters
				b = a
				b.Status = statuses[w.r.IntN(4)]
			}
			w.live[id] = b
			ops = append(ops, upd(a, b))
		default:
			id := w.pick()
			ops = append(ops, del(w.live[id]))
			delete(w.live, id)
		}
	}
	return w.g.tx(ops...)
}

func (w *workload) pick() int64 {
	n := w.r.IntN(len(w.live))
	for id := range w.live {
		if n == 0 {
			return id
		}
		n--
	}
	panic("empty")
}

// streamMsg is a message of the stream as the oracle reads it, decoded
// with encoding/json, independently of the package.
type streamMsg struct {
	seq           uint64
	op            cdc.Op
	lsn           string
	before, after *order
}

func readStream(t testing.TB, js jetstream.JetStream) []streamMsg {
	t.Helper()
	cons, err := js.OrderedConsumer(t.Context(), "CDC", jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	info, err := js.Stream(t.Context(), "CDC")
	require.NoError(t, err)
	si, err := info.Info(t.Context())
	require.NoError(t, err)
	var out []streamMsg
	for uint64(len(out)) < si.State.Msgs {
		b, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range b.Messages() {
			meta, err := m.Metadata()
			require.NoError(t, err)
			var p struct{ Before, After map[string]any }
			require.NoError(t, json.Unmarshal(m.Data(), &p))
			_, pos, err := cdc.ParseID(m.Headers().Get("Nats-Msg-Id"))
			require.NoError(t, err)
			out = append(out, streamMsg{seq: meta.Sequence.Stream, op: cdc.Op(m.Headers().Get("Bridge-Op")),
				lsn: pos.LSN.Hex(), before: toOrder(p.Before), after: toOrder(p.After)})
		}
		require.NoError(t, b.Error())
	}
	return out
}

func toOrder(m map[string]any) *order {
	if m == nil {
		return nil
	}
	o := &order{ID: int64(m["id"].(float64)), Tenant: int64(m["tenant"].(float64)), Status: m["status"].(string)}
	for _, x := range m["tags"].([]any) {
		o.Tags = append(o.Tags, x.(string))
	}
	amt, _ := strconv.ParseFloat(fmt.Sprint(m["amount"]), 64)
	o.Amount = int64(amt)
	if n, ok := m["note"].(string); ok {
		o.Note = &n
	}
	return o
}

// expected is the oracle: what a feed with predicate pred must receive,
// as "seq:op" strings, with full before images (REPLICA IDENTITY FULL).
func expected(msgs []streamMsg, pred func(*order) bool) []string {
	var out []string
	for _, m := range msgs {
		var op string
		switch m.op {
		case cdc.OpInsert:
			if pred(m.after) {
				op = "insert"
			}
		case cdc.OpDelete:
			if pred(m.before) {
				op = "delete"
			}
		case cdc.OpUpdate:
			a, b := pred(m.after), pred(m.before)
			switch {
			case a && !b:
				op = "insert"
			case a:
				op = "update"
			case b:
				op = "delete"
			}
		}
		if op != "" {
			out = append(out, fmt.Sprintf("%d:%s", m.seq, op))
		}
	}
	return out
}

// poller long-polls a feed until its token reaches the final sequence,
// recording every change and checking that no transaction is split.
type poller struct {
	got   []string
	err   error
	batch int
}

func poll(f *Feed, r *rand.Rand, final *atomic.Uint64, lsnOf func(uint64) string) *poller {
	p := &poller{}
	seenTx := map[string]int{} // commit LSN → batch number
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(200+r.IntN(800))*time.Millisecond)
		b, err := f.Next(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			p.err = err
			return p
		}
		if len(b.Changes) > 0 {
			p.batch++
		}
		for _, c := range b.Changes {
			p.got = append(p.got, fmt.Sprintf("%d:%s", c.Seq, c.Op))
			_, pos, _ := cdc.ParseID(c.ID)
			if n, ok := seenTx[pos.LSN.Hex()]; ok && n != p.batch {
				p.err = fmt.Errorf("transaction %s split across batches %d and %d", pos.LSN.Hex(), n, p.batch)
				return p
			}
			seenTx[pos.LSN.Hex()] = p.batch
		}
		if fin := final.Load(); fin != 0 && b.Token.Seq >= fin {
			return p
		}
		if r.IntN(3) == 0 {
			time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
		}
	}
}

// runOracle registers n random feeds, runs the workload through the real
// sink while every feed long-polls, calls during(i) after each write, and
// checks each feed against the oracle computed from the whole stream.
func runOracle(t *testing.T, e *env, fs *Feeds, nFeeds, nTx int, during func(i int)) {
	r := rand.New(rand.NewPCG(1, 2))
	specs := make([]spec, nFeeds)
	feeds := make([]*Feed, nFeeds)
	for i := range specs {
		specs[i] = randomSpec(r)
		var err error
		feeds[i], err = fs.Register(specs[i].filter, Token{})
		require.NoError(t, err)
	}
	var final atomic.Uint64
	results := make([]*poller, nFeeds)
	var wg sync.WaitGroup
	for i := range feeds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = poll(feeds[i], rand.New(rand.NewPCG(uint64(i), 9)), &final, nil)
		}()
	}
	w := &workload{r: rand.New(rand.NewPCG(3, 4)), g: e.gen, live: map[int64]order{}}
	total := 0
	for i := 0; i < nTx; {
		var batch [][]cdc.Change
		for j := 0; j < 10 && i < nTx; j++ {
			tx := w.tx()
			total += len(tx)
			batch = append(batch, tx)
			i++
		}
		e.write(batch...)
		if during != nil {
			during(i)
		}
	}
	msgs := readStream(t, e.js)
	require.Len(t, msgs, total, "the stream holds every change once")
	final.Store(msgs[len(msgs)-1].seq)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		stuck := 0
		var sample []string
		for i, f := range feeds {
			if tok := f.Token(); tok.Seq < final.Load() {
				stuck++
				if len(sample) < 5 {
					var err error
					if results[i] != nil {
						err = results[i].err
					}
					sample = append(sample, fmt.Sprintf("feed %d at %d (%v)", i, tok.Seq, err))
				}
			}
		}
		t.Fatalf("%d feeds did not reach the end of the stream (%d): %v; %+v", stuck, final.Load(), sample, fs.Stats())
	}
	matched := 0
	for i, p := range results {
		require.NoError(t, p.err, "feed %d (%s)", i, specs[i].name)
		want := expected(msgs, specs[i].pred)
		matched += len(want)
		if !equalStrings(want, p.got) {
			t.Fatalf("feed %d (%s): got %d changes, want %d\n got: %s\nwant: %s", i, specs[i].name, len(p.got), len(want),
				strings.Join(head(p.got), " "), strings.Join(head(want), " "))
		}
	}
	t.Logf("%d feeds, %d changes, %d deliveries, %d serialisations", nFeeds, total, matched, fs.Stats().Serialisations)
	require.Positive(t, matched)
}

func head(s []string) []string {
	if len(s) > 30 {
		return s[:30]
	}
	return s
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestThousandsOfFeedsAgainstOracle: 2000 random feeds long-polling while
// the stream is written each get exactly the oracle's changes: none
// missing, none extra, none twice, commit order, whole transactions.
func TestThousandsOfFeedsAgainstOracle(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{})
	runOracle(t, e, fs, 2000, 1000, nil)
}

// TestOracleWithSmallWindow: feeds fall behind a small window and are
// served from the stream, under the same oracle; one feed that reads
// nothing until every change is written is behind it for sure.
func TestOracleWithSmallWindow(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{WindowTxns: 20, MaxBatch: 50})
	late, err := fs.Register(Filter{}, Token{})
	require.NoError(t, err)
	runOracle(t, e, fs, 100, 600, nil)
	msgs := readStream(t, e.js)
	var final atomic.Uint64
	final.Store(msgs[len(msgs)-1].seq)
	p := poll(late, rand.New(rand.NewPCG(7, 7)), &final, nil)
	require.NoError(t, p.err)
	require.Equal(t, expected(msgs, func(*order) bool { return true }), p.got, "the late feed")
	require.Positive(t, fs.Stats().CatchUps)
}

// TestNATSRestartUnderLoad: the server restarts (same store) while
// changes are written and feeds poll; no feed loses or repeats anything.
func TestNATSRestartUnderLoad(t *testing.T) {
	e := newEnv(t, nil)
	fs := e.feeds(Config{CheckInterval: 200 * time.Millisecond})
	runOracle(t, e, fs, 300, 600, func(i int) {
		if i != 300 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, e.srv.Shutdown(ctx))
		time.Sleep(300 * time.Millisecond) // let clients notice and feeds poll into the outage
		e.srv = natsembed.StartT(t, e.srv.Options())
	})
	require.Zero(t, fs.Stats().Recreates, "a restart is not a recreation")
}
