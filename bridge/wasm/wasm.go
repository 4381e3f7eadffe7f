package wasm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf16"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/bridgecdc/bridge/config"
)

// Kind is what a module's function does with a change.
type Kind int

const (
	// Filter: (ptr, len i32) -> i32, 1 takes the change, 0 rejects it.
	Filter Kind = iota
	// Transform: (ptr, len i32) -> i64, the new body, a drop or an error.
	Transform
)

func (k Kind) String() string { return [...]string{"filter", "transform"}[k] }

// ABIExport is the export that declares the version of the contract a
// module speaks (doc.go); the bridge speaks version 1 only.
const ABIExport = "bridge_abi_v1"

// Defaults of Config's limits.
const (
	DefaultTimeout   = time.Second
	DefaultMaxMemory = 64 << 20
	// startTimeout bounds an instance's start (_initialize).
	startTimeout = 10 * time.Second
	// maxOutput bounds what one call's stdout and stderr keep, each.
	maxOutput = 4 << 10
)

// Config is what Load needs: config.WASM, resolved.
type Config struct {
	// At is the YAML path of the module's block, "routes[0].wasm_filter":
	// every error Load returns is a *config.FieldError under it.
	At string
	// Module is the path of the .wasm file; SHA256 its pinned sum (hex).
	Module, SHA256 string
	// Function is the export to call; "" is the kind's name.
	Function string
	// Timeout bounds one call; 0 is DefaultTimeout.
	Timeout time.Duration
	// MaxMemory caps an instance's memory in bytes (rounded up to 64 KiB
	// pages); 0 is DefaultMaxMemory.
	MaxMemory int64
	// Log receives what the module writes to stdout and stderr; nil
	// discards it.
	Log *slog.Logger
	// CacheDir keeps the compiled code across restarts (a Go module takes
	// seconds to compile); "" compiles once per process.
	CacheDir string
}

// memCache holds the modules compiled without a CacheDir, dirCaches
// (dir → wazero.CompilationCache) those with one: a module loaded again (a
// reload, another source's routes) is not compiled again, and with a
// CacheDir not after a restart either. They grow only by the modules a
// configuration names.
var (
	memCache  = wazero.NewCompilationCache()
	dirCaches sync.Map
)

// cacheFor returns the compilation cache of dir; the in-memory one when dir
// is "" or cannot be made.
func cacheFor(dir string) wazero.CompilationCache {
	if dir == "" {
		return memCache
	}
	if c, ok := dirCaches.Load(dir); ok {
		return c.(wazero.CompilationCache)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return memCache
	}
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		return memCache
	}
	actual, _ := dirCaches.LoadOrStore(dir, c)
	return actual.(wazero.CompilationCache)
}

// Module is a loaded module: compiled once, called through a pool of
// instances. Safe for concurrent use.
type Module struct {
	kind    Kind
	path    string
	fn      string
	timeout time.Duration
	maxMem  uint32 // bytes, a whole number of pages
	log     *slog.Logger
	// interpreted: the process may not map executable memory, so the
	// module runs in wazero's interpreter instead of compiled.
	interpreted bool

	rt   wazero.Runtime
	cm   wazero.CompiledModule
	idle chan *instance
}

// instance is one instantiation of a Module, used by one call at a time.
type instance struct {
	mod       api.Module
	mem       api.Memory
	alloc, fn api.Function
	stack     [2]uint64
	// buf and bufLen are the buffer alloc returned last and the size it
	// was asked for: a change that fits is written there without a call.
	buf, bufLen uint32
	stdout      capture
	stderr      capture
	lastErr     string // what the last call wrote to stderr
}

// capture keeps the first maxOutput bytes written to it.
type capture struct{ bytes.Buffer }

