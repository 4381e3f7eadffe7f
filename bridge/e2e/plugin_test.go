package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/examples/plugins/exampleplugins"
	"github.com/bridgecdc/bridge/sinks/pluginsink"
)

// examplePlugin builds the example sink plugin in lang (exampleplugins:
// go, python, typescript) once and returns its path and sha256.
func examplePlugin(t *testing.T, lang string) (string, string) {
	t.Helper()
	path, err := exampleplugins.Build(lang)
	require.NoError(t, err)
	sum, err := pluginsink.FileSHA256(path)
	require.NoError(t, err)
	return path, sum
}

// TestPluginCLI: `bridge plugin test` passes the example plugins in Go,
// Python and TypeScript and fails one whose destination cannot be written;
// `bridge plugins` lists a configured plugin with its guarantee, and names
// the fix for a wrong sha256.
func TestPluginCLI(t *testing.T) {
	defer parallelLong(t)()
	bin := bridgeBinary(t)
	plugin, sum := examplePlugin(t, "go")
	dir := t.TempDir()
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return string(out), code
	}

	for _, lang := range exampleplugins.Languages {
		exe, _ := examplePlugin(t, lang)
		out, code := run("plugin", "test", exe, "--plugin-config", `{"path": "`+filepath.Join(dir, lang+".jsonl")+`"}`)
		require.Equal(t, 0, code, "%s: %s", lang, out)
		for _, c := range []string{"config", "connect_close", "ordered", "partial_failure", "break_during_write", "close_deadline", "replay"} {
			require.Contains(t, out, "--- PASS: TestPluginConformance/"+c, "%s: %s", lang, out)
		}
		require.Contains(t, out, "passed the conformance suite", lang)
		require.Contains(t, out, "resumes true, dedupes true", lang)

		out, code = run("plugin", "test", exe, "--plugin-config", `{"path": "/nonexistent-dir/t.jsonl"}`)
		require.Equal(t, 1, code, "%s: %s", lang, out)
		require.Contains(t, out, "--- FAIL: TestPluginConformance", lang)
		require.Contains(t, out, "failed the conformance suite", lang)

		// The plugin checks its own block; its field errors come back
		// under the sink's path.
		out, code = run("plugin", "test", exe, "--plugin-config", `{"path": 1, "colour": "red"}`)
		require.NotEqual(t, 0, code, "%s: %s", lang, out)
		require.Contains(t, out, "sinks.plugin_test.config.config.colour: unknown key (known: path, pid_file, dedupe)", lang)
		require.Contains(t, out, "sinks.plugin_test.config.config.path: expected a string", lang)
	}

	cfg := filepath.Join(dir, "bridge.yaml")
	write := func(sha string) {
		require.NoError(t, os.WriteFile(cfg, []byte(`name: p
sources:
  app: { type: pgoutput, config: { dsn: "postgres://localhost/x", slot: s, publication: p } }
sinks:
  file:
    type: plugin
    config: { command: `+plugin+`, sha256: "`+sha+`", config: { path: `+filepath.Join(dir, "f.jsonl")+` } }
routes:
  - sinks: [file]
`), 0o644))
	}
	write(sum)
	out, code := run("plugins", "-c", cfg)
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^  file: "`+regexp.QuoteMeta(plugin)+`": go-sink 0\.1\.0, contract v1\.1, exactly once \(resumes\)`, out)

	bad := strings.Repeat("0", 64)
	write(bad)
	out, code = run("plugins", "-c", cfg)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `plugin sink "file" (`+plugin+`): the executable's sha256 is `+sum+`, but sinks.file.config.sha256 pins `+bad+`: if you trust this build, set sha256: `+sum)
}

// TestPluginKillMidStream streams into each example plugin (Go, Python,
// TypeScript) while it is killed (SIGKILL, by the pid it writes) and the
// bridge is killed, each several times, and finds every committed change in
// the plugin's file exactly once, in commit order. The Python and
// TypeScript plugins, and the Go one in a second case, run with dedupe:
// false: they would write a change sent twice twice, so it is the bridge's
// question after a crash (what do you hold past this cursor?) that keeps
// each change once.
func TestPluginKillMidStream(t *testing.T) {
	defer parallel(t)()
	for _, tc := range []struct {
		lang   string
		dedupe bool
	}{{"go", true}, {"go", false}, {"python", false}, {"typescript", false}} {
		t.Run(fmt.Sprintf("%s/dedupe=%t", tc.lang, tc.dedupe), func(t *testing.T) {
			defer parallel(t)()
			pluginKillMidStream(t, tc.lang, tc.dedupe)
		})
	}
}

