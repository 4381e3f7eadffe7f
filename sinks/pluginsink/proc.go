package pluginsink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
)

// proc is one running plugin process.
type proc struct {
	client *goplugin.Client
	cmd    *exec.Cmd
	sink   pluginv1.SinkClient
	conf   pluginv1.ConformanceClient
	stderr *tail
	// sockDir is the process's own directory (mode 0700) for its unix
	// socket (PLUGIN_UNIX_SOCKET_DIR), removed when it stops: a socket
	// there is reachable by the bridge's user only, where a TCP port on
	// loopback is reachable by every process of the machine.
	sockDir string
}

// tail keeps the last bytes the plugin wrote to stderr, for error messages.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 2048

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = t.buf[len(t.buf)-tailMax:]
	}
	return len(p), nil
}

// last returns the last line the plugin wrote to stderr, or "". Lines of
// go-plugin's own JSON log (hclog) count by their message, debug and trace
// ones not at all.
func (t *tail) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, `{"@level"`) {
			return l
		}
		var e struct {
			Level   string `json:"@level"`
			Message string `json:"@message"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Level != "debug" && e.Level != "trace" {
			return e.Message
		}
	}
	return ""
}

// who names a plugin in messages: `plugin sink "file" (/usr/lib/go-sink)`.
func who(name, command string) string {
	return fmt.Sprintf("plugin sink %q (%s)", name, command)
}

// ChecksumError is returned when the executable is not the one pinned.
type ChecksumError struct {
	Name, Command, Want, Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("%s: the executable's sha256 is %s, but sinks.%s.config.sha256 pins %s: "+
		"if you trust this build, set sha256: %s; otherwise put back the build you pinned",
		who(e.Name, e.Command), e.Got, e.Name, e.Want, e.Got)
}

// FileSHA256 returns the hex sha256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// start checks the executable's checksum, starts it and completes the
// handshake. Every error names the plugin and the fix, on one line, and is
// permanent when starting again cannot help (a checksum or version
// mismatch, a file that is not there).
func start(cfg *Config, name string) (*proc, error) {
	id := who(name, cfg.Command)
	got, err := FileSHA256(cfg.Command)
	if err != nil {
		return nil, sinks.Permanent(fmt.Errorf("%s: reading the executable: %w: set sinks.%s.config.command to the plugin's path", id, err, name))
	}
	if !strings.EqualFold(got, cfg.SHA256) {
		return nil, sinks.Permanent(&ChecksumError{Name: name, Command: cfg.Command, Want: strings.ToLower(cfg.SHA256), Got: got})
	}
	sum, _ := hex.DecodeString(got)
	sockDir, err := os.MkdirTemp("", "bridge-plugin-")
	if err != nil {
		return nil, fmt.Errorf("%s: making the directory for its socket: %w", id, err)
	}
	started := false
	defer func() {
		if !started {
			_ = os.RemoveAll(sockDir)
		}
	}()
	cmd := exec.Command(cfg.Command, cfg.Args...)
	dieWithParent(cmd)
	// Its socket goes in a directory of its own (go-plugin's servers, and
	// the examples in other languages, listen there); a configured
	// PLUGIN_UNIX_SOCKET_DIR comes later and wins.
	cmd.Env = append([]string{goplugin.EnvUnixSocketDir + "=" + sockDir}, pluginEnv(cfg.Env)...)
	t := &tail{}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: pluginv1.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			pluginv1.ProtocolVersion: {pluginv1.PluginName: &pluginv1.GRPCPlugin{}},
		},
		Cmd:              cmd,
		SkipHostEnv:      true, // cmd.Env is the plugin's whole environment (pluginEnv)
		SecureConfig:     &goplugin.SecureConfig{Checksum: sum, Hash: sha256.New()},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		StartTimeout:     cfg.StartTimeout,
		Stderr:           t,
		Logger:           hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Off}),
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		return nil, handshakeError(id, cfg, err, t)
	}
	raw, err := rpc.Dispense(pluginv1.PluginName)
	if err != nil {
		client.Kill()
		return nil, sinks.Permanent(fmt.Errorf("%s: the plugin serves no %q: serve it with pluginv1.Serve or register the bridge.plugin.v1.Sink gRPC service", id, pluginv1.PluginName))
	}
	c := raw.(*pluginv1.Clients)
	started = true
	return &proc{client: client, cmd: cmd, sink: c.Sink, conf: c.Conformance, stderr: t, sockDir: sockDir}, nil
}

// handshakeError turns go-plugin's start errors into one line with the fix.
func handshakeError(id string, cfg *Config, err error, t *tail) error {
	msg := err.Error()
	stderr := ""
	if l := t.last(); l != "" {
		stderr = fmt.Sprintf(" (its last stderr line: %q)", l)
	}
	switch {
	case strings.Contains(strings.ToLower(msg), "incompatible api version"):
		return sinks.Permanent(fmt.Errorf("%s: the plugin speaks another version of the plugin contract (%s); this bridge speaks major %d (bridge.plugin.v%d): rebuild the plugin against bridge.plugin.v%d",
			id, msg, pluginv1.ProtocolVersion, pluginv1.ProtocolVersion, pluginv1.ProtocolVersion))
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		return fmt.Errorf("%s: no handshake within start_timeout %s%s: the plugin must print go-plugin's handshake line on stdout when it starts (docs/plugins.md), or raise start_timeout", id, cfg.StartTimeout, stderr)
	case strings.Contains(msg, "Unrecognized remote plugin message"), strings.Contains(msg, "unsupported") && strings.Contains(msg, "protocol"):
		return sinks.Permanent(fmt.Errorf("%s: not a bridge plugin: its first stdout line is not a go-plugin gRPC handshake (%s): serve with pluginv1.Serve, or print \"1|%d|unix|<socket in PLUGIN_UNIX_SOCKET_DIR>|grpc\" first and nothing else on stdout", id, firstLine(msg), pluginv1.ProtocolVersion))
	case strings.Contains(msg, "checksums did not match"):
		return sinks.Permanent(fmt.Errorf("%s: the executable changed while starting (%s): pin the sha256 of the build you run", id, msg))
	case errors.Is(err, goplugin.ErrProcessNotFound), strings.Contains(msg, "exited before we could connect"), strings.Contains(msg, "plugin exited"):
		return fmt.Errorf("%s: exited before the handshake%s: run it with `bridge plugin test %s` to see why", id, stderr, cfg.Command)
	}
	return fmt.Errorf("%s: starting: %s%s: run `bridge plugin test %s` to see why", id, firstLine(msg), stderr, cfg.Command)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// stop ends the process: the plugin's Close RPC is the caller's; stop only
// makes sure the process is gone, without waiting long for it.
func (p *proc) stop() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	p.client.Kill()
	_ = os.RemoveAll(p.sockDir)
}

// exited reports whether the process has ended.
func (p *proc) exited() bool { return p.client.Exited() }

// describeAndConfigure asks the plugin who it is and hands it its block.
func (p *proc) describeAndConfigure(ctx context.Context, name string, cfgJSON []byte) (*pluginv1.DescribeResponse, error) {
	r, err := p.sink.Configure(ctx, &pluginv1.ConfigureRequest{ConfigJson: cfgJSON, SinkName: name})
	if err != nil {
		return nil, fmt.Errorf("configuring: %w", err)
	}
	if fe := r.GetFieldErrors(); len(fe) > 0 {
		errs := make([]error, 0, len(fe))
		for _, e := range fe {
			path := "sinks." + name + ".config.config"
			if e.GetKey() != "" {
				path += "." + e.GetKey()
			}
			errs = append(errs, &config.FieldError{Path: path, Msg: e.GetMessage()})
		}
		return nil, sinks.Permanent(errors.Join(errs...))
	}
	d, err := p.sink.Describe(ctx, &pluginv1.DescribeRequest{})
	if err != nil {
		return nil, fmt.Errorf("describing: %w", err)
	}
	return d, nil
}

// pluginEnv is a plugin's environment: the variables of the bridge's that
// finding programs, files and the locale need, when set, then its
// configured env (which wins). The rest of the bridge's environment (DSNs,
// credentials, tokens) is not the plugin's. go-plugin adds its handshake
// variables to it.
func pluginEnv(extra map[string]string) []string {
	inherited := [...]string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"}
	env := make([]string, 0, len(inherited)+len(extra))
	for _, k := range inherited {
		if v, ok := os.LookupEnv(k); ok {
			if _, over := extra[k]; !over {
				env = append(env, k+"="+v)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		env = append(env, k+"="+extra[k])
	}
	return env
}
