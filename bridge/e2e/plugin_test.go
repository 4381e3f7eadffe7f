package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
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
	"github.com/bridgecdc/bridge/sinks/pluginsink"
)

var (
	goSinkOnce sync.Once
	goSinkPath string
	goSinkErr  error
)

// goSink builds examples/plugins/go-sink once and returns its path and sha256.
func goSink(t *testing.T) (string, string) {
	t.Helper()
	goSinkOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bridge-go-sink-")
		if err != nil {
			goSinkErr = err
			return
		}
		goSinkPath = filepath.Join(dir, "go-sink")
		cmd := exec.Command("go", "build", "-o", goSinkPath, "./examples/plugins/go-sink")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			goSinkErr = err
			goSinkPath = string(out)
		}
	})
	require.NoError(t, goSinkErr, goSinkPath)
	sum, err := pluginsink.FileSHA256(goSinkPath)
	require.NoError(t, err)
	return goSinkPath, sum
}

// TestPluginCLI: `bridge plugin test` passes the example Go plugin and
// fails one whose destination cannot be written; `bridge plugins` lists a
// configured plugin with its guarantee, and names the fix for a wrong sha256.
func TestPluginCLI(t *testing.T) {
	t.Parallel()
	bin := bridgeBinary(t)
	plugin, sum := goSink(t)
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

	out, code := run("plugin", "test", plugin, "--plugin-config", `{"path": "`+filepath.Join(dir, "t.jsonl")+`"}`)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "--- PASS: TestPluginConformance/replay")
	require.Contains(t, out, "passed the conformance suite")

	out, code = run("plugin", "test", plugin, "--plugin-config", `{"path": "/nonexistent-dir/t.jsonl"}`)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "--- FAIL: TestPluginConformance")
	require.Contains(t, out, "failed the conformance suite")

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
	out, code = run("plugins", "-c", cfg)
	require.Equal(t, 0, code, out)
	require.Regexp(t, `(?m)^  file: "`+regexp.QuoteMeta(plugin)+`": go-sink 0\.1\.0, contract v1\.1, exactly once \(resumes\)`, out)

	bad := strings.Repeat("0", 64)
	write(bad)
	out, code = run("plugins", "-c", cfg)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `plugin sink "file" (`+plugin+`): the executable's sha256 is `+sum+`, but sinks.file.config.sha256 pins `+bad+`: if you trust this build, set sha256: `+sum)
}

// TestPluginKillMidStream streams into the example Go plugin while it is
// killed (SIGKILL, by the pid it writes) and the bridge is killed, each
// several times, and finds every committed change in the plugin's file
// exactly once, in commit order.
func TestPluginKillMidStream(t *testing.T) {
	t.Parallel()
	bin := bridgeBinary(t)
	plugin, sum := goSink(t)
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
      config: { path: `+out+`, pid_file: `+pidFile+`}
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

	p := startProc(t, bin, cfg)
	waitSlotActive(t, e, "slot_plug")
	done := make(chan struct{})
	go func() {
		w.run(t, 2, 6000, time.Millisecond)()
		close(done)
	}()
	pluginKills, bridgeKills := 0, 0
	for writing := true; writing || pluginKills < 4 || bridgeKills < 3; {
		time.Sleep(time.Duration(300+rand.N(700)) * time.Millisecond)
		if pluginKills <= bridgeKills {
			if pid := pluginPID(); pid > 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
				pluginKills++
			}
		} else {
			pluginPID()
			p.kill9(t)
			bridgeKills++
			p = startProc(t, bin, cfg)
		}
		select {
		case <-done:
			writing = false
		default:
		}
	}
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
}

// readPluginFile reads the go-sink's file as messages.
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
		require.NoError(t, json.Unmarshal(l.Payload, &m.Body))
		ms = append(ms, m)
	}
	return ms
}
