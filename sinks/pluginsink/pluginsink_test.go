package pluginsink_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/examples/plugins/exampleplugins"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/pluginsink"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

// self returns this test binary and its sha256: the plugin executable.
func self(t *testing.T) (string, string) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	sum, err := pluginsink.FileSHA256(exe)
	require.NoError(t, err)
	return exe, sum
}

// block is a sink's config block running this binary in mode.
func block(t *testing.T, mode string, env map[string]string, cfg map[string]any) map[string]any {
	exe, sum := self(t)
	e := map[string]any{"PLUGINSINK_TEST_MODE": mode}
	for k, v := range env {
		e[k] = v
	}
	return map[string]any{"command": exe, "sha256": sum, "env": e, "config": cfg,
		"restart_initial": "10ms", "restart_max": "50ms"}
}

func build(t *testing.T, name string, raw map[string]any) (sinks.Sink, error) {
	t.Helper()
	p, err := sinks.Default.Lookup(pluginsink.Type)
	require.NoError(t, err)
	s, err := p.New((*config.Config)(nil).Decoder("sinks."+name+".config", raw), sinks.Env{Name: name})
	if s != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.Close(ctx)
		})
	}
	return s, err
}

func TestConformance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	raw := block(t, "filesink", nil, map[string]any{"path": path})
	y, err := yaml.Marshal(raw)
	require.NoError(t, err)
	reader, err := pluginsink.Start(decoded(t, raw), sinks.Env{Name: "reader"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reader.Close(context.Background()) })
	require.True(t, reader.Describe().GetResumes())
	sinktest.Run(t, sinktest.Harness{
		Type:    pluginsink.Type,
		YAML:    string(y),
		Dedupes: true,
		Read: func(t *testing.T) []sinktest.Received {
			recs, err := reader.Read(t.Context())
			require.NoError(t, err)
			out := make([]sinktest.Received, len(recs))
			for i, r := range recs {
				out[i] = sinktest.Received{ID: r.GetId(), Subject: r.GetSubject(), Payload: r.GetPayload(), Headers: r.GetHeaders()}
				if out[i].Headers == nil {
					out[i].Headers = map[string]string{}
				}
			}
			return out
		},
		Break: func(t *testing.T) { require.NoError(t, reader.Break(t.Context())) },
		Heal:  func(t *testing.T) { require.NoError(t, reader.Heal(t.Context())) },
	})
}

func decoded(t *testing.T, raw map[string]any) pluginsink.Config {
	cfg := pluginsink.DefaultConfig()
	require.NoError(t, (*config.Config)(nil).Decoder("sinks.x.config", raw)(&cfg))
	return cfg
}

// deliver drives s as the pipeline does: a failed Write is retried (the
// listed indexes, or all) after Connect, until everything is delivered.
func deliver(t *testing.T, s sinks.Sink, batch []cdc.Change) error {
	t.Helper()
	pending := batch
	for tries := 0; len(pending) > 0; tries++ {
		require.Less(t, tries, 50, "still failing")
		err := s.Write(t.Context(), pending)
		if err == nil {
			return nil
		}
		if sinks.IsPermanent(err) {
			return err
		}
		var be *sinks.BatchError
		if errors.As(err, &be) {
			var rest []cdc.Change
			for _, i := range be.Indexes() {
				rest = append(rest, pending[i])
			}
			pending = rest
		}
		if err := s.Connect(t.Context()); err != nil {
			if sinks.IsPermanent(err) {
				return err
			}
		}
	}
	return nil
}

// TestCrashExactlyOnce: the plugin exits in the middle of Writes (having
// written half of the batch); the sink restarts it and the retry writes
// what was not acknowledged again, with the same ids. With dedupe: false
// the plugin itself would write the half it had twice: it is the sink's
// question after the restart (Delivered past the last cursor) that keeps
// every change once.
func TestCrashExactlyOnce(t *testing.T) {
	for _, dedupe := range []bool{false, true} {
		t.Run("dedupe="+map[bool]string{false: "false", true: "true"}[dedupe], func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "out.jsonl")
			marks := t.TempDir()
			raw := block(t, "crash", map[string]string{"PLUGINSINK_CRASH_AFTER": "25", "PLUGINSINK_CRASH_MARK": marks},
				map[string]any{"path": path, "dedupe": dedupe})
			s, err := build(t, "crashy", raw)
			require.NoError(t, err)
			_, resumes := s.(sinks.Resumer)
			require.True(t, resumes, "the plugin resumes: the sink must be a sinks.Resumer")
			require.NoError(t, s.Connect(t.Context()))
			all := sinktest.Changes(120, "shop.main.e1")
			for i := 0; i < len(all); i += 10 {
				require.NoError(t, deliver(t, s, all[i:i+10]))
			}
			crashes, err := os.ReadDir(marks)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(crashes), 3, "the plugin crashed mid-write at least 3 times")

			data, err := os.ReadFile(path)
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			var ids []string
			for _, l := range lines {
				var rec struct{ ID string }
				require.NoError(t, yaml.Unmarshal([]byte(l), &rec))
				ids = append(ids, rec.ID)
			}
			want := make([]string, len(all))
			for i := range all {
				want[i] = all[i].ID()
			}
			require.Equal(t, want, ids, "every change once, in order")
		})
	}
}

