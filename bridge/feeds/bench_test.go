package feeds

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// bareFeeds is a Feeds without a stream, for benchmarks of the index and
// of registration.
func bareFeeds() *Feeds {
	fs := &Feeds{cfg: Config{}, idx: newIndex(), feeds: map[*Feed]struct{}{}, waiting: map[*Feed]struct{}{},
		projs: map[string]*projection{"": {id: 0}}, headCh: make(chan struct{}), streamID: "x"}
	fs.cfg.defaults()
	return fs
}

// benchFilter is feed i of n: 70% tenant and status, 20% one key, 10%
// tag membership, with key spaces growing with n so that a change matches
// about the same number of feeds whatever n.
func benchFilter(i, n int) Filter {
	k := int64(i % max(n/2, 1))
	switch i % 10 {
	case 0:
		return Filter{Tables: []string{"public.orders"}, Where: Contains("tags", "t"+strconv.FormatInt(k, 10)).Ptr()}
	case 1, 2:
		return Filter{Tables: []string{"public.orders"}, Where: Eq("id", k).Ptr()}
	default:
		return Filter{Tables: []string{"public.orders"}, Where: And(Eq("tenant", k), In("status", "open", "paid")).Ptr(),
			Columns: []string{"id", "status"}}
	}
}

// benchUpdates are count updates over random keys in the key spaces of
// benchFilter(_, n): tenant, id and tag drawn from n/2 values, status
// changing among four.
func benchUpdates(n, count int) []cdc.Change {
	g := newGen("b.src.e1")
	r := rand.New(rand.NewPCG(1, 1))
	space := max(n/2, 1)
	out := make([]cdc.Change, count)
	for i := range out {
		o := order{ID: int64(r.IntN(space)), Tenant: int64(r.IntN(space)), Status: statuses[r.IntN(2)],
			Tags: []string{"t" + strconv.Itoa(r.IntN(space))}, Amount: 10}
		o2 := o
		o2.Status = statuses[r.IntN(4)]
		out[i] = g.tx(upd(o, o2))[0]
	}
	return out
}

// benchChanges are benchUpdates decoded as the consumer decodes them.
func benchChanges(b *testing.B, n, count int) []*change {
	nm := newNames()
	out := make([]*change, count)
	for i, c := range benchUpdates(n, count) {
		out[i] = decodedWith(b, c, uint64(i+1), nm)
	}
	return out
}

// BenchmarkRoute is the routing cost per change (index lookup and the
// whole filter of each candidate, on the before and after images),
// excluding decoding and serialisation. Matches/op is the number of feeds
// a change reaches; it stays flat as feeds grow, and so should ns/op.
func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		for _, residual := range []int{0, 1000} {
			b.Run(fmt.Sprintf("feeds=%d/residual=%d", n, residual), func(b *testing.B) {
				fs := bareFeeds()
				for i := range n {
					if _, err := fs.Register(benchFilter(i, n), Token{}); err != nil {
						b.Fatal(err)
					}
				}
				for i := range residual {
					if _, err := fs.Register(Filter{Tables: []string{"public.orders"}, Where: Gt("amount", int64(1000+i)).Ptr()}, Token{}); err != nil {
						b.Fatal(err)
					}
				}
				cs := benchChanges(b, n, 4096)
				matches := 0
				var stamp uint64
				var scratch []*group
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime()
				for i := range b.N {
					c := cs[i%len(cs)]
					stamp++
					scratch = fs.idx.candidates(c, stamp, scratch[:0])
					for _, g := range scratch {
						if g.matches(c) {
							matches += len(g.feeds)
						}
					}
				}
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(matches)/float64(b.N), "matches/op")
			})
		}
	}
}

// BenchmarkRouteAfterDecode measures routing as the consumer does it, on
// changes decoded just before they are routed, so their rows are in cache
// as they are in production (BenchmarkRoute cycles through thousands of
// decoded changes, so it also pays cache misses on the change itself).
// Each round decodes 64 messages, then routes them with a clock around the
// routing alone: route-ns/op (ns/op includes decoding).
func BenchmarkRouteAfterDecode(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("feeds=%d", n), func(b *testing.B) {
			fs := bareFeeds()
			for i := range n {
				if _, err := fs.Register(benchFilter(i, n), Token{}); err != nil {
					b.Fatal(err)
				}
			}
			type msg struct {
				h    nats.Header
				data []byte
			}
			ups := benchUpdates(n, 4096)
			msgs := make([]msg, len(ups))
			for i, c := range ups {
				msgs[i] = msg{headersOf(c), c.Payload}
			}
			nm := newNames()
			const round = 64
			batch := make([]*change, round)
			var stamp uint64
			var scratch []*group
			matches := 0
			var routing time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i += round {
				k := min(round, b.N-i)
				for j := range k {
					m := msgs[(i+j)%len(msgs)]
					c, err := decode(uint64(i+j), m.h, m.data, nm)
					if err != nil {
						b.Fatal(err)
					}
					batch[j] = c
				}
				t0 := time.Now()
				for _, c := range batch[:k] {
					stamp++
					scratch = fs.idx.candidates(c, stamp, scratch[:0])
					for _, g := range scratch {
						if g.matches(c) {
							matches += len(g.feeds)
						}
					}
				}
				routing += time.Since(t0)
			}
			b.ReportMetric(float64(routing.Nanoseconds())/float64(b.N), "route-ns/op")
			b.ReportMetric(float64(matches)/float64(b.N), "matches/op")
		})
	}
}