func pluginKillMidStream(t *testing.T, lang string, dedupe bool) {
	bin := bridgeBinary(t)
	plugin, sum := examplePlugin(t, lang)
	e := newEnv(t)
	w := newWorkload(t, e)
	cfg := e.config("plug", "")
	out := filepath.Join(e.dir, "out.jsonl")
	pidFile := filepath.Join(e.dir, "plugin.pid")
	y, err := os.ReadFile(cfg)
	require.NoError(t, err)
	re := regexp.MustCompile(`(?s)  js:\n    type: nats_jetstream\n.*?duplicate_window: 1s\n`)
	require.Regexp(t, re, string(y))
	y = re.ReplaceAll(y, []byte(`  js:
    type: plugin
    config:
      command: `+plugin+`
      sha256: `+sum+`
      restart_initial: 50ms
      restart_max: 500ms
      config: { path: `+out+`, pid_file: `+pidFile+`, dedupe: `+strconv.FormatBool(dedupe)+` }
`))
	require.NoError(t, os.WriteFile(cfg, y, 0o644))

	// Every plugin process seen, killed at the end: one whose bridge was
	// killed lives on as an orphan.
	var pids sync.Map
	pluginPID := func() int {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return 0
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if pid > 0 {
			pids.Store(pid, true)
		}
		return pid
	}
	t.Cleanup(func() {
		pids.Range(func(k, _ any) bool { _ = syscall.Kill(k.(int), syscall.SIGKILL); return true })
	})

	var logs []fmt.Stringer // every bridge's output
	pluginKills, bridgeKills := 0, 0
	p := startProc(t, bin, cfg)
	logs = append(logs, p.out)
	t.Cleanup(func() { p.kill9(t) }) // the last one, should the test stop early
	waitSlotActive(t, e, "slot_plug")
	// The writers commit until every kill is done, each kill in the
	// middle of the stream: after the (restarted) bridge has delivered to
	// the (restarted) plugin again, at a random moment.
	done := make(chan struct{})
	go func() {
		w.run(t, 2, math.MaxInt, 5*time.Millisecond)()
		close(done)
	}()
	size := func() int64 {
		fi, err := os.Stat(out)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	delivering := func() {
		t.Helper()
		from, deadline := size(), time.Now().Add(time.Minute)
		for size() <= from {
			require.True(t, time.Now().Before(deadline), "nothing delivered to the plugin for a minute (%d plugin kills, %d bridge kills so far)", pluginKills, bridgeKills)
			time.Sleep(10 * time.Millisecond)
		}
	}
	for pluginKills < 4 || bridgeKills < 3 || w.total.Load() < 3000 {
		delivering()
		time.Sleep(time.Duration(rand.N(300)) * time.Millisecond)
		if pluginKills <= bridgeKills {
			pid := pluginPID()
			require.Positive(t, pid)
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL), "the plugin that delivers (pid %d)", pid)
			pluginKills++
		} else {
			p.kill9(t)
			bridgeKills++
			p = startProc(t, bin, cfg)
			logs = append(logs, p.out)
		}
	}
	w.stopped.Store(true)
	<-done
	t.Logf("killed the plugin %d times and the bridge %d times while %d changes were committed", pluginKills, bridgeKills, w.total.Load())

	read := func(n int) []msg {
		var ms []msg
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ms = readPluginFile(t, out)
			if len(ms) >= n || time.Now().After(deadline) {
				return ms
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	w.verifyStored(t, read)
	p.term(t)
	// What kept each change once: how often the plugin was found holding
	// changes the bridge did not know it held, when a run resumed (after
	// a plugin crash or a bridge restart) and before a Write.
	var all strings.Builder
	for _, l := range logs {
		all.WriteString(l.String())
	}
	t.Logf("%s (dedupe %t): the bridges saw %d plugin crashes; the plugin held changes past the checkpoint when a run resumed %d times, past the last write before a Write %d times",
		lang, dedupe, strings.Count(all.String(), "plugin crashed"), strings.Count(all.String(), "sink already holds changes past the checkpoint"),
		strings.Count(all.String(), "plugin holds part of the batch already"))
}

// readPluginFile reads an example plugin's file as messages.
func readPluginFile(t *testing.T, path string) []msg {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	end := bytes.LastIndexByte(data, '\n') + 1
	var ms []msg
	sc := bufio.NewScanner(bytes.NewReader(data[:end]))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var l struct {
			ID      string `json:"id"`
			Subject string `json:"subject"`
			Payload []byte `json:"payload"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
		_, pos, err := cdc.ParseID(l.ID)
		require.NoError(t, err)
		m := msg{Seq: uint64(len(ms) + 1), Subject: l.Subject, ID: l.ID, Pos: pos, Raw: l.Payload}
		m.Body, err = decodeBody(l.Payload)
		require.NoError(t, err, "%s: %s", l.ID, l.Payload)
		ms = append(ms, m)
	}
	return ms
}