// TestWriteTimeoutAsksFirst: a Write whose deadline passes while the
// plugin has written the batch (or is still writing it) fails, though the
// plugin holds the batch; the retry asks the plugin what it holds
// (Delivered) and does not send it again. The plugin does not dedupe
// (dedupe: false), so only that question keeps each change once.
func TestWriteTimeoutAsksFirst(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "written before the deadline", true: "written after the deadline"}[late], func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.jsonl")
			env := map[string]string{"PLUGINSINK_SLOW_AFTER": "10", "PLUGINSINK_SLOW_DELAY": "1s"}
			if late {
				env["PLUGINSINK_SLOW_LATE"] = "1"
			}
			s, err := build(t, "slow", block(t, "slow", env, map[string]any{"path": path, "dedupe": false}))
			require.NoError(t, err)
			require.NoError(t, s.Connect(t.Context()))
			all := sinktest.Changes(30, "shop.main.e1")
			require.NoError(t, s.Write(t.Context(), all[:10]))

			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			err = s.Write(ctx, all[10:20])
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.NotErrorIs(t, err, sinks.ErrNotConnected, "a timeout is not a crash")

			require.NoError(t, s.Write(t.Context(), all[10:20]), "the retry")
			require.NoError(t, s.Write(t.Context(), all[20:]))
			require.Equal(t, ids(all), fileIDs(t, path), "every change once, in order")
		})
	}
}

// TestWriteTimeoutRestartsAHungPlugin: a plugin that does not answer a
// Write within write_timeout is hung: the Write fails as a crash does
// (not connected), the process is stopped, and after Connect starts it
// again the batch goes to the new process, which is asked first what it
// holds: every change once, in order, whether the hung process wrote the
// batch before hanging or never did (dedupe: false: only that question
// keeps each change once).
func TestWriteTimeoutRestartsAHungPlugin(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "hung after writing", true: "hung before writing"}[late], func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.jsonl")
			env := map[string]string{"PLUGINSINK_SLOW_AFTER": "10", "PLUGINSINK_SLOW_DELAY": "1h"}
			if late {
				env["PLUGINSINK_SLOW_LATE"] = "1"
			}
			raw := block(t, "slow", env, map[string]any{"path": path, "dedupe": false})
			raw["write_timeout"] = "300ms"
			s, err := build(t, "hung", raw)
			require.NoError(t, err)
			require.NoError(t, s.Connect(t.Context()))
			all := sinktest.Changes(30, "shop.main.e1")
			require.NoError(t, s.Write(t.Context(), all[:10]))

			err = s.Write(t.Context(), all[10:20])
			require.ErrorIs(t, err, sinks.ErrNotConnected, "a hung plugin is restarted like a crashed one")
			require.ErrorContains(t, err, "did not answer within write_timeout (300ms) writing 10 changes")

			require.NoError(t, s.Connect(t.Context()), "a new process")
			require.NoError(t, s.Write(t.Context(), all[10:]), "the retry, and the rest")
			require.Equal(t, ids(all), fileIDs(t, path), "every change once, in order")
		})
	}
}

func ids(cs []cdc.Change) []string {
	out := make([]string, len(cs))
	for i := range cs {
		out[i] = cs[i].ID()
	}
	return out
}

// fileIDs returns the ids of the lines of a filesink's file, in order.
func fileIDs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct{ ID string }
		require.NoError(t, json.Unmarshal([]byte(l), &rec))
		out = append(out, rec.ID)
	}
	return out
}

// TestBadPlugins: each bad plugin gets one error line naming the plugin
// and the fix.
func TestBadPlugins(t *testing.T) {
	exe, sum := self(t)
	other := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name      string
		raw       map[string]any
		permanent bool
		want      []string
	}{
		{"checksum", map[string]any{"command": exe, "sha256": other, "env": map[string]any{"PLUGINSINK_TEST_MODE": "filesink"}}, true,
			[]string{`plugin sink "checksum" (` + exe + `)`, "sha256 is " + sum, "pins " + other, "set sha256: " + sum}},
		{"version", block(t, "version99", nil, map[string]any{"path": "/dev/null"}), true,
			[]string{`plugin sink "version"`, "another version of the plugin contract", "rebuild the plugin against bridge.plugin.v1"}},
		{"garbage", block(t, "garbage", nil, nil), true,
			[]string{`plugin sink "garbage"`, "not a bridge plugin", "pluginv1.Serve"}},
		{"missing", map[string]any{"command": "/nonexistent/plugin", "sha256": other}, true,
			[]string{`plugin sink "missing" (/nonexistent/plugin)`, "set sinks.missing.config.command"}},
		{"config", block(t, "filesink", nil, map[string]any{"pathh": "x"}), true,
			[]string{"sinks.config.config.config.pathh", "unknown key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(t, tc.name, tc.raw)
			require.Error(t, err)
			t.Log(err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.Equal(t, tc.permanent, sinks.IsPermanent(err) || isConfigErr(err))
			if tc.name != "config" {
				require.NotContains(t, err.Error(), "\n", "one line")
			}
		})
	}
}

