package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// TestSchemaChangeDeadLetter: a route with on_schema_change: dead_letter
// publishes a dropped column's event, and the table's changes from then
// on (a column added after it too), to its dead-letter subject with the
// reason and the original subject in headers, while another table goes
// on; bridge status, /metrics (bridge_schema_held_tables,
// bridge_schema_dead_lettered_total) and the console's panel show the
// table held; the console's Accept button resumes the source, and the
// table's next change goes to the route's subject again, after the
// version announced there ("accepted"); a restart keeps it so.
func TestSchemaChangeDeadLetter(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE h (id int PRIMARY KEY, a text, n int)`, `CREATE TABLE other (id int PRIMARY KEY)`)
	cfg := e.configRoutes("sdl", "", `  - sinks: [js]
    subject: "cdc.sdl.{{.Schema}}.{{.Table}}"
    on_schema_change: dead_letter
    dead_letter_subject: "cdc.sdl._dead.{{.Schema}}.{{.Table}}"
`)
	enableSchemas(t, cfg)
	appendYAML(t, cfg, "telemetry:\n  metrics:\n    slot_poll_interval: 200ms\n")
	r := e.startWith(cfg, app.WithConsoleInterval(250*time.Millisecond))
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO h VALUES (1, 'one', 1)`, `INSERT INTO other VALUES (1)`)
	e.waitCount("CDC_sdl", 4, 30*time.Second)
	e.pg.ExecT(t,
		`ALTER TABLE h DROP COLUMN n`, // breaking: held
		`INSERT INTO h VALUES (2, 'two')`,
		`INSERT INTO other VALUES (2)`, // another table goes on
		`INSERT INTO h VALUES (3, 'three')`,
		`ALTER TABLE h ADD COLUMN m int`, // not breaking, but after a held version: held too
		`INSERT INTO h VALUES (4, 'four', 4)`,
	)
	ms := e.waitCount("CDC_sdl", 4+6, 30*time.Second)
	type seen struct{ op, subject, version string }
	var got []seen
	for _, m := range ms {
		got = append(got, seen{m.Header.Get("Bridge-Op"), m.Subject, m.Header.Get(schema.HeaderVersion)})
	}
	main, dead := "cdc.sdl.public.h", "cdc.sdl._dead.public.h"
	require.Equal(t, []seen{
		{"schema", main, "1"}, {"insert", main, "1"}, {"schema", "cdc.sdl.public.other", "1"}, {"insert", "cdc.sdl.public.other", "1"},
		{"schema", dead, "2"}, {"insert", dead, "2"}, {"insert", "cdc.sdl.public.other", "1"}, {"insert", dead, "2"},
		{"schema", dead, "3"}, {"insert", dead, "3"},
	}, got)
	for _, m := range ms[4:] {
		if m.Subject != dead {
			require.Empty(t, m.Header.Get(route.HeaderDeadLetterReason))
			continue
		}
		require.Equal(t, main, m.Header.Get(route.HeaderOriginalSubject), "seq %d", m.Seq)
		reason := m.Header.Get(route.HeaderDeadLetterReason)
		require.Contains(t, reason, "routes[0].on_schema_change: dead_letter: public.h version")
		require.Contains(t, reason, "then resume the source to accept it")
	}
	require.Contains(t, ms[4].Header.Get(route.HeaderDeadLetterReason), "a breaking change: dropped n")
	require.Contains(t, ms[8].Header.Get(route.HeaderDeadLetterReason), "it follows a breaking change not accepted yet")

	// bridge status, /metrics and the console show the table held.
	st := r.app.Pipelines()[0].Status()
	require.Len(t, st.Held, 1)
	require.Equal(t, "public.h", st.Held[0].Table)
	require.Equal(t, 3, st.Held[0].Version)
	require.Equal(t, "dead_letter", st.Held[0].Policy)
	require.Equal(t, uint64(3), st.Held[0].DeadLettered)
	code, out, errs := execCLI(t, "status", "-c", cfg)
	require.Equal(t, 0, code, "%s%s", out, errs)
	require.Contains(t, out, "held        public.h version 3 (app.public.h.3) by on_schema_change: dead_letter for")
	require.Contains(t, out, "3 change(s) dead-lettered")
	base := "http://" + r.app.HTTPAddr()
	fams := scrape(t, base)
	v, ok := metricValue(fams, "bridge_schema_held_tables", map[string]string{"source": "app", "policy": "dead_letter"})
	require.True(t, ok)
	require.Equal(t, 1.0, v)
	v, _ = metricValue(fams, "bridge_schema_dead_lettered_total", map[string]string{"source": "app"})
	require.Equal(t, 3.0, v)
	v, _ = metricValue(fams, "bridge_schema_versions_total", map[string]string{"source": "app"})
	require.Equal(t, 4.0, v, "h 1, 2, 3 and other 1")
	// A restart remembers the hold before the table's next change.
	r.stop(t)
	r = e.startWith(cfg, app.WithConsoleInterval(250*time.Millisecond))
	waitReady(t, r)
	require.Eventually(t, func() bool { return len(r.app.Pipelines()[0].Status().Held) == 1 }, 10*time.Second, 20*time.Millisecond)
	base = "http://" + r.app.HTTPAddr()
	v, _ = metricValue(scrape(t, base), "bridge_schema_held_tables", map[string]string{"source": "app", "policy": "dead_letter"})
	require.Equal(t, 1.0, v)
	code, body := httpStatus(t, base+"/console/api/overview")
	require.Equal(t, http.StatusOK, code)
	var ov struct {
		Sources []struct {
			Held []struct {
				Table, Policy string
				Version       int
			} `json:"held"`
		} `json:"sources"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &ov))
	require.Len(t, ov.Sources[0].Held, 1)

	ctx, problems := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/console/")))
	row := `#held tr[data-source=app][data-table="public.h"]`
	waitText(t, ctx, row+` [data-field=policy]`, "the panel shows the held table", func(s string) bool { return s == "dead_letter" })
	require.Equal(t, "3", textOf(ctx, row+` [data-field=version]`))
	require.Equal(t, "0", textOf(ctx, row+` [data-field=dead_lettered]`), "by this instance")
	require.Contains(t, textOf(ctx, row), "app.public.h.3")
	// Accept: the console's button resumes the source.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(row+` button[data-action=resume]`)))
	waitText(t, ctx, "#held", "no table held once accepted", func(s string) bool { return strings.Contains(s, "No table is held") })
	require.Empty(t, problems())

	// The table's next change accepts the version: announced on the
	// route's subject, then the change there.
	e.pg.ExecT(t, `INSERT INTO h VALUES (5, 'five', 5)`)
	ms = e.waitCount("CDC_sdl", 12, 30*time.Second)
	require.Len(t, ms, 12)
	require.Equal(t, "schema", ms[10].Header.Get("Bridge-Op"))
	require.Equal(t, main, ms[10].Subject)
	require.Equal(t, ms[11].ID+"@"+schema.Dest, ms[10].ID)
	var ev schema.Event
	require.NoError(t, json.Unmarshal(ms[10].Raw, &ev))
	require.Equal(t, 3, ev.Version)
	require.Equal(t, "accepted", ev.Announce)
	require.Equal(t, main, ms[11].Subject)
	require.Equal(t, 5.0, ms[11].Body["after"].(map[string]any)["id"])
	require.Empty(t, ms[11].Header.Get(route.HeaderDeadLetterReason))
	require.Eventually(t, func() bool {
		v, _ := metricValue(scrape(t, base), "bridge_schema_held_tables", map[string]string{"source": "app", "policy": "dead_letter"})
		return v == 0
	}, 10*time.Second, 50*time.Millisecond)

	// A restart: accepted for good.
	r.stop(t)
	r = e.start(cfg)
	waitReady(t, r)
	e.pg.ExecT(t, `INSERT INTO h VALUES (6, 'six', 6)`)
	ms = e.waitCount("CDC_sdl", 13, 30*time.Second)
	time.Sleep(300 * time.Millisecond)
	ms = e.messages("CDC_sdl")
	require.Len(t, ms, 13)
	require.Equal(t, main, ms[12].Subject)
	require.Equal(t, "insert", ms[12].Header.Get("Bridge-Op"))
	require.Empty(t, r.app.Pipelines()[0].Status().Held)

	// A feed over the stream serves what the route's consumers saw: the
	// changes set aside are not in it.
	js := natsJS(t, e)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	fs, err := feeds.New(ctx, js, feeds.Config{Stream: "CDC_sdl"})
	require.NoError(t, err)
	t.Cleanup(fs.Close)
	from := fs.Position()
	from.Seq = 0 // the stream's start
	f, err := fs.Register(feeds.Filter{}, from)
	require.NoError(t, err)
	var served []string
	for len(served) < 5 && ctx.Err() == nil {
		b, err := f.Next(ctx)
		require.NoError(t, err)
		for _, c := range b.Changes {
			var p struct {
				Key map[string]any `json:"key"`
			}
			require.NoError(t, json.Unmarshal(c.JSON, &p))
			served = append(served, fmt.Sprintf("%s %v", c.Table, p.Key["id"]))
		}
	}
	require.Equal(t, []string{"public.h 1", "public.other 1", "public.other 2", "public.h 5", "public.h 6"}, served)
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	b, _ := f.Next(short)
	require.Empty(t, b.Changes, "nothing after the last change")
}
