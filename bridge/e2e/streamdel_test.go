package e2e_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStreamDeletedNotRepublished pins down what a recreated stream starts
// with (docs/operations.md, Faults): the first transaction the deleted
// stream had not acknowledged. What the deleted stream acknowledged counts
// as delivered, even past the last checkpoint: when the run ends on the
// failed publish, its final checkpoint covers every transaction the stream
// acknowledged whole, so none of them is published again. The checkpoint
// interval is an hour here, so that at the deletion nothing after the
// first checkpoint is saved: "republish since the last checkpoint" would
// send every row again.
func TestStreamDeletedNotRepublished(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE sd (id int PRIMARY KEY)`)
	p := e.config("sdel2", "")
	y, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, []byte(strings.Replace(string(y), "interval: 200ms", "interval: 1h", 1)), 0o644))
	r := e.start(p)
	waitReady(t, r)
	for i := 1; i <= 50; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO sd VALUES (%d)`, i))
	}
	before := e.waitCount("CDC_sdel2", 50, time.Minute)
	pl := r.app.Pipelines()[0]
	require.Less(t, uint64(pl.Checkpointed()), uint64(before[0].Pos.LSN), "no checkpoint covers the rows yet")

	js := natsJS(t, e)
	require.NoError(t, js.DeleteStream(t.Context(), "CDC_sdel2"))
	for i := 51; i <= 60; i++ {
		e.pg.ExecT(t, fmt.Sprintf(`INSERT INTO sd VALUES (%d)`, i))
	}
	require.Eventually(t, func() bool { return e.streamExists("CDC_sdel2") && storedCount(t, e, "CDC_sdel2") >= 10 },
		time.Minute, 20*time.Millisecond, "the sink never recreated the stream")
	time.Sleep(time.Second) // anything else on its way
	ms := e.messages("CDC_sdel2")
	checkOrdered(t, ms)
	var got []int
	for _, m := range ms {
		got = append(got, int(m.Body["after"].(map[string]any)["id"].(float64)))
	}
	require.Equal(t, []int{51, 52, 53, 54, 55, 56, 57, 58, 59, 60}, got,
		"the new stream starts after the last change the deleted one acknowledged")
	require.GreaterOrEqual(t, uint64(pl.Checkpointed()), uint64(before[len(before)-1].Pos.LSN),
		"the run that noticed the deletion checkpointed what the deleted stream acknowledged")
}