func (c *capture) Write(p []byte) (int, error) {
	if room := maxOutput - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// abortError is AssemblyScript's abort(message, file, line, column).
type abortError struct{ msg string }

func (e *abortError) Error() string { return e.msg }

// Load reads, checks and compiles the module cfg names and starts one
// instance: the file must exist and match cfg.SHA256, speak version 1 of
// the contract, export alloc, memory and the function with the kind's
// signature, import nothing but WASI preview 1 and env.abort, and start
// (its _initialize) without trapping. Each problem is a
// *config.FieldError naming the key under cfg.At and the fix.
func Load(ctx context.Context, kind Kind, cfg Config) (*Module, error) {
	ferr := func(key, format string, args ...any) error {
		return &config.FieldError{Path: cfg.At + "." + key, Msg: fmt.Sprintf(format, args...)}
	}
	fn := cfg.Function
	if fn == "" {
		fn = kind.String()
	}
	b, err := os.ReadFile(cfg.Module)
	if err != nil {
		return nil, ferr("module", "reading the module: %v; build it, or correct the path", err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); !strings.EqualFold(got, cfg.SHA256) {
		return nil, ferr("sha256", "%s has sha256 %s, not the pinned %q; pin the new sum if the module was rebuilt on purpose", cfg.Module, got, cfg.SHA256)
	}
	m := &Module{kind: kind, path: cfg.Module, fn: fn, timeout: cfg.Timeout, log: cfg.Log,
		idle: make(chan *instance, 2*runtime.GOMAXPROCS(0))}
	if m.timeout <= 0 {
		m.timeout = DefaultTimeout
	}
	maxMem := cfg.MaxMemory
	if maxMem <= 0 {
		maxMem = DefaultMaxMemory
	}
	pages := (maxMem + 65535) / 65536
	if pages > 65536 {
		return nil, ferr("max_memory_mib", "must be at most 4096 (a 32-bit module's memory), got %d", maxMem>>20)
	}
	m.maxMem = uint32(pages * 65536)
	rc := wazero.NewRuntimeConfig()
	if err := execMemoryAllowed(); err != nil {
		// wazero's compiler maps the machine code it makes executable, which
		// systemd's MemoryDenyWriteExecute (prctl PR_SET_MDWE) refuses, and
		// wazero panics then: run the module interpreted instead.
		m.interpreted = true
		rc = wazero.NewRuntimeConfigInterpreter()
		if m.log != nil {
			m.log.Warn("this process may not map executable memory, so the WebAssembly module runs in wazero's interpreter, several times slower than compiled; "+
				"allow it (systemd: MemoryDenyWriteExecute=no) to compile the module", "at", cfg.At, "module", cfg.Module, "err", err)
		}
	}
	m.rt = wazero.NewRuntimeWithConfig(ctx, rc.
		WithCompilationCache(cacheFor(cfg.CacheDir)).
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(uint32(pages)))
	ok := false
	defer func() {
		if !ok {
			m.rt.Close(context.Background())
		}
	}()
	if m.cm, err = m.rt.CompileModule(ctx, b); err != nil {
		if strings.Contains(err.Error(), "over limit of") { // its declared minimum memory
			return nil, ferr("max_memory_mib", "%s needs more memory than %d MiB when it starts (%v); raise max_memory_mib", cfg.Module, m.maxMem>>20, firstLine(err))
		}
		return nil, ferr("module", "%s is not a WebAssembly module the bridge can run: %v", cfg.Module, firstLine(err))
	}
	if msg := m.checkImports(); msg != "" {
		return nil, ferr("module", "%s %s", cfg.Module, msg)
	}
	if msg := m.checkExports(); msg != "" {
		return nil, ferr("module", "%s %s", cfg.Module, msg)
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, m.rt); err != nil {
		return nil, fmt.Errorf("%s: starting WASI: %w", cfg.At, err)
	}
	if _, err := m.rt.NewHostModuleBuilder("env").NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(asAbort), []api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, nil).
		Export("abort").Instantiate(ctx); err != nil {
		return nil, fmt.Errorf("%s: starting env: %w", cfg.At, err)
	}
	in, err := m.start(ctx)
	if err != nil {
		return nil, ferr("module", "%v", err)
	}
	m.put(in)
	ok = true
	// The runtime holds the compiled code and the instances: closed when
	// the Module is no longer used (a router replaced by a reload).
	runtime.AddCleanup(m, func(rt wazero.Runtime) { rt.Close(context.Background()) }, m.rt)
	return m, nil
}

// checkImports returns what is wrong with the module's imports, or "".
func (m *Module) checkImports() string {
	for _, f := range m.cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod == wasi_snapshot_preview1.ModuleName || (mod == "env" && name == "abort") {
			continue
		}
		return fmt.Sprintf("imports %s.%s, which the bridge does not provide (it gives WASI preview 1 and AssemblyScript's env.abort); build the module without it (AssemblyScript: no Math.random or trace, or --use for them)", mod, name)
	}
	if len(m.cm.ImportedMemories()) > 0 {
		return "imports its memory; build it to export its own memory"
	}
	return ""
}

