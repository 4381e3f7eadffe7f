package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/internal/testport"
	_ "github.com/bridgecdc/bridge/plugins"
)

// env is one test's private Postgres and NATS.
type env struct {
	t      testing.TB
	pg     *pgtest.Server
	ns     *natsembed.Server
	nsOpts natsembed.Options
	dir    string
	// natsOpts are the options of the test's own NATS clients (messages,
	// waitStored): credentials and TLS when the test's server needs them.
	natsOpts []nats.Option
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, pgtest.Options{})
}

// newEnvMajor is newEnv on PostgreSQL major (0: the default, Debian's 15).
func newEnvMajor(t testing.TB, major int) *env {
	t.Helper()
	return newEnvWith(t, pgtest.Options{Major: major})
}

// eachMajor runs fn once per major of the version matrix
// (pgtest.Majors: $PG_MAJORS, default 15 to 18), each as a parallel
// subtest "pg<major>" with servers of its own. The core set runs through
// it: the exactly-once kill test, types, DDL mid-stream, TOAST, snapshots.
func eachMajor(t *testing.T, fn func(t *testing.T, major int)) {
	t.Helper()
	eachMajorOf(t, nil, false, fn)
}

// eachMajorOf is eachMajor for the majors among only (nil: all) that the
// matrix holds, for a feature of some majors; long admits each subtest as
// a long one (parallelLong).
func eachMajorOf(t *testing.T, only []int, long bool, fn func(t *testing.T, major int)) {
	t.Helper()
	for _, m := range pgtest.Majors() {
		if only != nil && !slices.Contains(only, m) {
			continue
		}
		t.Run(fmt.Sprint("pg", m), func(t *testing.T) {
			if long {
				defer parallelLong(t)()
			} else {
				defer parallel(t)()
			}
			fn(t, m)
		})
	}
}

// newEnvWith is newEnv with the Postgres cluster's options.
func newEnvWith(t testing.TB, po pgtest.Options) *env {
	t.Helper()
	e := &env{t: t, pg: pgtest.StartT(t, po), dir: t.TempDir()}
	e.nsOpts = natsembed.Options{Host: "127.0.0.1", Port: natsembed.Ports(t, 1)[0], StoreDir: filepath.Join(e.dir, "nats")}
	e.startNATS()
	t.Cleanup(func() {
		if e.ns != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = e.ns.Shutdown(ctx)
		}
	})
	return e
}

func (e *env) startNATS() {
	e.t.Helper()
	s, err := natsembed.Restart(e.nsOpts, 30*time.Second)
	require.NoError(e.t, err)
	e.ns = s
}

func (e *env) stopNATS() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(e.t, e.ns.Shutdown(ctx))
	e.ns = nil
}

func (e *env) natsURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", e.nsOpts.Port) }

// config writes a bridge.yaml for source "app" → sink "js" (stream CDC) and
// returns its path. extra is appended to the pgoutput config block.
func (e *env) config(name, extra string) string {
	e.t.Helper()
	y := fmt.Sprintf(`name: %s
data_dir: %s
nats:
  url: %s
sources:
  app:
    type: pgoutput
    config:
      dsn: %s
      slot: slot_%s
      publication: pub_%s
      message_prefixes: ["app"]
%s
checkpoint:
  interval: 200ms
http:
  listen: "127.0.0.1:0"
sinks:
  js:
    type: nats_jetstream
    config:
      stream: CDC_%s
      subjects: ["cdc.%s.>"]
      duplicate_window: 1s
routes:
  - sinks: [js]
    subject: "cdc.%s.{{.Schema}}.{{.Table}}"
`, name, filepath.Join(e.dir, "data"), e.natsURL(), e.pg.DSN(""), name, name, extra, name, name, name)
	p := filepath.Join(e.dir, name+".yaml")
	require.NoError(e.t, os.WriteFile(p, []byte(y), 0o644))
	return p
}

