// Command feedstorm measures a reconnect storm of `bridge serve`.
//
// Many server-sent-event clients, each following one tenant of
// public.orders (a selective filter), wait while a million changes are
// streamed into the stream; then `bridge serve` restarts (SIGTERM, or
// SIGKILL with -kill) while changes keep coming, and every client
// reconnects with its Last-Event-ID as a browser's EventSource does. It
// reports the time until every client is up to date again, the messages
// the new process read from the stream for catch-ups against the changes
// written since the restart, and checks that every client received each
// of its changes exactly once, in order.
//
//	go run ./bench/cmd/feedstorm                      # 10,000 clients, 1,000,000 changes
//	go run ./bench/cmd/feedstorm -clients 1000 -changes 100000 -kill
//
// The server is this binary running `bridge serve` (the real command) as
// a child process; NATS (embedded) and the clients run in this process.
// The soft limit on open files is raised to the hard limit: the clients
// need one descriptor each, and so does the server, per process.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bench"
	"github.com/bridgecdc/bridge/bridge"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
	"github.com/bridgecdc/bridge/bridge/serve/ssetest"
	"github.com/bridgecdc/bridge/internal/natsembed"
	_ "github.com/bridgecdc/bridge/plugins" // bridge serve validates bridge.yaml's sources and sinks
)

type options struct {
	clients, changes, tenants int
	liveRate                  int
	keepAlive, quiet          time.Duration
	kill                      bool
	windowTxns                int
	dir, jsonOut              string
	within                    time.Duration
}

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-serve" { // the child: bridge serve -c <config>
		if p := os.Getenv("FEEDSTORM_CPUPROFILE"); p != "" {
			profile(p) // research: where the restarted server spends its time
		}
		os.Exit(bridge.Execute([]string{"serve", "-c", os.Args[2]}, os.Stdout, os.Stderr))
	}
	var o options
	flag.IntVar(&o.clients, "clients", 10_000, "SSE clients, each following one tenant")
	flag.IntVar(&o.changes, "changes", 1_000_000, "changes streamed while the clients wait, before the restart")
	flag.IntVar(&o.tenants, "tenants", 1_000_000, "tenants the changes are spread over (clients follow every tenants/clients-th one)")
	flag.IntVar(&o.liveRate, "live-rate", 2000, "changes per second written from the restart until every client is back (0: none)")
	flag.DurationVar(&o.keepAlive, "keep-alive", 15*time.Second, "serve.keep_alive")
	flag.DurationVar(&o.quiet, "quiet", 0, "wait after streaming before the restart")
	flag.BoolVar(&o.kill, "kill", false, "restart with SIGKILL instead of SIGTERM")
	flag.IntVar(&o.windowTxns, "window-txns", 0, "serve.window_txns (0: the default)")
	flag.StringVar(&o.dir, "dir", "", "work directory (default: a new temporary one, removed at the end)")
	flag.StringVar(&o.jsonOut, "json", "", "also write the results as JSON to this file")
	flag.DurationVar(&o.within, "within", 2*time.Minute, "give up waiting for the clients after this long")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "feedstorm:", err)
		os.Exit(1)
	}
}

// Result is what a run measured.
type Result struct {
	Clients, Changes         int
	Load1                    float64 // 1-minute load average at the start
	StreamSeconds            float64 // writing the changes
	ServerCaughtUpSeconds    float64 // until the server's position reached the last one
	Kill                     bool
	DownSeconds              float64 // from the signal to the new process answering /readyz
	AllBackSeconds           float64 // from the signal until every client was up to date again
	P50BackSeconds           float64
	P99BackSeconds           float64
	Back                     int    // clients up to date again when the wait ended
	CatchUpMessages          int64  // read from the stream by the new process for catch-ups
	CatchUps                 int64  // temporary consumers the new process created
	Replays, Backfills       int64  // shared passes over history; those added to the window
	ChangesSinceRestart      uint64 // stream messages written from the signal until every client was back
	BehindMax, BehindMedian  uint64 // messages between a client's Last-Event-ID and the stream's end at the signal
	Deliveries, Expected     int
	Missing, Duplicates      int
	ServerCPUSeconds         float64 // of the new process until every client was back
	Refetches, ErrorEvents   int
	OldServerSeqAtRestart    uint64
	StreamLastSeqAtRestart   uint64
	NewServerWindowFrom      float64
	NewServerWindowTxns      float64
	ClientsWithoutAnyMatches int
}

