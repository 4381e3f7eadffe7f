package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/serve/ssetest"
)

// serveBinary starts `bridge serve` (the built binary) for the stream of
// e.config(name), with serveExtra under serve:, and returns its address
// once /readyz answers.
func serveBinary(t *testing.T, e *env, name, serveExtra string) string {
	t.Helper()
	cfg := e.config(name+"_serve", "")
	y, err := os.ReadFile(cfg)
	require.NoError(t, err)
	// The serve process reads the stream the bridge of e.config(name) writes.
	s := strings.ReplaceAll(string(y), "CDC_"+name+"_serve", "CDC_"+name)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s += fmt.Sprintf("serve:\n  listen: %q\n  stream: CDC_%s\n%s", addr, name, serveExtra)
	require.NoError(t, os.WriteFile(cfg, []byte(s), 0o644))
	b := startBinary(t, nil, "serve", "-c", cfg)
	waitHTTP(t, b, "http://"+addr, "/readyz")
	return addr
}

// TestServeJSONLineBreaks writes, in one transaction, a json column whose
// text holds raw line breaks and a "\r" (Postgres keeps json as written)
// and two rows after it, and reads them from `bridge serve` (the binary,
// over real HTTP): as server-sent events, read as EventSource reads them
// (ssetest.Parser, the HTML standard), every change arrives in one whole
// event whose data is valid JSON with the value Postgres holds; before
// the fix the first line break ended the event's data line, the event's
// id still moved the client's position, and the rows after it were lost.
// The long-poll answer, and the web console's live tail (the same feed on
// bridge run's listener), carry the same values.
func TestServeJSONLineBreaks(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE docs (id int PRIMARY KEY, doc json)`)
	run := e.start(e.config("jsn", ""))
	waitSlotActive(t, e, "slot_jsn")
	addr := serveBinary(t, e, "jsn", "")
	base := "http://" + addr

	code, body := call(t, t.Context(), "GET", base+"/v1/position", "", nil, "")
	require.Equal(t, 200, code, body)
	var pos struct{ Token string }
	require.NoError(t, json.Unmarshal([]byte(body), &pos))

	docs := map[float64]string{
		1: "{\"a\":\n\n1,\r\"b\":\r\n[1,\n2]}",
		2: `{"after":"the cut"}`,
		3: "[\"x\",\r\r\"y\"]",
	}
	e.pg.ExecT(t, "BEGIN; INSERT INTO docs VALUES (1, '"+docs[1]+"'); INSERT INTO docs VALUES (2, '"+docs[2]+"'); INSERT INTO docs VALUES (3, '"+docs[3]+"'); COMMIT")
	check := func(t *testing.T, changes []json.RawMessage) {
		t.Helper()
		require.Len(t, changes, 3, "every row of the transaction")
		for _, raw := range changes {
			var c struct {
				After struct {
					ID  float64
					Doc any
				}
			}
			require.NoError(t, json.Unmarshal(raw, &c), "%s", raw)
			var want any
			require.NoError(t, json.Unmarshal([]byte(docs[c.After.ID]), &want))
			require.Equal(t, want, c.After.Doc, "row %v", c.After.ID)
		}
	}

	sse := func(t *testing.T, addr, path string) {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		st, err := ssetest.Open(ctx, addr, path+"?sse=1&tables=public.docs&token="+url.QueryEscape(pos.Token), "", nil)
		require.NoError(t, err)
		defer st.Close()
		require.NoError(t, st.SetDeadline(time.Now().Add(60*time.Second)))
		var changes []json.RawMessage
		for len(changes) < 3 {
			b, err := st.Next()
			require.NoError(t, err, "changes so far: %s", changes)
			if !b.Dispatched || b.Type == "up-to-date" {
				continue
			}
			require.Equal(t, "changes", b.Type, "data: %q", b.Data)
			var batch struct {
				Token   string
				Changes []json.RawMessage
			}
			require.NoError(t, json.Unmarshal([]byte(b.Data), &batch), "an event cut short: %q", b.Data)
			require.Equal(t, batch.Token, b.LastEventID)
			changes = append(changes, batch.Changes...)
		}
		check(t, changes)
	}
	t.Run("SSE", func(t *testing.T) { sse(t, addr, "/v1/feed") })
	// The console's live tail (bridge run's http.listen) serves the same
	// feed, read by console.js as an event stream.
	t.Run("console tail", func(t *testing.T) { sse(t, run.app.HTTPAddr(), "/console/api/v1/feed") })

	t.Run("long-poll", func(t *testing.T) {
		_, body := get(t, base, url.Values{"tables": {"public.docs"}, "token": {pos.Token}}, nil)
		check(t, body.Changes)
	})
}
