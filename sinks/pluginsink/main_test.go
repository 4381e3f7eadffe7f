package pluginsink_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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
		os.Exit(m.Run())
	case "filesink":
		s := filesink.New()
		pluginv1.Serve(s, s)
	case "crash": // filesink that exits in the middle of a Write (see crashing)
		n, _ := strconv.Atoi(os.Getenv("PLUGINSINK_CRASH_AFTER"))
		s := &crashing{Sink: filesink.New(), after: int64(n)}
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