// checkExports returns what is wrong with the module's exports, or "".
func (m *Module) checkExports() string {
	fns := m.cm.ExportedFunctions()
	if _, ok := fns[ABIExport]; !ok {
		for n := range fns {
			if v, ok := strings.CutPrefix(n, "bridge_abi_v"); ok {
				return fmt.Sprintf("speaks version %s of the bridge's WASM contract (it exports %s), and this bridge speaks version 1 (%s): build the module for version 1, or run a bridge that speaks %s", v, n, ABIExport, v)
			}
		}
		return fmt.Sprintf("does not export %s: it is not a bridge module, or it speaks another version of the contract; the bridge speaks version 1 (docs/plugins.md)", ABIExport)
	}
	if _, ok := m.cm.ExportedMemories()["memory"]; !ok {
		return "does not export its memory as \"memory\""
	}
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	want := map[string][2][]api.ValueType{"alloc": {{i32}, {i32}}}
	if m.kind == Filter {
		want[m.fn] = [2][]api.ValueType{{i32, i32}, {i32}}
	} else {
		want[m.fn] = [2][]api.ValueType{{i32, i32}, {i64}}
	}
	for _, name := range []string{"alloc", m.fn} {
		sig := want[name]
		f, ok := fns[name]
		if !ok {
			return fmt.Sprintf("does not export %q (exports: %s); set function to the export that is the %s", name, exportNames(fns), m.kind)
		}
		if !slices.Equal(f.ParamTypes(), sig[0]) || !slices.Equal(f.ResultTypes(), sig[1]) {
			return fmt.Sprintf("exports %q as %s, want %s", name, signature(f.ParamTypes(), f.ResultTypes()), signature(sig[0], sig[1]))
		}
	}
	return ""
}

func exportNames(fns map[string]api.FunctionDefinition) string {
	names := make([]string, 0, len(fns))
	for n := range fns {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func signature(params, results []api.ValueType) string {
	name := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return strings.Join(s, ", ")
	}
	return "(" + name(params) + ") -> (" + name(results) + ")"
}

// asAbort is AssemblyScript's env.abort: it fails the call with the
// message, the file, line and column.
func asAbort(_ context.Context, mod api.Module, stack []uint64) {
	msg := asString(mod.Memory(), uint32(stack[0]))
	if file := asString(mod.Memory(), uint32(stack[1])); file != "" {
		msg = fmt.Sprintf("%s (%s:%d:%d)", msg, file, uint32(stack[2]), uint32(stack[3]))
	}
	panic(&abortError{msg: "abort: " + msg})
}

// asString reads an AssemblyScript string: UTF-16LE, its length in bytes
// in the four bytes before it.
func asString(mem api.Memory, ptr uint32) string {
	if ptr < 4 || mem == nil {
		return ""
	}
	n, ok := mem.ReadUint32Le(ptr - 4)
	if !ok || n > 1024 {
		n = min(n, 1024)
	}
	b, ok := mem.Read(ptr, n&^1)
	if !ok {
		return ""
	}
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return string(utf16.Decode(u))
}

// start instantiates the module once more.
func (m *Module) start(ctx context.Context) (*instance, error) {
	in := &instance{}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	mod, err := m.rt.InstantiateModule(ctx, m.cm, wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions("_initialize", "_start").
		WithStdout(&in.stdout).WithStderr(&in.stderr).
		WithSysWalltime().WithSysNanotime().WithRandSource(rand.Reader))
	if err != nil {
		if code, ok := exitCode(err); ok && code == 0 {
			return nil, fmt.Errorf("%s exits when it starts (a command's main, not a reactor): build it as a reactor (Go: -buildmode=c-shared)", m.path)
		}
		m.flush(in)
		return nil, fmt.Errorf("%s fails to start: %s%s", m.path, firstLine(err), m.reason(in))
	}
	in.mod, in.mem = mod, mod.Memory()
	in.alloc, in.fn = mod.ExportedFunction("alloc"), mod.ExportedFunction(m.fn)
	m.flush(in)
	return in, nil
}

func exitCode(err error) (uint32, bool) {
	var ee *sys.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), true
	}
	return 0, false
}

