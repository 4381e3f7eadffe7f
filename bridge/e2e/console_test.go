package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/app"
)

// chromiumPath is Debian's chromium (scripts/deps.sh installs it).
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium with a fresh profile and returns a
// tab's context, and the console errors and exceptions the page reports
// (checked when the test ends).
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("the console's browser tests need Chromium at %s: run scripts/deps.sh (Debian package chromium): %v", chromiumPath, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	var mu sync.Mutex
	var problems []string
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				p := m.String()
				if m.URL != "" {
					p += " (" + m.URL + ")"
				}
				problems = append(problems, p)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), problems...)
	}
}

// textOf returns the text of the first node matching sel, "" when none.
func textOf(ctx context.Context, sel string) string {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.textContent : ""; })()`, sel)
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

// waitText waits until the text of sel satisfies ok.
func waitText(t *testing.T, ctx context.Context, sel, what string, ok func(string) bool) string {
	t.Helper()
	var last string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if last = textOf(ctx, sel); ok(last) {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: %s reads %q after 60s", what, sel, last)
	return ""
}

// a11yJS checks the page's accessibility basics and returns the problems:
// every control has a label (label for=, aria-label, aria-labelledby, or a
// button's own text), every image has alt text (img alt, svg role=img
// aria-label), and every visible text has a contrast of at least 4.5:1
// with the background it is drawn on, computed from the styles the page
// ships (WCAG 2 relative luminance).
const a11yJS = `(() => {
  const out = [];
  const name = e => e.id || e.getAttribute("data-action") || e.outerHTML.slice(0, 60);
  for (const e of document.querySelectorAll("input, select, textarea, button")) {
    const labelled = e.getAttribute("aria-label") || e.getAttribute("aria-labelledby") ||
      (e.id && document.querySelector('label[for="' + e.id + '"]')) || e.closest("label") ||
      (e.tagName === "BUTTON" && e.textContent.trim());
    if (!labelled) out.push("no label: " + name(e));
  }
  for (const e of document.querySelectorAll("img")) if (!e.getAttribute("alt")) out.push("img without alt: " + name(e));
  for (const e of document.querySelectorAll("svg")) {
    if (e.getAttribute("role") !== "img" || !e.getAttribute("aria-label")) out.push("svg without role=img and aria-label: " + e.outerHTML.slice(0, 80));
  }
  const rgba = s => { const m = s.match(/rgba?\(([^)]+)\)/); if (!m) return null; const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }; return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const bg = e => {
    const layers = [];
    for (let n = e; n && n.nodeType === 1; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let r = [255, 255, 255];
    for (const c of layers.reverse()) r = [0, 1, 2].map(i => c[i] * c[3] + r[i] * (1 - c[3]));
    return r;
  };
  let checked = 0;
  for (const e of document.querySelectorAll("body *")) {
    if (e.closest("svg") || e.tagName === "OPTION" || e.tagName === "SCRIPT") continue;
    const own = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !e.getClientRects().length) continue;
    const st = getComputedStyle(e);
    if (st.visibility === "hidden") continue;
    const fg = rgba(st.color), b = bg(e);
    const l1 = lum(fg), l2 = lum(b);
    const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    checked++;
    if (ratio < 4.5) out.push("contrast " + ratio.toFixed(2) + ":1 of " + st.color + " on rgb(" + b.map(Math.round) + ") in " + name(e) + ": " + e.textContent.trim().slice(0, 40));
  }
  if (checked < 20) out.push("only " + checked + " texts checked: the page did not render");
  return out;
})()`

// TestConsoleInBrowser loads the web console in headless Chromium against
// a running bridge with real Postgres and NATS: the source streams, rows
// written show up in the counters and in the live tail (masked as the
// route publishes them, filtered by the tail's op), pause and resume
// change the state the page shows, a snapshot started from the page (one
// click arms the button, a second confirms) shows its reads in the tail,
// masked, a snapshot's progress is drawn as a labelled bar, the page logs
// no error, and its controls, images and colours pass the accessibility
// basics. The screenshot is saved (BRIDGE_CONSOLE_SCREENSHOT names the
// file, as for docs/console.png; else a temporary one, logged).
func TestConsoleInBrowser(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY, v text, secret text)`)
	p := e.configRoutes("console", "", `  - sinks: [js]
    subject: "cdc.console.{{.Schema}}.{{.Table}}"
    mask:
      - redact: [secret]
`)
	appendYAML(t, p, "telemetry:\n  metrics:\n    slot_poll_interval: 200ms\n")
	r := e.startWith(p, app.WithConsoleInterval(250*time.Millisecond))
	base := "http://" + r.app.HTTPAddr()
	require.Eventually(t, func() bool { c, _ := httpStatus(t, base+"/readyz"); return c == http.StatusOK }, 60*time.Second, 50*time.Millisecond)
	code, body := httpStatus(t, base+"/")
	require.Equal(t, http.StatusOK, code, "/ leads to the console")
	require.Contains(t, body, "bridge console")

	ctx, problems := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/console/")))
	state := `#src-app [data-field=state]`
	waitText(t, ctx, state, "the source streams", func(s string) bool { return s == "streaming" })
	waitText(t, ctx, `#src-app [data-field=retained]`, "the slot is polled", func(s string) bool { return strings.Contains(s, "reserved") })
	require.Equal(t, "0", textOf(ctx, `#src-app [data-field=delivered]`))
	// The tail follows from now; rows written show up, masked.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click("#tail-start")))
	waitText(t, ctx, "#tail-status", "the tail connects", func(s string) bool { return strings.HasPrefix(s, "Following") })
	e.pg.ExecT(t, `INSERT INTO items VALUES (1, 'a', 'TOPSECRET-1'), (2, 'b', 'TOPSECRET-2'), (3, 'c', 'TOPSECRET-3')`)
	waitText(t, ctx, `#src-app [data-field=delivered]`, "delivered counts the rows", func(s string) bool { return s == "3" })
	// The cards are updated in place: the pause button, marked and
	// focused, is the same element with the focus after two refreshes (a
	// click whose press and release straddle a refresh lands, and a
	// keyboard user keeps their place).
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		const b = document.querySelector("#src-app button[data-action=pause]");
		b.kept = true; b.focus();
		window.redraws = 0;
		new MutationObserver(() => window.redraws++).observe(document.getElementById("sources"), {subtree: true, childList: true});
		return true;
	})()`))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.redraws`))
		return err == nil && n >= 2
	}, 60*time.Second, 100*time.Millisecond, "the page redraws the sources")
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`(() => {
		const b = document.querySelector("#src-app button[data-action=pause]");
		return [b.kept === true, document.activeElement === b];
	})()`))
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, kept, "the pause button is the same element, focused, after the refreshes")
	waitText(t, ctx, `#sinks tr[data-sink=js] [data-field=delivered]`, "the sink's deliveries", func(s string) bool { return s == "3" })
	rowCount := func() int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#tail tbody tr").length`))
		if err != nil {
			return -1
		}
		return n
	}
	require.Eventually(t, func() bool { return rowCount() == 3 }, 60*time.Second, 100*time.Millisecond, "the tail shows the 3 inserts")
	tail := textOf(ctx, "#tail tbody")
	require.Contains(t, tail, "public.items")
	require.Contains(t, tail, `"secret":null`, "the route's mask applies in the tail")
	require.NotContains(t, tail, "TOPSECRET")
	require.Equal(t, "insert", textOf(ctx, "#tail tbody tr:first-child td:nth-child(2)"))
	hist, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector("#sinks tr[data-sink=js] svg") || {ariaLabel: ""}).ariaLabel`))
	require.NoError(t, err)
	require.Contains(t, hist, "publish latency of sink js", "the latency histogram is drawn")
	require.Eventually(t, func() bool {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#src-app svg[aria-label^="Changes per second"] path, #src-app svg[aria-label^="Slot retained WAL"] path').length`))
		return err == nil && n == 2
	}, 60*time.Second, 100*time.Millisecond, "the sparklines of the throughput and the retained WAL are drawn")

	// The tail's filter: deletes only.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue("#tail-op", "delete"),
		chromedp.Click("#tail-start")))
	waitText(t, ctx, "#tail-status", "the filtered tail connects", func(s string) bool { return s == "Following (filtered)." })
	e.pg.ExecT(t, `UPDATE items SET v = 'x' WHERE id = 1`, `DELETE FROM items WHERE id = 2`)
	waitText(t, ctx, `#src-app [data-field=delivered]`, "delivered counts the update and delete", func(s string) bool { return s == "5" })
	require.Eventually(t, func() bool { return rowCount() >= 1 }, 60*time.Second, 100*time.Millisecond)
	ops, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#tail tbody tr")].map(r => r.dataset.op)`))
	require.NoError(t, err)
	require.Equal(t, []string{"delete"}, ops, "the filtered tail shows the delete only")

	// Pause and resume from the page.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`#src-app button[data-action=pause]`)))
	waitText(t, ctx, state, "the source pauses", func(s string) bool { return s == "paused" })
	e.pg.ExecT(t, `INSERT INTO items VALUES (4, 'd', 'TOPSECRET-4')`)
	require.Equal(t, "5", textOf(ctx, `#src-app [data-field=delivered]`), "nothing is delivered while paused")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`#src-app button[data-action=resume]`)))
	waitText(t, ctx, state, "the source resumes", func(s string) bool { return s == "streaming" })
	waitText(t, ctx, `#src-app [data-field=delivered]`, "the row written while paused is delivered", func(s string) bool { return s == "6" })

	// A snapshot from the page (armed, then confirmed) puts the rows into
	// the stream as reads, masked too.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue("#tail-op", "read"),
		chromedp.Click("#tail-start")))
	waitText(t, ctx, "#tail-status", "the tail of reads connects", func(s string) bool { return s == "Following (filtered)." })
	snap := `#src-app button[data-action=snapshot]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(snap)))
	waitText(t, ctx, snap, "the snapshot button asks for confirmation", func(s string) bool { return s == "Confirm snapshot of every table" })
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(snap)))
	e.waitSnapshotDone("console", 60*time.Second, nil)
	require.Eventually(t, func() bool { return rowCount() == 3 }, 60*time.Second, 100*time.Millisecond, "the tail shows the snapshot's 3 rows")
	ops, err = chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#tail tbody tr")].map(r => r.dataset.op)`))
	require.NoError(t, err)
	require.Equal(t, []string{"read", "read", "read"}, ops)
	tail = textOf(ctx, "#tail tbody")
	for _, id := range []string{`"id":1`, `"id":3`, `"id":4`} {
		require.Contains(t, tail, id, "the rows of the table now")
	}
	require.Contains(t, tail, `"secret":null`, "the route's mask applies to reads")
	require.NotContains(t, tail, "TOPSECRET")
	require.Empty(t, textOf(ctx, "#problem"), "no action was refused")

	// A snapshot's progress as the overview reports it (TestOverview in
	// bridge/console checks that shape; a snapshot of 3 rows is over too
	// soon to be seen running) is drawn as a labelled bar. The bar and the
	// accessibility basics are checked in the same script, so the page's
	// next refresh cannot redraw the snapshots in between.
	const running = `renderSnapshots([{name: "app", snapshot: {running: true, tables_remaining: 1,
		tables: [{table: "public.items", rows: 250, estimate: 1000, rows_per_second: 50, eta_seconds: 15}]}}]);`
	bar, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {`+running+`
		const p = document.querySelector("#snapshots progress");
		return p ? [String(p.value), String(p.max), document.querySelector('label[for="' + p.id + '"]').textContent, p.parentElement.textContent] : [];
	})()`))
	require.NoError(t, err)
	require.Len(t, bar, 4)
	require.Equal(t, []string{"250", "1000", "public.items"}, bar[:3])
	require.Contains(t, bar[3], "250 / ~1,000 rows, 15.0 s left")

	issues, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {`+running+` return `+a11yJS+`; })()`))
	require.NoError(t, err)
	require.Empty(t, issues, "accessibility basics")
	// The screenshot shows the bridge as it is: no snapshot running.
	waitText(t, ctx, "#snapshots", "the page redraws the snapshots", func(s string) bool { return s == "No snapshot in progress." })

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	out := os.Getenv("BRIDGE_CONSOLE_SCREENSHOT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "console.png")
	}
	require.NoError(t, os.WriteFile(out, png, 0o644))
	t.Logf("screenshot of the console: %s (%d bytes)", out, len(png))
	require.Empty(t, problems(), "the page logged errors")
}