func isConfigErr(err error) bool {
	var fe *config.FieldError
	return errors.As(err, &fe)
}

// TestCrashLoop: a plugin that crashes at every Write ends the sink with
// one permanent error after max_crashes restarts.
func TestCrashLoop(t *testing.T) {
	raw := block(t, "crash", map[string]string{"PLUGINSINK_CRASH_AFTER": "0"}, map[string]any{"path": filepath.Join(t.TempDir(), "o.jsonl")})
	raw["max_crashes"] = 3
	s, err := build(t, "loopy", raw)
	require.NoError(t, err)
	require.NoError(t, s.Connect(t.Context()))
	start := time.Now()
	err = deliver(t, s, sinktest.Changes(100, "shop.main.e1"))
	require.Error(t, err)
	t.Log(err)
	require.True(t, sinks.IsPermanent(err))
	require.Contains(t, err.Error(), `plugin sink "loopy"`)
	require.Contains(t, err.Error(), "crashed 3 times in a row")
	require.Contains(t, err.Error(), "bridge plugin test")
	require.NotContains(t, err.Error(), "\n")
	require.Less(t, time.Since(start), 20*time.Second)
}

// TestLargeWrite: a batch past gRPC's default 4 MiB message limit (a
// change of 4.5 MiB among small ones) reaches the plugin, whatever its
// language.
func TestLargeWrite(t *testing.T) {
	for _, lang := range append([]string{"self"}, exampleplugins.Languages...) {
		t.Run(lang, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out.jsonl")
			raw := block(t, "filesink", nil, map[string]any{"path": path})
			if lang != "self" {
				exe, err := exampleplugins.Build(lang)
				require.NoError(t, err)
				sum, err := pluginsink.FileSHA256(exe)
				require.NoError(t, err)
				raw["command"], raw["sha256"] = exe, sum
			}
			s, err := build(t, "large", raw)
			require.NoError(t, err)
			require.NoError(t, s.Connect(t.Context()))
			all := sinktest.Changes(10, "shop.main.e1")
			all[5].Payload = []byte(`"` + strings.Repeat("x", 9<<19) + `"`)
			require.NoError(t, s.Write(t.Context(), all))
			require.Equal(t, ids(all), fileIDs(t, path))
		})
	}
}

// TestPluginEnvironment: a plugin gets from the bridge's environment only
// what finding programs and the locale need (PATH, HOME, LANG, TZ, ...),
// its configured env (which wins over those) and go-plugin's handshake;
// nothing else of the bridge's environment, where its secrets are.
func TestPluginEnvironment(t *testing.T) {
	t.Setenv("BRIDGE_SOURCES__APP__CONFIG__DSN", "postgres://bridge:s3cret@db/app")
	t.Setenv("PG_PASSWORD", "s3cret")
	t.Setenv("TZ", "Europe/Paris")
	require.NotEmpty(t, os.Getenv("PATH"))
	out := filepath.Join(t.TempDir(), "env")
	s, err := build(t, "envsink", block(t, "env", map[string]string{"PLUGINSINK_ENV_OUT": out, "TZ": "UTC"},
		map[string]any{"path": filepath.Join(t.TempDir(), "o.jsonl")}))
	require.NoError(t, err)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	env := strings.Split(string(b), "\n")

	// Its socket's directory: its own, reachable by the bridge's user
	// only, gone once it stops.
	var sockDir string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PLUGIN_UNIX_SOCKET_DIR="); ok {
			sockDir = v
		}
	}
	require.NotEmpty(t, sockDir, "PLUGIN_UNIX_SOCKET_DIR")
	st, err := os.Stat(sockDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	ents, err := os.ReadDir(sockDir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "the plugin's socket")
	require.Equal(t, os.ModeSocket, ents[0].Type())
	require.NoError(t, s.Close(t.Context()))
	require.NoDirExists(t, sockDir)
	for _, kv := range env {
		require.NotContains(t, kv, "s3cret", "the bridge's secrets stay out of the plugin's environment")
	}
	require.Contains(t, env, "PATH="+os.Getenv("PATH"))
	require.Contains(t, env, "TZ=UTC", "the configured env wins")
	require.NotContains(t, env, "TZ=Europe/Paris")
	require.Contains(t, env, "PLUGINSINK_TEST_MODE=env")
	require.Contains(t, env, "BRIDGE_PLUGIN_MAGIC_COOKIE=bridge-sink-plugin-7c5f1e2a")
}
