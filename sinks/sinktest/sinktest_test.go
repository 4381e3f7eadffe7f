package sinktest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mem is an in-memory destination that can be broken.
type mem struct {
	mu     sync.Mutex
	broken bool
	dedupe bool
	seen   map[string]bool
	msgs   []sinktest.Received

	// mirror makes it keep the latest change per row (mirrorKey) instead
	// of every message: a key-value mirror, which with dedupe keeps a
	// row's change unless it holds a later one of the same producer. bug
	// plants a mirror's flaw: "wrongkey" (rows filed by table only),
	// "nodelete" (deletes ignored).
	mirror bool
	bug    string
	rows   map[string]sinktest.Received
	pos    map[string]cdc.Pos
}

// mirrorKey is the key a mirror files c's row under: schema, table and
// the first column (the key of the suite's tables).
func mirrorKey(c *cdc.Change) (string, bool) {
	if c.Op == cdc.OpMessage {
		return "", false
	}
	row := c.After
	if row == nil {
		row = c.Before
	}
	return fmt.Sprintf("%s.%s.%v", c.Schema, c.Table, row[0]), true
}

// putRow is put for a mirror; m.mu is held.
func (m *mem) putRow(c *cdc.Change) {
	k, ok := mirrorKey(c)
	if !ok {
		return
	}
	if m.bug == "wrongkey" {
		k = c.Schema + "." + c.Table
	}
	if m.rows == nil {
		m.rows, m.pos = map[string]sinktest.Received{}, map[string]cdc.Pos{}
	}
	if prev, ok := m.rows[k]; ok && m.dedupe && strings.HasPrefix(prev.ID, c.Producer+":") && !m.pos[k].Less(c.Pos()) {
		return // holds this change or a later one
	}
	if c.Op == cdc.OpDelete && m.bug == "nodelete" {
		return
	}
	m.rows[k] = sinktest.Received{ID: c.ID(), Key: k, Payload: c.Payload, Headers: c.Headers, Deleted: c.Op == cdc.OpDelete}
	m.pos[k] = c.Pos()
}

var errBroken = errors.New("mem: broken")

func (m *mem) put(c *cdc.Change) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.broken {
		return errBroken
	}
	if m.mirror {
		m.putRow(c)
		return nil
	}
	if m.dedupe && m.seen[c.ID()] {
		return nil
	}
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	m.seen[c.ID()] = true
	m.msgs = append(m.msgs, sinktest.Received{ID: c.ID(), Subject: c.Subject, Payload: c.Payload, Headers: c.Headers})
	return nil
}

func (m *mem) isBroken() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.broken
}

func (m *mem) setBroken(b bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.broken = b
}

func (m *mem) read() []sinktest.Received {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mirror {
		out := make([]sinktest.Received, 0, len(m.rows))
		for _, r := range m.rows {
			out = append(out, r)
		}
		return out
	}
	return append([]sinktest.Received(nil), m.msgs...)
}

// memConfig is the fake sink's config; Bug plants a contract violation.
type memConfig struct {
	Bug   string        `koanf:"bug"`
	Delay time.Duration `koanf:"delay"` // per change
}

// memSink writes to a mem, honestly unless told otherwise.
type memSink struct {
	m   *mem
	cfg memConfig

	mu        sync.Mutex
	connected bool
	closed    bool
	writes    int
}

func register(m *mem) *sinks.Registry {
	reg := sinks.NewRegistry()
	_ = reg.Register("mem", sinks.Plugin{
		Config: memConfig{},
		Doc:    "in memory",
		New: func(decode config.Decoder, _ sinks.Env) (sinks.Sink, error) {
			var cfg memConfig
			if err := decode(&cfg); err != nil && cfg.Bug != "lenient" {
				return nil, err
			}
			return &memSink{m: m, cfg: cfg}, nil
		},
	})
	return reg
}

func (s *memSink) Connect(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return sinks.Permanent(errors.New("closed"))
	}
	if s.m.isBroken() {
		return sinks.ErrNotConnected
	}
	if s.cfg.Bug == "leak" && !s.connected {
		go func() { select {} }()
	}
	s.connected = true
	return nil
}

func (s *memSink) Write(ctx context.Context, batch []cdc.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.closed && s.cfg.Bug != "write_after_close" {
		return sinks.Permanent(errors.New("closed"))
	}
	if !s.connected {
		return sinks.ErrNotConnected
	}
	var be sinks.BatchError
	for i := range batch {
		c := batch[i]
		switch {
		case s.cfg.Bug == "drop" && i == len(batch)/2:
			continue
		case s.cfg.Bug == "swap" && i+1 < len(batch) && i%2 == 0:
			c = batch[i+1]
		case s.cfg.Bug == "swap" && i%2 == 1:
			c = batch[i-1]
		case s.cfg.Bug == "duplicate" && s.writes > 1: // stored again, behind the destination's back
			s.m.mu.Lock()
			s.m.msgs = append(s.m.msgs, sinktest.Received{ID: c.ID(), Payload: c.Payload})
			s.m.mu.Unlock()
		}
		time.Sleep(s.cfg.Delay)
		if err := s.m.put(&c); err != nil {
			s.connected = false
			if s.cfg.Bug == "permanent" {
				return sinks.Permanent(err)
			}
			if s.cfg.Bug == "lie" {
				be.Fail(len(batch)-1, err) // claims the rest arrived
				return be.Err()
			}
			for j := i; j < len(batch); j++ {
				be.Fail(j, fmt.Errorf("%w: %w", sinks.ErrNotConnected, err))
			}
			return be.Err()
		}
	}
	return nil
}

