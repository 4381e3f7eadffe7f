package bridge_test

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKill9MidStreamFastBatch is TestKill9MidStream with the sink's
// fast_batch on: Writes go out as fast-ingest batches, whose acks cover
// runs of messages. SIGKILLs at random moments while four writers commit;
// every committed change must be in the stream exactly once, in order.
func TestKill9MidStreamFastBatch(t *testing.T) {
	changes := 30000
	if testing.Short() {
		changes = 8000
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg := e.config("fastkill", "")
	y, err := os.ReadFile(cfg)
	require.NoError(t, err)
	patched := strings.Replace(string(y), "      duplicate_window: 1s\n", "      duplicate_window: 1s\n      fast_batch: true\n      expect_last_sequence: false\n", 1)
	require.NotEqual(t, string(y), patched)
	require.NoError(t, os.WriteFile(cfg, []byte(patched), 0o644))

	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_fastkill")
	done := make(chan struct{})
	go func() {
		w.run(t, 4, changes, 300*time.Microsecond)()
		close(done)
	}()
	kills := 0
	writing := true
	for writing || kills < 8 {
		time.Sleep(time.Duration(200+rand.N(1200)) * time.Millisecond)
		p.kill9(t)
		kills++
		if rand.N(3) == 0 {
			time.Sleep(time.Duration(rand.N(1500)) * time.Millisecond)
		}
		p = startProc(t, bin, cfg)
		select {
		case <-done:
			writing = false
		default:
		}
	}
	t.Logf("killed the bridge %d times while %d changes were committed", kills, w.total.Load())
	w.verifyExactlyOnce(t, e, "CDC_fastkill")
	p.term(t)
}