// get takes an idle instance, or starts one.
func (m *Module) get(ctx context.Context) (*instance, error) {
	select {
	case in := <-m.idle:
		return in, nil
	default:
		return m.start(ctx)
	}
}

// put returns in to the pool, or closes it when the pool is full.
func (m *Module) put(in *instance) {
	select {
	case m.idle <- in:
	default:
		in.mod.Close(context.Background())
	}
}

// Filter calls the module's filter with change: true takes it.
func (m *Module) Filter(ctx context.Context, change []byte) (bool, error) {
	in, r, err := m.call(ctx, change)
	if err != nil {
		return false, err
	}
	defer m.put(in)
	switch int32(r) {
	case 1:
		return true, nil
	case 0:
		return false, nil
	}
	return false, fmt.Errorf("wasm module %s: %s returned %d (1 takes the change, 0 rejects it, anything else fails it)%s",
		m.path, m.fn, int32(r), m.reason(in))
}

// Transform calls the module's transform with change and appends the new
// body to dst. keep is false when the module drops the change. The body
// must be a JSON object.
func (m *Module) Transform(ctx context.Context, change, dst []byte) (body []byte, keep bool, err error) {
	in, r, err := m.call(ctx, change)
	if err != nil {
		return nil, false, err
	}
	defer m.put(in)
	res := int64(r)
	switch {
	case res == 0:
		return dst, false, nil
	case res < 0:
		return nil, false, fmt.Errorf("wasm module %s: %s failed the change (returned %d)%s", m.path, m.fn, res, m.reason(in))
	}
	ptr, n := uint32(res>>32), uint32(res)
	out, ok := in.mem.Read(ptr, n)
	if !ok {
		return nil, false, fmt.Errorf("wasm module %s: %s returned a body at %#x, %d bytes, outside its memory (%d bytes)", m.path, m.fn, ptr, n, in.mem.Size())
	}
	if !isObject(out) {
		return nil, false, fmt.Errorf("wasm module %s: %s returned %s, and a transform must return a JSON object (or 0 to drop the change)", m.path, m.fn, quoteStart(out))
	}
	return append(dst, out...), true, nil
}

