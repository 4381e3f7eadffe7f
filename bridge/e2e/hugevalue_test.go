package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/feeds"
)

// TestHugeValueThroughBothSources sends one row with a text value far above
// NATS' max_payload through pgoutput and wal2json: the payload goes to the
// object store (large_payload_bucket) and the message refers to it, in
// order with the rows around it, and a feed serves it whole. 20 MB by default, 100 MB with TEST_LONG=1.
// The bridge process's peak RSS is logged.
func TestHugeValueThroughBothSources(t *testing.T) {
	defer parallel(t)()
	mb := 20
	if os.Getenv("TEST_LONG") != "" {
		mb = 100
	}
	bin := bridgeBinary(t)
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE huge (id int PRIMARY KEY, body text)`)
	p := e.parityConfig("huge")
	raw, err := os.ReadFile(p)
	require.NoError(t, err)
	var y map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &y))
	for _, s := range y["sinks"].(map[string]any) {
		s.(map[string]any)["config"].(map[string]any)["large_payload_bucket"] = "huge_payloads"
	}
	out, err := yaml.Marshal(y)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, out, 0o644))

	proc := startProc(t, bin, p)
	waitSlotActive(t, e, "slot_huge_pg")
	waitSlotActive(t, e, "slot_huge_wj")
	e.pg.ExecT(t, `INSERT INTO huge VALUES (1, 'before')`,
		fmt.Sprintf(`INSERT INTO huge SELECT 2, string_agg(md5(i::text), '') FROM generate_series(1, %d) i`, mb<<20/32),
		`INSERT INTO huge VALUES (3, 'after')`)
	nc, err := nats.Connect(e.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, src := range []string{"pg", "wj"} {
		ms := e.waitCount("CDC_huge_"+src, 3, 5*time.Minute)
		require.Len(t, ms, 3)
		checkOrdered(t, ms)
		require.Equal(t, "before", ms[0].Body["after"].(map[string]any)["body"])
		require.Equal(t, "after", ms[2].Body["after"].(map[string]any)["body"])
		ref := ms[1].Header.Get("Bridge-Payload-Object")
		require.Equal(t, "huge_payloads/"+ms[1].ID, ref, "source %s", src)
		require.Empty(t, ms[1].Raw)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		obs, err := js.ObjectStore(ctx, "huge_payloads")
		require.NoError(t, err)
		payload, err := obs.GetBytes(ctx, ms[1].ID)
		cancel()
		require.NoError(t, err)
		body := exactBody(t, payload)
		v := body["after"].(map[string]any)["body"].(string)
		require.Len(t, v, mb<<20/32*32, "source %s: the value arrives complete", src)
		require.Equal(t, "c4ca4238a0b923820dcc509a6f75849b", v[:32]) // md5('1')

		// A feed serves it whole, its payload read from the object store.
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		fs, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_huge_" + src, WindowBytes: 256 << 20})
		require.NoError(t, err)
		from := fs.Position()
		from.Seq = 0
		f, err := fs.Register(feeds.Filter{}, from)
		require.NoError(t, err)
		var served []feeds.Change
		for len(served) < 3 && ctx.Err() == nil {
			b, err := f.Next(ctx)
			require.NoError(t, err, "source %s", src)
			served = append(served, b.Changes...)
		}
		cancel()
		fs.Close()
		require.Len(t, served, 3, "source %s", src)
		var fc struct {
			After map[string]any `json:"after"`
		}
		require.NoError(t, json.Unmarshal(served[1].JSON, &fc))
		require.Equal(t, v, fc.After["body"], "source %s: the feed serves the value whole", src)
	}
	peak := peakRSS(t, proc.cmd.Process.Pid)
	proc.term(t)
	t.Logf("a %d MB value through pgoutput and wal2json: bridge peak RSS %d MiB", mb, peak>>20)
}
