package wasm_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/wasm"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/syncbuf"
	"github.com/bridgecdc/bridge/internal/wasmtest"
)

func guest(t *testing.T) string {
	return wasmtest.GoModule(t, filepath.Join("testdata", "guest"))
}

func load(t *testing.T, kind wasm.Kind, path, fn string, mut ...func(*wasm.Config)) (*wasm.Module, error) {
	cfg := wasm.Config{At: "routes[0].wasm_x", Module: path, SHA256: wasmtest.SHA256(t, path), Function: fn}
	for _, f := range mut {
		f(&cfg)
	}
	return wasm.Load(t.Context(), kind, cfg)
}

const order = `{"op":"update","source":"shop","schema":"public","table":"orders","key":{"id":7},"after":{"id":7,"status":"%s","total":12.5}}`

func change(status string) []byte { return []byte(strings.Replace(order, "%s", status, 1)) }

// TestGoTransformExample runs examples/wasm/go-transform: the event it
// builds, a draft dropped, a total that is no number failed with the
// reason the module wrote to stderr; and many goroutines at once through
// the instance pool.
func TestGoTransformExample(t *testing.T) {
	t.Parallel()
	// A generous timeout: this machine may be busy, and the limit is
	// TestMisbehavingModules' subject.
	m, err := load(t, wasm.Transform, wasmtest.GoTransform(t), "", func(c *wasm.Config) { c.Timeout = time.Minute })
	require.NoError(t, err)

	body, keep, err := m.Transform(t.Context(), change("paid"), nil)
	require.NoError(t, err)
	require.True(t, keep)
	require.JSONEq(t, `{"event":"order.update","order_id":7,"status":"paid","total_cents":1250}`, string(body))

	_, keep, err = m.Transform(t.Context(), change("draft"), nil)
	require.NoError(t, err)
	require.False(t, keep, "a draft is dropped")

	bad := []byte(`{"op":"insert","key":{"id":8},"after":{"id":8,"status":"paid","total":"lots"}}`)
	_, _, err = m.Transform(t.Context(), bad, nil)
	require.ErrorContains(t, err, "transform failed the change (returned -1): reading the change")

	// The instance that returned an error serves the next change.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				st := "paid"
				if (g+i)%2 == 1 {
					st = "shipped"
				}
				body, keep, err := m.Transform(t.Context(), change(st), nil)
				if err == nil && (!keep || !bytes.Contains(body, []byte(`"status":"`+st+`"`))) {
					err = &json.UnsupportedValueError{Str: string(body)}
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestASFilterExample runs examples/wasm/as-filter: paid orders taken,
// others and deletes (no new row) rejected, and input that is not a JSON
// object failed with AssemblyScript's abort message.
func TestASFilterExample(t *testing.T) {
	t.Parallel()
	m, err := load(t, wasm.Filter, wasmtest.ASFilter(t), "")
	require.NoError(t, err)
	for in, want := range map[string]bool{
		string(change("paid")):    true,
		string(change("shipped")): false,
		`{"op":"delete","key":{"id":7},"before":{"id":7},"after":null}`:                                 false,
		`{"op":"insert","after":{"note":"status \"paid\"","nested":{"status":"paid"},"status":"paid"}}`: true,
		`{"op":"insert","after":{"nested":{"status":"paid"},"status":"draft"}}`:                         false,
	} {
		take, err := m.Filter(t.Context(), []byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, take, in)
	}
	_, err = m.Filter(t.Context(), []byte(`[1,2]`))
	require.ErrorContains(t, err, "filter abort: the change is not a JSON object (assembly/index.ts:")
	take, err := m.Filter(t.Context(), change("paid"))
	require.NoError(t, err, "a fresh instance replaces the aborted one")
	require.True(t, take)
}

// TestMisbehavingModules: each way a module can fail a call gives one
// error naming the module, the function and the fix, and the next call
// runs in a fresh instance.
func TestMisbehavingModules(t *testing.T) {
	t.Parallel()
	path := guest(t)
	for _, tc := range []struct {
		name, fn string
		kind     wasm.Kind
		want     string
	}{
		{"timeout", "loop", wasm.Filter, "loop ran past its timeout (50ms) and was stopped; make it faster, or raise timeout"},
		{"memory", "hog", wasm.Filter, "hog trapped: wasm error: unreachable: fatal error: out of memory; its memory is near max_memory_mib (16 MiB): raise it, or make the module use less"},
		{"panic", "boom", wasm.Filter, "boom trapped: wasm error: unreachable: panic: boom on a change of"},
		{"filter result", "seven", wasm.Filter, "seven returned 7 (1 takes the change, 0 rejects it, anything else fails it)"},
		{"not json", "notjson", wasm.Transform, `notjson returned "hello", and a transform must return a JSON object (or 0 to drop the change)`},
		{"refused", "refuse", wasm.Transform, "refuse failed the change (returned -1): refused: the order has no customer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := load(t, tc.kind, path, tc.fn, func(c *wasm.Config) {
				c.Timeout, c.MaxMemory = time.Minute, 16<<20 // no wall-clock limit but the one under test
				if tc.fn == "loop" {
					c.Timeout = 50 * time.Millisecond
				}
			})
			require.NoError(t, err)
			for range 2 { // the second call runs in a fresh instance (or the same one, after an error result)
				var err error
				if tc.kind == wasm.Filter {
					_, err = m.Filter(t.Context(), change("paid"))
				} else {
					_, _, err = m.Transform(t.Context(), change("paid"), nil)
				}
				require.ErrorContains(t, err, "wasm module "+path+": ")
				require.ErrorContains(t, err, tc.want)
			}
		})
	}
	m, err := load(t, wasm.Transform, path, "drop")
	require.NoError(t, err)
	_, keep, err := m.Transform(t.Context(), change("paid"), nil)
	require.NoError(t, err)
	require.False(t, keep)
}