// configPlugin is config with source "app" of type plugin (pgoutput or
// wal2json).
func (e *env) configPlugin(plugin, name, extra string) string {
	e.t.Helper()
	p := e.config(name, extra)
	usePlugin(e.t, p, plugin)
	return p
}

// usePlugin makes the first source of the config file at path (one
// written by config or snapConfig, of type pgoutput) of type plugin.
func usePlugin(t testing.TB, path, plugin string) {
	t.Helper()
	if plugin == "pgoutput" {
		return
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b), "type: pgoutput", "a config with a pgoutput source")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(b), "type: pgoutput", "type: "+plugin, 1)), 0o644))
}

// running is an App running in this process.
type running struct {
	cancel context.CancelFunc
	done   chan error
	app    *app.App
}

func (e *env) start(cfgPath string) *running {
	e.t.Helper()
	return e.startWith(cfgPath)
}

// startWith is start with App options of the test's own (registries; the
// test's logger comes first and may be replaced).
func (e *env) startWith(cfgPath string, opts ...app.Option) *running {
	e.t.Helper()
	cfg, err := config.Load(cfgPath, app.ConfigOptions()...)
	require.NoError(e.t, err)
	a, err := app.New(cfg, append([]app.Option{app.WithLogger(testLogger(e.t))}, opts...)...)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(e.t, a.Start(ctx))
	r := &running{cancel: cancel, done: make(chan error, 1), app: a}
	go func() { r.done <- a.Run(ctx) }()
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

func (r *running) stop(t testing.TB) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("bridge run ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("bridge did not stop within 30s")
	}
}

// stopped waits up to within for the App to stop on its own and returns
// the error it stopped with; when it goes on running, the test fails with
// what it should have stopped on.
func (r *running) stopped(t testing.TB, within time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.cancel()
		r.cancel = nil
		return err
	case <-time.After(within):
		t.Fatalf("the bridge went on running %s", what)
		return nil
	}
}

// msg is one stored message.
type msg struct {
	Seq     uint64
	Subject string
	ID      string
	Pos     cdc.Pos
	Header  nats.Header
	Body    map[string]any
	Raw     []byte
}

// fencedAfter reports whether m was published fenced on prev, the message
// before it in the stream: a Write's first publish expects the stream's
// last sequence (Nats-Expected-Last-Sequence), each later one the message
// id published before it (Nats-Expected-Last-Msg-Id).
func fencedAfter(m, prev msg) bool {
	if els := m.Header.Get("Nats-Expected-Last-Sequence"); els != "" {
		return els == strconv.FormatUint(prev.Seq, 10)
	}
	lid := m.Header.Get("Nats-Expected-Last-Msg-Id")
	return lid != "" && lid == prev.Header.Get("Nats-Msg-Id")
}

// messages reads every message of stream.
func (e *env) messages(stream string) []msg {
	e.t.Helper()
	return e.readStream(stream, 0, withBody)
}

// messagesAfter reads the messages of stream after sequence seq.
func (e *env) messagesAfter(stream string, seq uint64) []msg {
	e.t.Helper()
	return e.readStream(stream, seq, withBody)
}

// rawMessages reads every message of stream without decoding payloads:
// Body is empty, Raw holds the payload. For checks that look at a few
// fields of many messages (eventKey), which decoding each whole payload
// into maps made a large part of the tests' CPU under -race.
func (e *env) rawMessages(stream string) []msg {
	e.t.Helper()
	return e.readStream(stream, 0, rawOnly)
}

// headers reads every message of stream without its payload: Body and
// Raw are empty, Header holds the server's Nats-Msg-Size besides the
// message's own. For checks of ids, positions and headers only, which
// then neither fetch nor decode the payloads.
func (e *env) headers(stream string) []msg {
	e.t.Helper()
	return e.readStream(stream, 0, headersOnly)
}

// readMode is how much of each message readStream keeps.
type readMode int

const (
	withBody    readMode = iota // Raw and the decoded Body
	rawOnly                     // Raw, Body nil
	headersOnly                 // neither: the server sends headers only
)