func run(o options) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if need := uint64(o.clients) + 1000; lim.Cur < need {
		return fmt.Errorf("open files limit %d < %d needed by %d clients (ulimit -n)", lim.Cur, need, o.clients)
	}
	res := Result{Clients: o.clients, Changes: o.changes, Kill: o.kill, Load1: bench.LoadAvg()}
	fmt.Printf("load average %.2f, open files limit %d\n", res.Load1, lim.Cur)

	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "feedstorm-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	ns, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: filepath.Join(dir, "nats")})
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ns.Shutdown(ctx)
	}()
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	var pubErr atomic.Value
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192), jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
		pubErr.CompareAndSwap(nil, fmt.Errorf("publishing %s: %w", m.Header.Get(jetstream.MsgIDHeader), err))
	}))
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}, Storage: jetstream.FileStorage, Duplicates: time.Minute}); err != nil {
		return err
	}

	port, err := bench.FreePort()
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfg, err := writeConfig(dir, ns.URL(), addr, o)
	if err != nil {
		return err
	}
	srv, err := startServer(cfg, filepath.Join(dir, "serve-1.log"), addr)
	if err != nil {
		return err
	}
	defer func() { srv.stop(syscall.SIGKILL) }()

	// The clients: client i follows tenant i*step, from now.
	step := max(o.tenants/o.clients, 1)
	crowd := &ssetest.Crowd{Addr: addr}
	for i := range o.clients {
		q := url.Values{"sse": {"1"}, "tables": {"public.orders"}, "token": {"now"},
			"where": {fmt.Sprintf(`{"eq":["tenant",%d]}`, i*step)}}
		crowd.Clients = append(crowd.Clients, &ssetest.Client{Target: "/v1/feed?" + q.Encode()})
	}
	cctx, stopClients := context.WithCancel(ctx)
	var crowdDone sync.WaitGroup
	crowdDone.Add(1)
	go func() { defer crowdDone.Done(); crowd.Run(cctx) }()
	defer func() { stopClients(); crowdDone.Wait() }()
	start := time.Now()
	if err := waitAll(crowd, start.Add(-time.Second), 3*time.Minute, nil); err != nil {
		return fmt.Errorf("connecting the clients: %w", err)
	}
	fmt.Printf("%d clients connected and up to date in %.1fs\n", o.clients, time.Since(start).Seconds())

	// Phase 1: the changes, as fast as JetStream takes them.
	w := &writer{js: js, r: rand.New(rand.NewPCG(1, 2)), tenants: o.tenants, step: step, clients: o.clients,
		expected: make([][]string, o.clients)}
	t1 := time.Now()
	if err := w.write(o.changes); err != nil {
		return err
	}
	res.StreamSeconds = time.Since(t1).Seconds()
	if err, _ := pubErr.Load().(error); err != nil {
		return err // a change lost: the oracle would be wrong
	}
	last, err := lastSeq(js)
	if err != nil {
		return err
	}
	fmt.Printf("%d changes written in %.1fs (%.0f/s); stream at %d\n", o.changes, res.StreamSeconds, float64(o.changes)/res.StreamSeconds, last)
	for {
		if p, err := position(addr); err == nil && p >= last {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.ServerCaughtUpSeconds = time.Since(t1).Seconds()
	fmt.Printf("server at the stream's end after %.1fs\n", res.ServerCaughtUpSeconds)
	if o.quiet > 0 {
		time.Sleep(o.quiet)
	}

	// Phase 2: restart while changes keep coming.
	res.OldServerSeqAtRestart, _ = position(addr)
	res.StreamLastSeqAtRestart, _ = lastSeq(js)
	liveCtx, stopLive := context.WithCancel(ctx)
	defer stopLive()
	var liveDone sync.WaitGroup
	liveDone.Add(1)
	var liveErr error
	go func() { defer liveDone.Done(); liveErr = w.live(liveCtx, o.liveRate) }()
	sig := syscall.SIGTERM
	if o.kill {
		sig = syscall.SIGKILL
	}
	t0 := time.Now()
	srv.stop(sig)
	srv, err = startServer(cfg, filepath.Join(dir, "serve-2.log"), addr)
	if err != nil {
		return err
	}
	res.DownSeconds = time.Since(t0).Seconds()
	cpu0, _ := bench.ReadCPU(srv.pid())
	waitErr := waitAll(crowd, t0, o.within, func(back int) {
		fmt.Printf("  %.1fs: %d/%d clients up to date\n", time.Since(t0).Seconds(), back, o.clients)
	})
	lastAtBack, _ := lastSeq(js)
	cpu1, _ := bench.ReadCPU(srv.pid())
	res.ServerCPUSeconds = (cpu1.Self - cpu0.Self).Seconds()
	res.ChangesSinceRestart = lastAtBack - res.StreamLastSeqAtRestart
	times := crowd.UpToDateSince(t0)
	var back []float64
	for _, t := range times {
		if !t.IsZero() {
			back = append(back, t.Sub(t0).Seconds())
		}
	}
	slices.Sort(back)
	res.Back = len(back)
	if len(back) > 0 {
		res.AllBackSeconds = back[len(back)-1]
		res.P50BackSeconds = back[len(back)/2]
		res.P99BackSeconds = back[len(back)*99/100]
	}
	var behind []uint64
	for _, c := range crowd.Clients {
		for _, op := range c.State().Opens {
			if op.At.After(t0) {
				if _, s, ok := strings.Cut(op.LastEventID, "."); ok {
					if n, err := strconv.ParseUint(s, 10, 64); err == nil && n <= res.StreamLastSeqAtRestart {
						behind = append(behind, res.StreamLastSeqAtRestart-n)
					}
				}
				break
			}
		}
	}
	slices.Sort(behind)
	if len(behind) > 0 {
		res.BehindMax, res.BehindMedian = behind[len(behind)-1], behind[len(behind)/2]
	}
	m, err := scrape(addr)
	if err != nil {
		return err
	}
	res.CatchUpMessages = int64(m["bridge_feeds_catch_up_messages_total"])
	res.CatchUps = int64(m["bridge_feeds_catch_ups_total"])
	res.Replays, res.Backfills = int64(m["bridge_feeds_replays_total"]), int64(m["bridge_feeds_backfills_total"])
	res.NewServerWindowFrom, res.NewServerWindowTxns = m["bridge_feeds_window_start_sequence"], m["bridge_feeds_window_transactions"]
	stopLive()
	liveDone.Wait()
	if liveErr != nil {
		return liveErr
	}
	if err, _ := pubErr.Load().(error); err != nil {
		return err
	}

	// Every client gets each of its changes once, in order.
	final, _ := lastSeq(js)
	deadline := time.Now().Add(o.within)
	for {
		if p, err := position(addr); err == nil && p >= final {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for time.Now().Before(deadline) && !w.allDelivered(crowd) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // anything delivered twice arrives too
	w.verify(crowd, &res)
	fmt.Println()
	fmt.Printf("restart (%s) with %d clients after %d changes; %d written since the signal\n", sig, o.clients, o.changes, res.ChangesSinceRestart)
	fmt.Printf("  new process ready after            %.2fs\n", res.DownSeconds)
	fmt.Printf("  every client up to date after       %.2fs (p50 %.2fs, p99 %.2fs; %d/%d back)\n", res.AllBackSeconds, res.P50BackSeconds, res.P99BackSeconds, res.Back, o.clients)
	fmt.Printf("  clients' tokens behind the end      median %d, max %d messages\n", res.BehindMedian, res.BehindMax)
	fmt.Printf("  messages read for catch-ups         %d (%d reads; %d replays, %d added to the window)\n", res.CatchUpMessages, res.CatchUps, res.Replays, res.Backfills)
	fmt.Printf("  server CPU until all back           %.2fs\n", res.ServerCPUSeconds)
	fmt.Printf("  deliveries %d of %d expected; missing %d, duplicates %d; must-refetch %d, error events %d\n",
		res.Deliveries, res.Expected, res.Missing, res.Duplicates, res.Refetches, res.ErrorEvents)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	switch {
	case waitErr != nil:
		return waitErr
	case res.Missing > 0 || res.Duplicates > 0:
		return fmt.Errorf("%d changes missing, %d delivered twice", res.Missing, res.Duplicates)
	}
	return nil
}

// profile writes a CPU profile of the first FEEDSTORM_PROFILE_SECONDS
// (default 15) of the process to path.<pid> (the benchmark starts two
// servers; the second is the one that serves the storm).
func profile(path string) {
	f, err := os.Create(fmt.Sprintf("%s.%d", path, os.Getpid()))
	if err != nil {
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return
	}
	secs, err := strconv.Atoi(os.Getenv("FEEDSTORM_PROFILE_SECONDS"))
	if err != nil || secs <= 0 {
		secs = 15
	}
	time.AfterFunc(time.Duration(secs)*time.Second, func() { pprof.StopCPUProfile(); f.Close() })
}

func writeConfig(dir, natsURL, listen string, o options) (string, error) {
	window := ""
	if o.windowTxns > 0 {
		window = fmt.Sprintf("\n  window_txns: %d", o.windowTxns)
	}
	y := fmt.Sprintf(`name: storm
data_dir: %s
nats:
  url: %s
sources:
  app:
    type: pgoutput
    config:
      dsn: "postgres://bench@127.0.0.1:1/bench"
      slot: storm
      publication: storm
sinks:
  js:
    type: nats_jetstream
    config:
      stream: CDC
      subjects: ["cdc.>"]
routes:
  - sinks: [js]
    subject: "cdc.{{.Schema}}.{{.Table}}"
http:
  listen: "127.0.0.1:0"
serve:
  listen: %s
  stream: CDC
  keep_alive: %s
  max_conns: %d
  max_per_client: %d%s
`, filepath.Join(dir, "data"), natsURL, listen, o.keepAlive, o.clients+1000, o.clients+1000, window)
	p := filepath.Join(dir, "bridge.yaml")
	return p, os.WriteFile(p, []byte(y), 0o644)
}

// server is the child process running bridge serve.
type server struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startServer(cfg, logPath, addr string) (*server, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-serve", cfg)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	s := &server{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(s.done) }()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("bridge serve exited: %s", b)
		default:
		}
		if r, err := http.Get("http://" + addr + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.stop(syscall.SIGKILL)
	return nil, errors.New("bridge serve not ready within 2 minutes")
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// stop signals the process and waits for it to exit (SIGKILL after 30s).
func (s *server) stop(sig syscall.Signal) {
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// waitAll waits until every client of cr has been up to date on a stream
// opened after since, reporting progress every second.
func waitAll(cr *ssetest.Crowd, since time.Time, within time.Duration, progress func(back int)) error {
	deadline := time.Now().Add(within)
	next := time.Now().Add(time.Second)
	for {
		back := 0
		for _, t := range cr.UpToDateSince(since) {
			if !t.IsZero() {
				back++
			}
		}
		if back == len(cr.Clients) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d clients up to date after %s", back, len(cr.Clients), within)
		}
		if progress != nil && time.Now().After(next) {
			progress(back)
			next = next.Add(time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writer publishes bridge changes (headers of the nats_jetstream sink,
// payloads in the native format) of one producer, one insert per
// transaction, and remembers which client each should reach.
type writer struct {
	js       jetstream.JetStream
	r        *rand.Rand
	tenants  int
	step     int
	clients  int
	lsn      cdc.LSN
	id       int64
	mu       sync.Mutex
	expected [][]string // per client, the ids of its changes in order
}

var orders = &cdc.Relation{ID: 1, Schema: "public", Table: "orders", ReplicaIdentity: 'd', Columns: []cdc.Column{
	{Name: "id", Type: "int8", Key: true}, {Name: "tenant", Type: "int8"}, {Name: "status", Type: "text"}, {Name: "note", Type: "text"},
}}

func (w *writer) publish() error {
	w.lsn += 0x100
	w.id++
	tenant := w.r.IntN(w.tenants)
	c := cdc.Change{Producer: "storm.app.e1", Source: "app", CommitLSN: w.lsn, LSN: w.lsn - 0x50, TxSize: 1, Xid: uint32(w.id),
		CommitTime: time.Unix(1700000000, 0).UTC(), Schema: "public", Table: "orders", Op: cdc.OpInsert, Rel: orders,
		After: []any{w.id, int64(tenant), "open", "a note of some thirty bytes...."}}
	m := nats.NewMsg("cdc.public.orders")
	m.Data = format.AppendNative(nil, &c)
	m.Header.Set(jetstream.MsgIDHeader, c.ID())
	// The headers the nats_jetstream sink sets (docs/consumers.md#headers).
	m.Header.Set("Bridge-Tx-Size", "1")
	m.Header.Set("Bridge-Table", "public.orders")
	m.Header.Set("Bridge-Op", "insert")
	if tenant%w.step == 0 && tenant/w.step < w.clients {
		w.mu.Lock()
		w.expected[tenant/w.step] = append(w.expected[tenant/w.step], c.ID())
		w.mu.Unlock()
	}
	for {
		_, err := w.js.PublishMsgAsync(m)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return err
		}
		select { // JetStream is behind: let it take what is in flight
		case <-w.js.PublishAsyncComplete():
		case <-time.After(time.Second):
		}
	}
}

func (w *writer) write(n int) error {
	for range n {
		if err := w.publish(); err != nil {
			return err
		}
	}
	select {
	case <-w.js.PublishAsyncComplete():
		return nil
	case <-time.After(time.Minute):
		return errors.New("publishing: acks not received within a minute")
	}
}

// live writes rate changes per second until ctx ends.
func (w *writer) live(ctx context.Context, rate int) error {
	if rate <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	begin, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return w.write(0)
		case now := <-t.C:
			for due := int(now.Sub(begin).Seconds() * float64(rate)); sent < due; sent++ {
				if err := w.publish(); err != nil {
					return err
				}
			}
		}
	}
}

func (w *writer) allDelivered(cr *ssetest.Crowd) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range cr.Clients {
		if len(c.State().Changes) < len(w.expected[i]) {
			return false
		}
	}
	return true
}

func (w *writer) verify(cr *ssetest.Crowd, res *Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range cr.Clients {
		st := c.State()
		want := w.expected[i]
		if len(want) == 0 {
			res.ClientsWithoutAnyMatches++
		}
		res.Expected += len(want)
		res.Deliveries += len(st.Changes)
		res.Refetches += st.Refetches
		res.ErrorEvents += len(st.ErrorEvents)
		seen := map[string]int{}
		for _, ch := range st.Changes {
			seen[ch.ID]++
		}
		for _, id := range want {
			if seen[id] == 0 {
				res.Missing++
			}
		}
		for _, n := range seen {
			if n > 1 {
				res.Duplicates += n - 1
			}
		}
		got := make([]string, len(st.Changes))
		for j, ch := range st.Changes {
			got[j] = ch.ID
		}
		if res.Missing == 0 && res.Duplicates == 0 && !slices.Equal(got, want) {
			res.Missing++ // out of order or an extra change: counted as a miss
		}
	}
}

func lastSeq(js jetstream.JetStream) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "CDC")
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// position is the server's /v1/position as a sequence.
func position(addr string) (uint64, error) {
	r, err := http.Get("http://" + addr + "/v1/position")
	if err != nil {
		return 0, err
	}
	defer r.Body.Close()
	var body struct{ Token string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return 0, err
	}
	_, s, _ := strings.Cut(body.Token, ".")
	return strconv.ParseUint(s, 10, 64)
}

// scrape reads the unlabelled samples of the server's /metrics.
func scrape(addr string) (map[string]float64, error) {
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, v, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	return out, sc.Err()
}