func (s *memSink) Close(ctx context.Context) error {
	if s.cfg.Bug == "slow_close" {
		time.Sleep(time.Second)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func harness(m *mem, yaml string) sinktest.Harness {
	h := sinktest.Harness{
		Type:     "mem",
		Registry: register(m),
		YAML:     yaml,
		Read:     func(*testing.T) []sinktest.Received { return m.read() },
		Break:    func(*testing.T) { m.setBroken(true) },
		Heal:     func(*testing.T) { m.setBroken(false) },
		Dedupes:  m.dedupe,
	}
	if m.mirror {
		h.Mirror = mirrorKey
	}
	return h
}

func TestRun(t *testing.T) {
	t.Run("at least once", func(t *testing.T) {
		sinktest.Run(t, harness(&mem{}, "delay: 10us"))
	})
	t.Run("dedupes", func(t *testing.T) {
		sinktest.Run(t, harness(&mem{dedupe: true}, "delay: 10us"))
	})
	t.Run("mirror", func(t *testing.T) {
		sinktest.Run(t, harness(&mem{mirror: true, dedupe: true}, "delay: 10us"))
	})
	t.Run("mirror without dedupe", func(t *testing.T) {
		sinktest.Run(t, harness(&mem{mirror: true}, "delay: 10us"))
	})
	t.Run("without break", func(t *testing.T) {
		h := harness(&mem{}, "")
		h.Break, h.Heal = nil, nil
		sinktest.Run(t, h)
	})
}

// TestBuggy runs the suite against a sink with the bug named by
// $SINKTEST_BUG; TestRunCatches runs it in a subprocess and expects it to fail.
func TestBuggy(t *testing.T) {
	bug := os.Getenv("SINKTEST_BUG")
	if bug == "" {
		t.Skip("run by TestRunCatches")
	}
	m := &mem{dedupe: os.Getenv("SINKTEST_DEDUPE") != "", mirror: os.Getenv("SINKTEST_MIRROR") != "", bug: bug}
	h := harness(m, "bug: "+bug+"\ndelay: 10us")
	h.Dedupes = os.Getenv("SINKTEST_CLAIM_DEDUPE") != ""
	h.Wait = 500 * time.Millisecond
	sinktest.Run(t, h)
}

func TestRunCatches(t *testing.T) {
	for _, tc := range []struct {
		bug, env, failing, msg string
	}{
		{"drop", "", "ordered", "did not arrive"},
		{"swap", "", "ordered", "out of order"},
		{"lie", "", "partial_failure", "did not arrive"},
		{"leak", "", "connect_close", "found unexpected goroutines"},
		{"slow_close", "", "close_deadline", "Close took"},
		{"lenient", "", "config", "an unknown key must be an error"},
		{"write_after_close", "", "connect_close", "a Write after Close"},
		{"permanent", "", "partial_failure", "not a permanent failure"},
		{"duplicate", "SINKTEST_CLAIM_DEDUPE=1", "replay", "arrived again"},
		// A mirror: a replayed change must not win over a later one.
		{"unguarded", "SINKTEST_MIRROR=1 SINKTEST_CLAIM_DEDUPE=1", "replay", "the last change written to it"},
		{"wrongkey", "SINKTEST_MIRROR=1 SINKTEST_DEDUPE=1", "ordered", "holds nothing of this case"},
		{"nodelete", "SINKTEST_MIRROR=1 SINKTEST_DEDUPE=1", "ordered", "the last change written to it"},
		{"drop", "SINKTEST_MIRROR=1 SINKTEST_DEDUPE=1", "ordered", "the last change written to it"},
		{"lie", "SINKTEST_MIRROR=1 SINKTEST_DEDUPE=1", "partial_failure", "or a later change of it"},
	} {
		t.Run(tc.bug, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestBuggy$/^"+tc.failing+"$", "-test.v")
			cmd.Env = append(os.Environ(), "SINKTEST_BUG="+tc.bug)
			cmd.Env = append(cmd.Env, strings.Fields(tc.env)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "the suite passed a sink with bug %q:\n%s", tc.bug, out)
			require.Contains(t, string(out), "--- FAIL: TestBuggy/"+tc.failing+" ", "%s", out)
			require.Contains(t, string(out), tc.msg, "%s", out)
		})
	}
}

func TestChanges(t *testing.T) {
	a := sinktest.Changes(40, "shop.orders_src.e1")
	require.Len(t, a, 40)
	require.Equal(t, a, sinktest.Changes(40, "shop.orders_src.e1"), "deterministic: a replay")
	ids := map[string]bool{}
	ops := map[cdc.Op]bool{}
	var last cdc.Pos
	for i := range a {
		c := &a[i]
		require.False(t, ids[c.ID()], "duplicate id %s", c.ID())
		ids[c.ID()] = true
		ops[c.Op] = true
		if i > 0 {
			require.True(t, last.Less(c.Pos()), "positions increase")
		}
		last = c.Pos()
		require.Less(t, c.Seq, c.TxSize)
		if c.Seq+1 < c.TxSize {
			require.Equal(t, c.CommitLSN, a[i+1].CommitLSN, "transactions are whole")
		}
		require.Equal(t, "orders_src", c.Source)
		require.True(t, strings.HasPrefix(c.Subject, "cdc.orders_src."), c.Subject)
		require.NotEmpty(t, c.Headers["traceparent"])
		var v map[string]any
		require.NoError(t, json.Unmarshal(c.Payload, &v), "payload is JSON")
		require.Equal(t, c.ID(), v["id"])
	}
	for _, op := range []cdc.Op{cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpMessage} {
		require.True(t, ops[op], "no %s", op)
	}
	require.Len(t, sinktest.Changes(3, "p.s.e"), 3, "the last transaction is cut short")
	require.Equal(t, uint32(2), sinktest.Changes(3, "p.s.e")[2].TxSize)
}
