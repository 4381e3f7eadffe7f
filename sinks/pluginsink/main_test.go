package pluginsink_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bridgecdc/bridge/examples/plugins/exampleplugins"
	"github.com/bridgecdc/bridge/examples/plugins/go-sink/filesink"
	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
)

// modeEnv makes this test binary a plugin: TestMain serves the mode it
// names instead of running the tests, so the tests start it as their
// plugin executable without building one.
const modeEnv = "PLUGINSINK_TEST_MODE"

func TestMain(m *testing.M) {
	switch os.Getenv(modeEnv) {
	case "":
		code := m.Run()
		exampleplugins.Cleanup()
		os.Exit(code)
	case "filesink":
		s := filesink.New()
		pluginv1.Serve(s, s)
	case "crash": // filesink that exits in the middle of a Write (see crashing)
		n, _ := strconv.Atoi(os.Getenv("PLUGINSINK_CRASH_AFTER"))
		s := &crashing{Sink: filesink.New(), after: int64(n)}
		pluginv1.Serve(s, s)
	case "slow": // filesink whose Write is slow once (see slow)
		n, _ := strconv.Atoi(os.Getenv("PLUGINSINK_SLOW_AFTER"))
		d, _ := time.ParseDuration(os.Getenv("PLUGINSINK_SLOW_DELAY"))
		s := &slow{Sink: filesink.New(), after: n, delay: d, late: os.Getenv("PLUGINSINK_SLOW_LATE") != ""}
		pluginv1.Serve(s, s)
	case "env": // filesink that first writes its environment to PLUGINSINK_ENV_OUT
		if err := os.WriteFile(os.Getenv("PLUGINSINK_ENV_OUT"), []byte(strings.Join(os.Environ(), "\n")), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		s := filesink.New()
		pluginv1.Serve(s, s)
	case "version99":
		s := filesink.New()
		pluginv1.ServeVersion(99, s, s)
	case "garbage": // prints something else than a handshake
		fmt.Println("hello, I am not a plugin")
		time.Sleep(time.Second)
	default:
		fmt.Fprintln(os.Stderr, "unknown", modeEnv)
		os.Exit(2)
	}
	os.Exit(0)
}

// crashing is a filesink that, once it has written after changes, writes
// only the first half of the next batch and exits with status 3, as a
// plugin that crashes mid-write. PLUGINSINK_CRASH_MARK names a directory
// where it leaves a file per crash, so tests can count the crashes.
type crashing struct {
	*filesink.Sink
	after   int64
	written atomic.Int64
}

func (c *crashing) Write(ctx context.Context, req *pluginv1.WriteRequest) (*pluginv1.WriteResponse, error) {
	if c.after >= 0 && c.written.Load() >= c.after && len(req.Changes) > 0 {
		half := &pluginv1.WriteRequest{Changes: req.Changes[:(len(req.Changes)+1)/2]}
		_, _ = c.Sink.Write(ctx, half)
		if dir := os.Getenv("PLUGINSINK_CRASH_MARK"); dir != "" {
			_ = os.WriteFile(fmt.Sprintf("%s/crash-%d", dir, os.Getpid()), nil, 0o644)
		}
		os.Exit(3)
	}
	r, err := c.Sink.Write(ctx, req)
	if err == nil && r.GetError() == nil {
		c.written.Add(int64(len(req.Changes)))
	}
	return r, err
}

// slow is a filesink whose first Write after `after` changes takes delay
// more: it writes the batch and then waits (or, when late, waits and then
// writes), so the bridge's deadline passes while the plugin holds the batch
// or is still writing it. A mutex across Write and Delivered orders them, as
// the contract asks of a plugin: Delivered answers after the Write under way.
type slow struct {
	*filesink.Sink
	mu      sync.Mutex
	after   int
	delay   time.Duration
	late    bool
	written int
	slowed  bool
}

func (s *slow) Write(ctx context.Context, req *pluginv1.WriteRequest) (*pluginv1.WriteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written < s.after || s.slowed {
		s.written += len(req.Changes)
		return s.Sink.Write(ctx, req)
	}
	s.slowed = true
	if s.late {
		time.Sleep(s.delay)
	}
	r, err := s.Sink.Write(ctx, req)
	if !s.late {
		time.Sleep(s.delay)
	}
	return r, err
}

func (s *slow) Delivered(ctx context.Context, req *pluginv1.DeliveredRequest) (*pluginv1.DeliveredResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Sink.Delivered(ctx, req)
}