// consoleOn starts a bridge whose http.listen is beyond loopback (all
// interfaces, /metrics open with allow_public) with serve, a serve
// section, and returns the console's base URL over 127.0.0.1.
func consoleOn(t *testing.T, e *env, name, serve string) string {
	t.Helper()
	p := e.config(name, "")
	y, err := os.ReadFile(p)
	require.NoError(t, err)
	s := strings.Replace(string(y), `listen: "127.0.0.1:0"`, "listen: \"0.0.0.0:0\"\n  allow_public: true", 1)
	require.NoError(t, os.WriteFile(p, []byte(s+serve), 0o644))
	r := e.start(p)
	_, port, err := net.SplitHostPort(r.app.HTTPAddr())
	require.NoError(t, err)
	base := "http://127.0.0.1:" + port
	require.Eventually(t, func() bool { c, _ := httpStatus(t, base+"/readyz"); return c == http.StatusOK }, 60*time.Second, 50*time.Millisecond)
	return base
}

// consoleCall sends a request to the console with token (none when ""),
// a POST from the console's own page (Origin), and returns the status and
// the body's start.
func consoleCall(t *testing.T, method, u, token string, ctx context.Context) (int, string) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"reason":"test"}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if method == http.MethodPost {
		req.Header.Set("Origin", req.URL.Scheme+"://"+req.URL.Host) // from the console's page
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b := make([]byte, 512)
	n, _ := io.ReadAtLeast(resp.Body, b, 1)
	return resp.StatusCode, string(b[:n])
}

