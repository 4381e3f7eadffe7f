package e2e_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fastjson"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/format"
)

// fanoutConfig writes a bridge.yaml whose routes publish every change of
// kt three times: to stream CDC_<name> with pad redacted (route masked,
// continue), to the same stream with the whole row (route full,
// continue), and to the KV bucket ROWS_<name> (route mirror). jsOptions
// are added to the stream sink's config block.
func (e *env) fanoutConfig(t *testing.T, name string, jsOptions ...string) string {
	e.t.Helper()
	p := e.config(name, "")
	for _, o := range jsOptions {
		setSinkOption(t, p, o)
	}
	b, err := os.ReadFile(p)
	require.NoError(e.t, err)
	y := string(b)
	i := strings.Index(y, "routes:\n")
	require.Positive(e.t, i, "no routes section in %s", p)
	y = strings.Replace(y[:i], "sinks:\n", fmt.Sprintf("sinks:\n  kv:\n    type: nats_kv\n    config:\n      bucket: ROWS_%s\n      history: 64\n", name), 1) +
		fmt.Sprintf(`routes:
  - name: masked
    continue: true
    sinks: [js]
    subject: "cdc.%[1]s.masked.{{.Table}}"
    mask:
      - redact: [pad]
  - name: full
    continue: true
    sinks: [js]
    subject: "cdc.%[1]s.full.{{.Table}}"
  - name: mirror
    sinks: [kv]
`, name)
	require.NoError(e.t, os.WriteFile(p, []byte(y), 0o644))
	return p
}

// TestFanoutKill9MidStream kills the bridge with SIGKILL at random moments
// while four writers commit changes that three routes publish: two into
// one stream (one masked, one whole; a 1 s duplicate window, so dedupe
// alone cannot hide a replay) and one into a KV mirror. Every committed
// change must be in the stream exactly once per route, in commit order,
// and the bucket must end equal to the table without a value ever going
// back.
func TestFanoutKill9MidStream(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		name    string
		options []string
		changes int
	}{
		{"per_message", nil, 20000},
		// A transaction each route takes whole goes as one atomic batch
		// per route.
		{"atomic", []string{"atomic_transactions: true"}, 8000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer parallelLong(t)() // each case has servers of its own
			changes := tc.changes
			if testing.Short() {
				changes = 4000
			}
			bin := bridgeBinary(t)
			e := newEnv(t)
			w := newWorkload(t, e)
			cfg := e.fanoutConfig(t, "fan", tc.options...)
			p := startProc(t, bin, cfg)
			waitSlotActive(t, e, "slot_fan")
			p, kills := killWhileWriting(t, p, bin, cfg, w, changes, 10)

			want, total := w.expected()
			e.waitStored("CDC_fan", 2*total, 3*time.Minute)
			ms := e.rawMessages("CDC_fan")
			var jp fastjson.Parser
			routes := map[string][]msg{}
			for _, m := range ms {
				parts := strings.Split(m.Subject, ".")
				require.Len(t, parts, 4, "subject %q", m.Subject)
				routes[parts[2]] = append(routes[parts[2]], m)
			}
			for _, route := range []string{"masked", "full"} {
				rms := routes[route]
				for _, m := range rms {
					require.True(t, strings.HasSuffix(m.ID, cdc.DestSep+route), "stream seq %d on %s has id %s", m.Seq, m.Subject, m.ID)
					require.Equal(t, route, m.Pos.Dest)
					v, err := jp.ParseBytes(m.Raw)
					require.NoError(t, err, "stream seq %d: %s", m.Seq, m.Raw)
					after := v.Get("after")
					if after != nil && after.Type() != fastjson.TypeObject {
						after = nil // a delete's
					}
					if route == "masked" {
						require.Equal(t, "pad=redact", m.Header.Get(format.HeaderMasked), "stream seq %d", m.Seq)
						if after != nil {
							pad := after.Get("pad")
							require.True(t, pad == nil || pad.Type() == fastjson.TypeNull, "stream seq %d: pad is redacted: %s", m.Seq, m.Raw)
						}
					} else if after != nil {
						require.NotEmpty(t, after.GetStringBytes("pad"), "stream seq %d: the full route publishes pad: %s", m.Seq, m.Raw)
					}
				}
				checkOrdered(t, rms)
				checkEvents(t, "route "+route, rms, want, total)
			}
			require.Len(t, ms, 2*total, "nothing but the two routes' messages")
			time.Sleep(500 * time.Millisecond)
			require.EqualValues(t, 2*total, storedCount(t, e, "CDC_fan"), "nothing arrives later")

			kms := e.waitKT(t, "ROWS_fan", 3*time.Minute)
			checkRevisions(t, kms)
			t.Logf("%d changes, %d kills: %d stream messages, %d bucket revisions", total, kills, len(ms), len(kms))
			p.term(t)
		})
	}
}