// call runs the module's function on change in an instance, and returns
// the instance (which the caller puts back) and the function's result.
func (m *Module) call(ctx context.Context, change []byte) (*instance, uint64, error) {
	in, err := m.get(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("wasm module %s: %w", m.path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	if in.bufLen < uint32(len(change)) || in.buf == 0 {
		in.stack[0] = uint64(len(change))
		if err := in.alloc.CallWithStack(ctx, in.stack[:]); err != nil {
			return nil, 0, m.failed(in, "alloc", err)
		}
		in.buf, in.bufLen = uint32(in.stack[0]), uint32(len(change))
	}
	ptr := in.buf
	if !in.mem.Write(ptr, change) || (ptr == 0 && len(change) > 0) {
		err := fmt.Errorf("wasm module %s: alloc(%d) returned %#x, not a buffer in its memory (%d bytes)", m.path, len(change), ptr, in.mem.Size())
		m.discard(in)
		return nil, 0, err
	}
	in.stack[0], in.stack[1] = uint64(ptr), uint64(len(change))
	if err := in.fn.CallWithStack(ctx, in.stack[:]); err != nil {
		return nil, 0, m.failed(in, m.fn, err)
	}
	m.flush(in)
	return in, in.stack[0], nil
}

// failed makes the error of a call of fn that trapped, exited or ran out
// of time, and discards the instance.
func (m *Module) failed(in *instance, fn string, err error) error {
	m.flush(in)
	defer in.mod.Close(context.Background())
	var ab *abortError
	var what string
	code, exited := exitCode(err)
	switch {
	case exited && code == sys.ExitCodeDeadlineExceeded:
		what = fmt.Sprintf("ran past its timeout (%s) and was stopped; make it faster, or raise timeout", m.timeout)
	case exited && code == sys.ExitCodeContextCanceled:
		what = "was canceled (the bridge is stopping)"
	case exited:
		what = fmt.Sprintf("exited with code %d", code)
	case errors.As(err, &ab):
		what = ab.msg
	default:
		what = "trapped: " + firstLine(err)
	}
	hint := ""
	if strings.Contains(in.lastErr, "out of memory") || (in.mem != nil && uint64(in.mem.Size())+4<<20 > uint64(m.maxMem)) {
		hint = fmt.Sprintf("; its memory is near max_memory_mib (%d MiB): raise it, or make the module use less", m.maxMem>>20)
	}
	return fmt.Errorf("wasm module %s: %s %s%s%s", m.path, fn, what, m.reason(in), hint)
}

// discard closes in and logs what it wrote.
func (m *Module) discard(in *instance) {
	m.flush(in)
	in.mod.Close(context.Background())
}

// reason returns ": " and the line of in's stderr that says why a call
// failed (a Go panic's or fatal error's line, else the last line), or "".
func (m *Module) reason(in *instance) string {
	lines := strings.Split(strings.TrimSpace(in.lastErr), "\n")
	pick := ""
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			pick = l
			break
		}
		if l != "" {
			pick = l
		}
	}
	if pick == "" {
		return ""
	}
	if len(pick) > 300 {
		pick = pick[:300] + "..."
	}
	return ": " + pick
}

// flush logs what the last call wrote to stdout and stderr, keeps stderr
// for reason, and resets both.
func (m *Module) flush(in *instance) {
	in.lastErr = in.stderr.String()
	if m.log != nil {
		for _, o := range []struct {
			name string
			c    *capture
		}{{"stdout", &in.stdout}, {"stderr", &in.stderr}} {
			for l := range strings.SplitSeq(strings.TrimRight(o.c.String(), "\n"), "\n") {
				if l != "" {
					m.log.Info("wasm module output", "module", m.path, "stream", o.name, "line", l)
				}
			}
		}
	}
	in.stdout.Reset()
	in.stderr.Reset()
}

// firstLine returns err's first line: wazero appends the wasm stack.
func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// isObject reports whether b is one JSON object.
func isObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

func quoteStart(b []byte) string {
	if len(b) > 60 {
		return fmt.Sprintf("%q...", b[:60])
	}
	return fmt.Sprintf("%q", b)
}

// Kind returns what m's function does.
func (m *Module) Kind() Kind { return m.kind }

// Path returns the module's file.
func (m *Module) Path() string { return m.path }

// Function returns the export m calls.
func (m *Module) Function() string { return m.fn }

// Timeout returns the bound on one call.
func (m *Module) Timeout() time.Duration { return m.timeout }

// MaxMemory returns the cap on an instance's memory, in bytes.
func (m *Module) MaxMemory() int64 { return int64(m.maxMem) }

// Interpreted reports whether the module runs in wazero's interpreter
// because the process may not map executable memory (Load logs why).
func (m *Module) Interpreted() bool { return m.interpreted }