// cpuTime is the process's user+system CPU time in ns: on a shared,
// loaded machine, cpu-ns/op is steadier than wall-clock ns/op.
func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkDecode is the cost of decoding one native-format message.
func BenchmarkDecode(b *testing.B) {
	g := newGen("b.src.e1")
	o := order{ID: 1, Tenant: 2, Status: "open", Tags: []string{"a", "b"}, Amount: 10, Note: strp("some note")}
	c := g.tx(upd(o, o))[0]
	h := headersOf(c)
	b.ReportAllocs()
	b.SetBytes(int64(len(c.Payload)))
	nm := newNames()
	cpu0 := cpuTime()
	for range b.N {
		if _, err := decode(1, h, c.Payload, nm); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkIdleFeedMemory reports the heap held per registered feed that
// is parked in a long poll (its index entries, filter and wake channel).
func BenchmarkIdleFeedMemory(b *testing.B) {
	const n = 100_000
	for range b.N {
		fs := bareFeeds()
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for i := range n {
			f, err := fs.Register(benchFilter(i, n), Token{})
			if err != nil {
				b.Fatal(err)
			}
			fs.parkLocked(f)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/n, "bytes/feed")
		runtime.KeepAlive(fs)
	}
}

// BenchmarkReceiptToResponse publishes 2000 changes/s for 5s into a real
// stream while 10000 feeds long-poll, each change matching about two
// feeds, and reports the latency from the consumer's receipt of a change
// to Next returning it (p50, p99, max). Run with -benchtime=1x.
func BenchmarkReceiptToResponse(b *testing.B) {
	for _, n := range []int{1000, 10_000} {
		b.Run(fmt.Sprintf("feeds=%d", n), func(b *testing.B) { benchReceipt(b, n) })
	}
}

func benchReceipt(b *testing.B, nFeeds int) {
	for range b.N {
		e := newEnv(b, nil)
		fs := e.feeds(Config{})
		const rate, seconds = 2000, 5
		feeds := make([]*Feed, nFeeds)
		for i := range feeds {
			var err error
			if feeds[i], err = fs.Register(Filter{Where: Eq("tenant", int64(i/2)).Ptr()}, Token{}); err != nil {
				b.Fatal(err)
			}
		}
		var mu sync.Mutex
		var lat []time.Duration
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for _, f := range feeds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					bt, _ := f.Next(ctx)
					now := time.Now()
					if len(bt.Changes) == 0 {
						continue
					}
					mu.Lock()
					for _, c := range bt.Changes {
						lat = append(lat, now.Sub(c.Received))
					}
					mu.Unlock()
				}
			}()
		}
		for fs.Stats().Waiting < nFeeds { // every feed parked in a long poll
			time.Sleep(10 * time.Millisecond)
		}
		// Publish raw bridge messages at the rate, 20 per 10ms tick.
		r := rand.New(rand.NewPCG(5, 5))
		tick := time.NewTicker(10 * time.Millisecond)
		sent := 0
		for sent < rate*seconds {
			<-tick.C
			var txs [][]cdc.Change
			for range rate / 100 {
				txs = append(txs, e.gen.tx(ins(order{ID: int64(sent), Tenant: int64(r.IntN(nFeeds / 2)), Status: "open"})))
				sent++
			}
			for _, tx := range txs {
				for _, c := range tx {
					m := nats.NewMsg(c.Subject)
					m.Data = c.Payload
					m.Header.Set(headerMsgID, c.ID())
					m.Header.Set(headerTxSize, "1")
					m.Header.Set(headerTable, "public.orders")
					m.Header.Set(headerOp, "insert")
					if _, err := e.js.PublishMsgAsync(m); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		tick.Stop()
		<-e.js.PublishAsyncComplete()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(lat)
			mu.Unlock()
			if n >= sent*2 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		slices.Sort(lat)
		if len(lat) == 0 {
			b.Fatal("no deliveries")
		}
		q := func(p float64) float64 { return float64(lat[int(float64(len(lat)-1)*p)].Microseconds()) / 1000 }
		b.ReportMetric(q(0.5), "p50-ms")
		b.ReportMetric(q(0.99), "p99-ms")
		b.ReportMetric(q(1), "max-ms")
		b.ReportMetric(float64(len(lat)), "deliveries")
	}
}