// TestConsoleBeyondLoopback: on an address beyond loopback the console is
// off without serve.auth, and says so; with it, its API and tail ask for
// the same JWT as `bridge serve` (the page's files, which hold no data,
// stay open), the buttons act only for a valid token with the
// bridge:control scope, and a token in the URL is refused on this
// listener, which serves no TLS.
func TestConsoleBeyondLoopback(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY, v text)`)
	ctx := context.Background()

	open := consoleOn(t, e, "conpub", "")
	code, body := consoleCall(t, http.MethodGet, open+"/console/api/overview", "", ctx)
	require.Equal(t, http.StatusNotFound, code, "no console beyond loopback without serve.auth")
	require.Contains(t, body, `"detail":"the web console is off: http.listen \"0.0.0.0:0\" is beyond loopback and serve.auth is not set`)
	code, _ = consoleCall(t, http.MethodGet, open+"/metrics", "", ctx)
	require.Equal(t, http.StatusOK, code, "the rest of the listener is served")

	base := consoleOn(t, e, "conjwt", fmt.Sprintf("serve:\n  auth:\n    hs256_secret: %s\n    query_token: true\n", testSecret))
	good := mint(t, testSecret, jwt.MapClaims{"sub": "ops", "scope": "bridge:control", "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	bad := mint(t, "another-secret-0123456789abcdef-0123456", jwt.MapClaims{"sub": "ops", "exp": time.Now().Add(time.Hour).Unix()})

	code, body = consoleCall(t, http.MethodGet, base+"/console/", "", ctx)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "bridge console")
	for _, tok := range []string{"", bad} {
		code, body = consoleCall(t, http.MethodGet, base+"/console/api/overview", tok, ctx)
		require.Equal(t, http.StatusUnauthorized, code, body)
		code, body = consoleCall(t, http.MethodPost, base+"/console/api/sources/app/pause", tok, ctx)
		require.Equal(t, http.StatusUnauthorized, code, body)
		code, body = consoleCall(t, http.MethodGet, base+"/console/api/v1/feed?sse=1&token=now", tok, ctx)
		require.Equal(t, http.StatusUnauthorized, code, body)
	}
	code, body = consoleCall(t, http.MethodGet, base+"/console/api/overview", good, ctx)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"bridge":"conjwt"`)

	// The tail with the token in the header, as the page sends it; in the
	// query it is refused here (no http.tls), though serve.auth.query_token
	// is set.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	code, body = consoleCall(t, http.MethodGet, base+"/console/api/v1/feed?sse=1&token=now", good, tctx)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, ": feed")
	code, body = consoleCall(t, http.MethodGet, base+"/console/api/v1/feed?sse=1&token=now&access_token="+url.QueryEscape(good), "", ctx)
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Contains(t, body, `not accepted on http.listen \"0.0.0.0:0\", which is served without TLS`)

	code, body = consoleCall(t, http.MethodPost, base+"/console/api/sources/app/pause", good, ctx)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"state":"paused"`)
	code, body = consoleCall(t, http.MethodPost, base+"/console/api/sources/app/resume", good, ctx)
	require.Equal(t, http.StatusOK, code, body)
}

// TestConsoleTailWithToken follows the live tail in headless Chromium
// from a console behind serve.auth (JWT, no query_token): the page sends
// the token entered in its form in the Authorization header, for the
// overview and for the tail, never in the URL, so the tail works where
// only headers are accepted; the buttons a bridge:control token offers
// work from the page (its Origin passes the listener's checks).
func TestConsoleTailWithToken(t *testing.T) {
	defer parallel(t)()
	e := newEnv(t)
	e.pg.ExecT(t, `CREATE TABLE items (id int PRIMARY KEY, v text)`)
	p := e.config("contok", "")
	appendYAML(t, p, fmt.Sprintf("serve:\n  auth:\n    hs256_secret: %s\n", testSecret))
	r := e.startWith(p, app.WithConsoleInterval(250*time.Millisecond))
	base := "http://" + r.app.HTTPAddr()
	require.Eventually(t, func() bool { c, _ := httpStatus(t, base+"/readyz"); return c == http.StatusOK }, 60*time.Second, 50*time.Millisecond)
	tok := mint(t, testSecret, jwt.MapClaims{"sub": "ops", "scope": "bridge:control", "exp": time.Now().Add(time.Hour).Unix()})

	ctx, problems := browser(t)
	// The token as the page's form stores it, before the page's first
	// request (without it the overview answers 401, which the page logs).
	// It is set by a script that runs before the page's own, not by a
	// first visit to another document of the origin, whose favicon
	// request could 404 into the log.
	require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: fmt.Sprintf(`sessionStorage.setItem("bridge-token", %q);`, tok),
		})
		return err
	})))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/console/")))
	state := `#src-app [data-field=state]`
	waitText(t, ctx, state, "the overview with the token", func(s string) bool { return s == "streaming" })

	require.NoError(t, chromedp.Do(ctx, chromedp.Click("#tail-start")))
	waitText(t, ctx, "#tail-status", "the tail connects with the token in its header", func(s string) bool { return strings.HasPrefix(s, "Following") })
	e.pg.ExecT(t, `INSERT INTO items VALUES (1, 'a'), (2, 'b')`)
	require.Eventually(t, func() bool {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#tail tbody tr").length`))
		return err == nil && n == 2
	}, 60*time.Second, 100*time.Millisecond, "the tail shows the 2 inserts; status: %s", textOf(ctx, "#tail-status"))
	require.Contains(t, textOf(ctx, "#tail tbody"), "public.items")

	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`#src-app button[data-action=pause]`)))
	waitText(t, ctx, state, "the source pauses", func(s string) bool { return s == "paused" })
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`#src-app button[data-action=resume]`)))
	waitText(t, ctx, state, "the source resumes", func(s string) bool { return s == "streaming" })
	require.Empty(t, textOf(ctx, "#problem"), "no action was refused")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click("#tail-stop")))
	require.Empty(t, problems(), "the page logged errors")
}
