package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// BridgeConfig is what a run's bridge.yaml varies.
type BridgeConfig struct {
	Name    string // bridge name (checkpoint key, producer id)
	Slot    string // pre-created slot of Plugin
	Plugin  string // source type: pgoutput (default) or wal2json
	Stream  string // JetStream stream, created by the bridge
	Subject string // subject prefix bound to the stream
	DSN     string
	NATSURL string
	DataDir string
}

// Write writes bridge.yaml into dir and returns its path. Everything not set
// here keeps the product's defaults (batch 4096 / 1ms, max_pending 4096,
// checkpoint every 1s, duplicate_window 2m); any key can still be changed with
// the BRIDGE_* variables, which the bridge process inherits.
func (c BridgeConfig) Write(dir string) (string, error) {
	plugin := c.Plugin
	if plugin == "" {
		plugin = "pgoutput"
	}
	y := fmt.Sprintf(`name: %s
data_dir: %s
nats:
  url: %s
sources:
  app:
    type: %s
    config:
      dsn: %q
      slot: %s
      create_slot: false
      publication: %s
      create_publication: false
checkpoint:
  bucket: bench_checkpoints
sinks:
  js:
    type: nats_jetstream
    config:
      stream: %s
      subjects: ["%s.>"]
routes:
  - sinks: [js]
    subject: "%s.{{.Schema}}.{{.Table}}"
http:
  listen: "127.0.0.1:0"
log:
  level: info
  format: json
`, c.Name, c.DataDir, c.NATSURL, plugin, c.DSN, c.Slot, Publication, c.Stream, c.Subject, c.Subject)
	p := filepath.Join(dir, c.Name+".yaml")
	return p, os.WriteFile(p, []byte(y), 0o644)
}

// Proc is a process under test: the bridge or the pipe (bench/cmd/pipe).
type Proc struct {
	Name    string // what it is, in errors
	Cmd     *exec.Cmd
	Start   time.Time
	LogPath string
	done    chan struct{}
	waitErr error
}

// StartBridge runs `bin run -c cfg` with its log in logPath. extraEnv is
// added to the inherited environment (OTEL_* variables are removed so that
// tracing stays off as in the default configuration).
func StartBridge(bin, cfg, logPath string, extraEnv ...string) (*Proc, error) {
	return StartProc("bridge", bin, []string{"run", "-c", cfg}, logPath, extraEnv...)
}

// StartProc runs bin with args in a process group of its own, with its
// standard output and error in logPath and extraEnv added to the inherited
// environment (without OTEL_* variables). name names it in errors.
func StartProc(name, bin string, args []string, logPath string, extraEnv ...string) (*Proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, extraEnv...)
	p := &Proc{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	p.Start = time.Now()
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s %s: %w", name, bin, err)
	}
	go func() { p.waitErr = cmd.Wait(); log.Close(); close(p.done) }()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Exited returns an error when the process has ended.
func (p *Proc) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); log: %s\n%s", p.Name, p.waitErr, p.LogPath, tail(p.LogPath, 20))
	default:
		return nil
	}
}

// Signal sends sig.
func (p *Proc) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to timeout (then SIGKILL).
func (p *Proc) Stop(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.waitErr
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.waitErr
	case <-time.After(timeout):
		_ = p.Cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", p.Name, timeout)
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