// TestLoadErrors: a module the bridge cannot run is refused when it loads,
// at the YAML path of the key to fix.
func TestLoadErrors(t *testing.T) {
	t.Parallel()
	path := guest(t)
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.wasm")
	require.NoError(t, os.WriteFile(junk, []byte("not wasm"), 0o644))
	// A module that exports only bridge_abi_v2, a function doing nothing.
	v2 := filepath.Join(dir, "v2.wasm")
	require.NoError(t, os.WriteFile(v2, slices.Concat([]byte("\x00asm\x01\x00\x00\x00"),
		[]byte{0x01, 0x04, 0x01, 0x60, 0x00, 0x00},                                  // types: () -> ()
		[]byte{0x03, 0x02, 0x01, 0x00},                                              // functions: one of type 0
		[]byte{0x07, 0x11, 0x01, 0x0d}, []byte("bridge_abi_v2"), []byte{0x00, 0x00}, // export it
		[]byte{0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b}), 0o644)) // its body: end
	for _, tc := range []struct {
		name  string
		kind  wasm.Kind
		cfg   wasm.Config
		field string
		want  string
	}{
		{"missing", wasm.Filter, wasm.Config{Module: filepath.Join(dir, "nope.wasm")}, "module", "reading the module: open " + dir},
		{"checksum", wasm.Filter, wasm.Config{Module: path, SHA256: strings.Repeat("0", 64)}, "sha256", "has sha256 " + wasmtest.SHA256(t, path) + `, not the pinned "000`},
		{"not wasm", wasm.Filter, wasm.Config{Module: junk, SHA256: wasmtest.SHA256(t, junk)}, "module", "is not a WebAssembly module the bridge can run: invalid magic number"},
		{"another version", wasm.Filter, wasm.Config{Module: v2, SHA256: wasmtest.SHA256(t, v2)}, "module", "speaks version 2 of the bridge's WASM contract (it exports bridge_abi_v2), and this bridge speaks version 1 (bridge_abi_v1): build the module for version 1, or run a bridge that speaks 2"},
		{"no export", wasm.Filter, wasm.Config{Module: path, SHA256: wasmtest.SHA256(t, path)}, "module", `does not export "filter" (exports: _initialize, alloc, badfilter, boom, bridge_abi_v1,`},
		{"signature", wasm.Filter, wasm.Config{Module: path, SHA256: wasmtest.SHA256(t, path), Function: "badfilter"}, "module", `exports "badfilter" as (i32) -> (i32), want (i32, i32) -> (i32)`},
		{"transform signature", wasm.Transform, wasm.Config{Module: path, SHA256: wasmtest.SHA256(t, path), Function: "seven"}, "module", `exports "seven" as (i32, i32) -> (i32), want (i32, i32) -> (i64)`},
		{"too much memory", wasm.Filter, wasm.Config{Module: path, SHA256: wasmtest.SHA256(t, path), Function: "seven", MaxMemory: 5 << 30}, "max_memory_mib", "must be at most 4096"},
		{"too little memory", wasm.Filter, wasm.Config{Module: path, SHA256: wasmtest.SHA256(t, path), Function: "seven", MaxMemory: 1 << 20}, "max_memory_mib", "needs more memory than 1 MiB when it starts (section memory: min 38 pages (2 Mi) over limit of 16 pages (1 Mi)); raise max_memory_mib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.At = "routes[3].wasm_filter"
			_, err := wasm.Load(t.Context(), tc.kind, tc.cfg)
			var fe *config.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, "routes[3].wasm_filter."+tc.field, fe.Path)
			require.Contains(t, fe.Msg, tc.want)
		})
	}
}

// TestOutputLogged: what a module prints during a call reaches the log.
func TestOutputLogged(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	path := guest(t)
	m, err := load(t, wasm.Transform, path, "echo", func(c *wasm.Config) {
		c.Log = slog.New(slog.NewTextHandler(&buf, nil))
	})
	require.NoError(t, err)
	in := change("paid")
	body, keep, err := m.Transform(t.Context(), in, []byte("prefix:"))
	require.NoError(t, err)
	require.True(t, keep)
	require.Equal(t, "prefix:"+string(in), string(body), "the body is appended to dst")
	require.Contains(t, buf.String(), `msg="wasm module output" module=`+path+` stream=stdout line="echo called"`)
}

type syncBuffer = syncbuf.Buffer