// openStream connects to the test's NATS server as the test's clients do
// and opens stream, within a minute's context; done closes the connection.
func (e *env) openStream(stream string) (ctx context.Context, s jetstream.Stream, done func()) {
	e.t.Helper()
	nc, err := nats.Connect(e.natsURL(), e.natsOpts...)
	require.NoError(e.t, err)
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	s, err = js.Stream(ctx, stream)
	if err != nil {
		cancel()
		nc.Close()
		require.NoError(e.t, err, "stream %s", stream)
	}
	return ctx, s, func() { cancel(); nc.Close() }
}

// readStream reads the messages of stream after sequence after (0: all)
// up to its last one at the time of the call.
func (e *env) readStream(stream string, after uint64, mode readMode) []msg {
	e.t.Helper()
	ctx, s, done := e.openStream(stream)
	defer done()
	info, err := s.Info(ctx)
	require.NoError(e.t, err)
	if info.State.Msgs == 0 || info.State.LastSeq <= after {
		return nil
	}
	cc := jetstream.OrderedConsumerConfig{HeadersOnly: mode == headersOnly}
	if after > 0 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	c, err := s.OrderedConsumer(ctx, cc)
	require.NoError(e.t, err)
	var out []msg
	// All of them: as many as the stream holds. From a sequence on: up to
	// the last one.
	more := func() bool {
		if after == 0 {
			return uint64(len(out)) < info.State.Msgs
		}
		return len(out) == 0 || out[len(out)-1].Seq < info.State.LastSeq
	}
	for more() {
		batch, err := c.FetchNoWait(1000)
		require.NoError(e.t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			require.NoError(e.t, err)
			id := m.Headers().Get("Nats-Msg-Id")
			_, pos, err := cdc.ParseID(id)
			require.NoError(e.t, err, "message %d", md.Sequence.Stream)
			var body map[string]any
			if len(m.Data()) > 0 && mode == withBody { // a dead letter may carry no payload
				body, err = decodeBody(m.Data())
				require.NoError(e.t, err, "message %d: %s", md.Sequence.Stream, m.Data())
			}
			var raw []byte
			if mode != headersOnly {
				raw = append([]byte(nil), m.Data()...)
			}
			out = append(out, msg{Seq: md.Sequence.Stream, Subject: m.Subject(), ID: id, Pos: pos, Header: m.Headers(), Body: body, Raw: raw})
		}
		require.NoError(e.t, batch.Error())
		if n == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return out
}

// lastMessage returns the last message in stream, read alone (the
// whole stream is not decoded for it).
func (e *env) lastMessage(stream string) msg {
	e.t.Helper()
	ctx, s, done := e.openStream(stream)
	defer done()
	last := s.CachedInfo().State.LastSeq
	require.NotZero(e.t, last, "stream %s is empty", stream)
	m, err := s.GetMsg(ctx, last)
	require.NoError(e.t, err, "stream %s seq %d", stream, last)
	id := m.Header.Get("Nats-Msg-Id")
	_, pos, err := cdc.ParseID(id)
	require.NoError(e.t, err, "stream %s seq %d", stream, last)
	var body map[string]any
	if len(m.Data) > 0 { // a dead letter may carry no payload
		body, err = decodeBody(m.Data)
		require.NoError(e.t, err, "stream %s seq %d: %s", stream, last, m.Data)
	}
	return msg{Seq: m.Sequence, Subject: m.Subject, ID: id, Pos: pos, Header: m.Header, Body: body, Raw: m.Data}
}

// waitBridgeGone waits until the NATS server holds no connection of a
// bridge process (their names start with "bridge"): after a kill, the
// server has then read everything the dead process sent. Only for tests
// that run one bridge process at a time.
func (e *env) waitBridgeGone() {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		cz, err := e.ns.NATS().Connz(&server.ConnzOptions{State: server.ConnOpen, Limit: 1024})
		require.NoError(e.t, err)
		for _, c := range cz.Conns {
			if strings.HasPrefix(c.Name, "bridge") {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "the NATS server still holds connections of a bridge process")
}

// waitCount waits until stream holds at least n messages and returns them.
func (e *env) waitCount(stream string, n int, within time.Duration) []msg {
	e.t.Helper()
	e.waitStored(stream, n, within)
	return e.messages(stream)
}

// waitStored waits until stream holds at least n messages. within bounds
// a wait without progress: each message stored gives it within again (up
// to 4 × within in all), so a bridge catching up slowly on a loaded
// machine (tests run in parallel) is waited for and a stuck one is not.
func (e *env) waitStored(stream string, n int, within time.Duration) {
	e.t.Helper()
	nc, err := nats.Connect(e.natsURL(), e.natsOpts...)
	require.NoError(e.t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(e.t, err)
	start := time.Now()
	deadline, end := start.Add(within), start.Add(4*within)
	var last uint64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := js.Stream(ctx, stream)
		if err == nil {
			var info *jetstream.StreamInfo
			info, err = s.Info(ctx)
			if err == nil {
				if info.State.Msgs > last {
					deadline = time.Now().Add(within)
					if deadline.After(end) {
						deadline = end
					}
				}
				last = info.State.Msgs
			}
		}
		cancel()
		if last >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("stream %s holds %d messages after %s (the last %s without progress, or 4 × that in all), want %d",
				stream, last, time.Since(start).Round(time.Second), within, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkOrdered asserts that ids are unique and positions strictly increase
// in stream order, per producer.
func checkOrdered(t testing.TB, ms []msg) {
	t.Helper()
	seen := map[string]uint64{}
	last := map[string]cdc.Pos{}
	for _, m := range ms {
		if prev, dup := seen[m.ID]; dup {
			t.Fatalf("message id %s stored twice (stream seq %d and %d); around them:\n%s\n%s", m.ID, prev, m.Seq,
				around(ms, prev), around(ms, m.Seq))
		}
		seen[m.ID] = m.Seq
		prod, pos, err := cdc.ParseID(m.ID)
		require.NoError(t, err)
		if l, ok := last[prod]; ok && !l.Less(pos) {
			t.Fatalf("stream seq %d: position %s:%d does not follow %s:%d", m.Seq, pos.LSN, pos.Seq, l.LSN, l.Seq)
		}
		last[prod] = pos
	}
}

// around lists the messages of ms within 6 stream sequences of seq (id,
// operation, table, schema version, fence), for a failure to explain
// itself.
func around(ms []msg, seq uint64) string {
	var b strings.Builder
	for _, m := range ms {
		if m.Seq+6 >= seq && m.Seq <= seq+6 {
			fmt.Fprintf(&b, "  seq %d %s op=%v table=%s version=%s expected_last_seq=%q expected_last_id=%q\n", m.Seq, m.ID, m.Body["op"],
				m.Header.Get("Bridge-Table"), m.Header.Get("Bridge-Schema-Version"),
				m.Header.Get("Nats-Expected-Last-Sequence"), m.Header.Get("Nats-Expected-Last-Msg-Id"))
		}
	}
	return b.String()
}

// testLogger logs through t.Log until the test ends.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// freePort returns a loopback port that no other test takes while this one
// runs (testport.Claim: below the kernel's ephemeral range, so neither a
// listener of another test nor the local end of an outgoing connection
// takes it between the check and its use, or while its server is down).
func freePort(t testing.TB) int {
	t.Helper()
	p, release, err := testport.Claim()
	require.NoError(t, err)
	t.Cleanup(release)
	return p
}

// bridgeBinary builds cmd/bridge once per test binary.
var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func bridgeBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bridge-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "bridge")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/bridge")
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

func sortedStrings(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// waitSlotActive waits until a walsender streams from slot.
func waitSlotActive(t testing.TB, e *env, slot string) {
	t.Helper()
	conn := e.pg.Conn(t, "")
	require.Eventually(t, func() bool {
		var n int
		_ = conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&n)
		return n == 1
	}, 60*time.Second, 50*time.Millisecond, "the bridge never started streaming from slot %s", slot)
}
