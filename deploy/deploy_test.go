// Package deploy_test checks the deployment artefacts by every means short
// of Docker and a Kubernetes cluster: it parses the Dockerfile, compose.yaml,
// the Kubernetes manifests and the systemd unit with real parsers, asserts
// the properties that matter (ports, probes, grace periods, users), loads
// every bridge.yaml they carry through config.Load and bridge.New with the
// environment they set, reproduces the image's `go build` and checks the
// binary, and runs the compose quickstart's bridge.yaml and writer.sh against
// a real PostgreSQL and NATS. What it cannot do: build or run images, apply
// the manifests, or start the unit under systemd.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
	"github.com/bridgecdc/bridge/internal/syncbuf"
	_ "github.com/bridgecdc/bridge/plugins"
)

// root is the repository root, relative to this package's directory.
const root = ".."

// ---------------------------------------------------------------------------
// Shared checks

// loadConfig loads the bridge.yaml text y with exactly the variables env
// (and nothing from the process environment), then builds the App, which
// validates every plugin block and route without I/O.
func loadConfig(t *testing.T, y string, env map[string]string) *config.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	cfg, err := config.Load(p, config.WithEnv(func() []string { return list }))
	require.NoError(t, err, "config.Load")
	_, err = app.New(cfg)
	require.NoError(t, err, "app.New")
	return cfg
}

// goodbyes is how many steps, each bounded by shutdown.timeout, a stop of
// cfg may take one after the other: every pipeline drains its in-flight
// writes, saves the final checkpoint and sends the final status update (the
// pipelines do this in parallel); then every pipeline's connection to every
// sink is closed, the NATS connection drained, the embedded server (when
// nats.url is empty) and the tracer (when tracing is on) shut down, and the
// HTTP server stopped. docs/operations.md explains the same sum.
func goodbyes(cfg *config.Config) int {
	n := 3 + len(cfg.Sources)*len(cfg.Sinks) + 1
	if cfg.NATS.URL == "" {
		n++
	}
	tr := cfg.Telemetry.Tracing
	if (tr.Enabled != nil && *tr.Enabled) || (tr.Enabled == nil && tr.Endpoint != "") {
		n++
	}
	if cfg.HTTP.Listen != "" {
		n++
	}
	return n
}

// listenPort returns the port of an http.listen address.
func listenPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err, "http.listen %q", addr)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// decodeStrict decodes one YAML document into out, failing on keys out
// has no field for, so a misspelt key (readinesProbe) cannot pass.
func decodeStrict(t *testing.T, node *yaml.Node, out any, what string) {
	t.Helper()
	b, err := yaml.Marshal(node)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(out), "%s: a key the test does not know (a typo, or extend the test's structs)", what)
}

// documents parses every YAML document of the file at path.
func documents(t *testing.T, path string) []*yaml.Node {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, path)
		out = append(out, &n)
	}
}

// quantity parses a Kubernetes memory quantity or a GOMEMLIMIT value into
// bytes (binary and decimal suffixes; enough for the manifests here).
func quantity(t *testing.T, s string) int64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)([A-Za-z]*)$`).FindStringSubmatch(s)
	require.NotNil(t, m, "quantity %q", s)
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	mult := map[string]int64{"": 1, "B": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
		"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]
	require.NotZero(t, mult, "unit of %q", s)
	return n * mult
}

// requireConsoleClosed checks that cfg serves no rows and no buttons to
// the network: the web console is off, on loopback, or refused by the
// bridge itself (app.ConsoleOff), also once serve.client_header is set for
// a `bridge serve` behind an authenticating proxy (issue 35: a header any
// client reaching the listener could send).
func requireConsoleClosed(t *testing.T, cfg *config.Config, what string) {
	t.Helper()
	exposed := func(c *config.Config) bool {
		return c.HTTP.Listen != "" && c.HTTP.Console && !config.IsLoopback(c.HTTP.Listen) && app.ConsoleOff(c) == ""
	}
	require.False(t, exposed(cfg), "%s: the web console is served on %s without authentication", what, cfg.HTTP.Listen)
	proxied := *cfg
	proxied.Serve.ClientHeader = "X-Auth-Request-User"
	require.False(t, exposed(&proxied), "%s: with serve.client_header set, the web console trusts the header on %s", what, cfg.HTTP.Listen)
}

// ---------------------------------------------------------------------------
// Dockerfile

type dfInstr struct {
	Cmd  string // upper case
	Args string
}

type dfStage struct {
	From, Name string
	Instrs     []dfInstr
}

// parseDockerfile splits a Dockerfile into its global ARGs and stages,
// joining continuation lines and dropping comments as Docker does.
func parseDockerfile(t *testing.T, path string) (globalArgs []string, stages []dfStage) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var logical []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	require.NoError(t, sc.Err())
	require.Zero(t, cur.Len(), "a continuation runs past the end of the file")
	for _, l := range logical {
		cmd, args, _ := strings.Cut(l, " ")
		in := dfInstr{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)}
		switch {
		case in.Cmd == "FROM":
			fields := strings.Fields(in.Args)
			var s dfStage
			for i := 0; i < len(fields); i++ {
				switch {
				case strings.HasPrefix(fields[i], "--"):
				case strings.EqualFold(fields[i], "AS") && i+1 < len(fields):
					s.Name = fields[i+1]
					i++
				default:
					s.From = fields[i]
				}
			}
			stages = append(stages, s)
		case len(stages) == 0:
			require.Equal(t, "ARG", in.Cmd, "only ARG may come before the first FROM")
			globalArgs = append(globalArgs, in.Args)
		default:
			stages[len(stages)-1].Instrs = append(stages[len(stages)-1].Instrs, in)
		}
	}
	return globalArgs, stages
}

// shellWords splits s like a POSIX shell would a simple command: quotes and
// backslashes, no expansions.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	var w strings.Builder
	in := false
	var quote rune
	for i := 0; i < len(s); i++ {
		c := rune(s[i])
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' && i+1 < len(s) {
				i++
				w.WriteByte(s[i])
			} else {
				w.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			in = true
		case c == ' ' || c == '\t':
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(c)
			in = true
		}
	}
	require.Zero(t, quote, "unterminated quote in %q", s)
	if in {
		out = append(out, w.String())
	}
	return out
}

var varRE = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

func expandVars(t *testing.T, s string, vars map[string]string) string {
	t.Helper()
	return varRE.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		v, ok := vars[name]
		require.True(t, ok, "variable %s in %q has no ARG", name, s)
		return v
	})
}

// argDefaults reads ARG NAME=default declarations.
func argDefaults(args []string, into map[string]string) {
	for _, a := range args {
		name, def, _ := strings.Cut(a, "=")
		if _, set := into[name]; !set {
			into[name] = def
		}
	}
}

// imageBuild is the result of the Dockerfile's builder command, reproduced.
type imageBuild struct {
	bin     string // the binary, built like the image's
	out     string // its path in the builder (-o)
	version string // the VERSION it was built with
}

var (
	imgOnce sync.Once
	img     imageBuild
	imgErr  error
	imgDir  string // removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if imgDir != "" {
		_ = os.RemoveAll(imgDir)
	}
	for _, d := range kubeSchemaDirs {
		_ = os.RemoveAll(d)
	}
	os.Exit(code)
}

const testVersion = "v0.0.0-deploytest"

// buildLikeImage runs the builder stage's `go build` command with its
// environment assignments and flags, GOOS/GOARCH set to this machine's, into
// a temporary directory; once per test binary.
func buildLikeImage(t *testing.T) imageBuild {
	t.Helper()
	imgOnce.Do(func() {
		img, imgErr = doBuildLikeImage(t)
	})
	require.NoError(t, imgErr)
	return img
}

func doBuildLikeImage(t *testing.T) (imageBuild, error) {
	global, stages := parseDockerfile(t, "Dockerfile")
	var build *dfStage
	for i := range stages {
		if stages[i].Name == "build" {
			build = &stages[i]
		}
	}
	if build == nil {
		return imageBuild{}, errors.New("no stage named build")
	}
	vars := map[string]string{"TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH, "VERSION": testVersion}
	argDefaults(global, vars)
	var run string
	for _, in := range build.Instrs {
		switch in.Cmd {
		case "ARG":
			argDefaults([]string{in.Args}, vars)
		case "RUN":
			if strings.Contains(in.Args, "go build") {
				run = in.Args
			}
		}
	}
	if run == "" {
		return imageBuild{}, errors.New("the build stage has no RUN with go build")
	}
	words := shellWords(t, run)
	for len(words) > 0 && strings.HasPrefix(words[0], "--") { // RUN --mount=...
		words = words[1:]
	}
	var env []string
	for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
		env = append(env, expandVars(t, words[0], vars))
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		return imageBuild{}, fmt.Errorf("the builder's command is not `[VAR=value ...] go build ...`: %q", run)
	}
	dir, err := os.MkdirTemp("", "bridge-image-")
	if err != nil {
		return imageBuild{}, err
	}
	imgDir = dir
	res := imageBuild{bin: filepath.Join(dir, "bridge"), version: testVersion}
	args := []string{"build"}
	for i := 2; i < len(words); i++ {
		w := expandVars(t, words[i], vars)
		if w == "-o" && i+1 < len(words) {
			res.out = words[i+1]
			args = append(args, "-o", res.bin)
			i++
			continue
		}
		args = append(args, w)
	}
	if res.out == "" {
		return imageBuild{}, errors.New("the builder's go build has no -o")
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	t.Logf("reproducing the image build: %s go %s", strings.Join(env, " "), strings.Join(args, " "))
	if out, err := cmd.CombinedOutput(); err != nil {
		return imageBuild{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return res, nil
}

func TestDockerfile(t *testing.T) {
	global, stages := parseDockerfile(t, "Dockerfile")
	require.Len(t, stages, 2, "a builder and a runtime stage")
	build, final := stages[0], stages[1]
	require.Equal(t, "build", build.Name)
	require.True(t, strings.HasPrefix(build.From, "golang:"), "builder FROM %s", build.From)
	vars := map[string]string{}
	argDefaults(global, vars)
	goVersion := expandVars(t, strings.TrimPrefix(build.From, "golang:"), vars)
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	goLine := regexp.MustCompile(`(?m)^go ([0-9]+\.[0-9]+)`).FindSubmatch(gomod)
	require.NotNil(t, goLine)
	require.Equal(t, string(goLine[1]), goVersion, "the builder's Go must be go.mod's")

	// The builder: static, trimmed, stripped, versioned.
	var run string
	for _, in := range build.Instrs {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			run = in.Args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w -X github.com/bridgecdc/bridge/internal/buildinfo.Version=${VERSION}"`, "./cmd/bridge"} {
		require.Contains(t, run, want)
	}

	// The runtime stage.
	require.Contains(t, []string{"gcr.io/distroless/static:nonroot", "gcr.io/distroless/static-debian12:nonroot", "scratch"}, final.From)
	got := map[string][]string{}
	for _, in := range final.Instrs {
		got[in.Cmd] = append(got[in.Cmd], in.Args)
	}
	require.Len(t, got["USER"], 1)
	uid, _, _ := strings.Cut(got["USER"][0], ":")
	n, err := strconv.Atoi(uid)
	require.NoError(t, err, "USER must be numeric so that runAsNonRoot can check it: %s", got["USER"][0])
	require.NotZero(t, n, "USER must not be root")
	var entry, cmd []string
	require.Len(t, got["ENTRYPOINT"], 1)
	require.NoError(t, json.Unmarshal([]byte(got["ENTRYPOINT"][0]), &entry), "ENTRYPOINT in exec (JSON) form, so SIGTERM reaches the bridge")
	require.Equal(t, []string{"/bridge"}, entry)
	require.Len(t, got["CMD"], 1)
	require.NoError(t, json.Unmarshal([]byte(got["CMD"][0]), &cmd))
	require.Equal(t, []string{"run", "-c", "/etc/bridge/bridge.yaml"}, cmd)
	require.Equal(t, []string{"8080"}, got["EXPOSE"])
	require.Contains(t, got["ENV"], "BRIDGE_HTTP__LISTEN=0.0.0.0:8080", "the metrics port must be reachable from outside the container")
	// What the image's environment opens: metrics and health, no rows.
	imageEnv := map[string]string{}
	for _, e := range got["ENV"] {
		k, v, ok := strings.Cut(e, "=")
		require.True(t, ok, "ENV %s: key=value", e)
		imageEnv[k] = v
	}
	requireConsoleClosed(t, loadConfig(t, `name: shop
sources:
  shop: {type: pgoutput, config: {dsn: "postgres://bridge@db:5432/shop", slot: bridge_shop, publication: bridge_shop}}
sinks:
  main: {type: nats_jetstream, config: {stream: CDC, subjects: ["cdc.>"]}}
routes:
  - sinks: [main]
`, imageEnv), "the image")

	// Reproduce the build and check the binary.
	b := buildLikeImage(t)
	require.Contains(t, got["COPY"], "--from=build "+b.out+" /bridge", "the runtime stage copies what the builder built")
	f, err := elf.Open(b.bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "static binary: no program interpreter")
		require.NotEqual(t, elf.PT_DYNAMIC, p.Type, "static binary: no dynamic section")
	}
	require.Nil(t, f.Section(".interp"))
	require.Nil(t, f.Section(".dynamic"))
	require.Nil(t, f.Section(".symtab"), "-s: no symbol table")
	for _, s := range f.Sections {
		require.False(t, strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_"), "-w: no DWARF, found %s", s.Name)
	}
	raw, err := os.ReadFile(b.bin)
	require.NoError(t, err)
	abs, err := filepath.Abs(root)
	require.NoError(t, err)
	require.False(t, bytes.Contains(raw, []byte(abs+"/")), "-trimpath: the build directory %s must not be in the binary", abs)
	out, err := exec.Command(b.bin, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "bridge "+b.version+"\n", string(out))
	t.Logf("image binary: %d bytes, static, stripped", len(raw))
}

// ---------------------------------------------------------------------------
// compose

// stringOrList is a compose value given as a string or a list of strings.
type stringOrList []string

func (s *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = []string{n.Value}
		return nil
	}
	var l []string
	if err := n.Decode(&l); err != nil {
		return err
	}
	*s = l
	return nil
}

type composeBuild struct {
	Context    string            `yaml:"context"`
	Dockerfile string            `yaml:"dockerfile"`
	Args       map[string]string `yaml:"args"`
}

func (b *composeBuild) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain composeBuild
	return n.Decode((*plain)(b))
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     stringOrList      `yaml:"command"`
	Entrypoint  stringOrList      `yaml:"entrypoint"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test     stringOrList `yaml:"test"`
		Interval string       `yaml:"interval"`
		Timeout  string       `yaml:"timeout"`
		Retries  int          `yaml:"retries"`
	} `yaml:"healthcheck"`
	Restart         string `yaml:"restart"`
	StopGracePeriod string `yaml:"stop_grace_period"`
}

type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

const composeDir = "compose"

func readCompose(t *testing.T) composeFile {
	t.Helper()
	docs := documents(t, filepath.Join(composeDir, "compose.yaml"))
	require.Len(t, docs, 1)
	var c composeFile
	decodeStrict(t, docs[0], &c, "compose.yaml")
	for name, s := range c.Services {
		for k, v := range s.Environment {
			require.NotContains(t, v, "$", "services.%s.environment.%s: compose would interpolate it", name, k)
		}
	}
	return c
}

// mount returns the host path (relative to the compose file) mounted at
// target in s, or "".
func mount(s composeService, target string) (string, string) {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target {
			mode := ""
			if len(parts) > 2 {
				mode = parts[2]
			}
			return parts[0], mode
		}
	}
	return "", ""
}

func TestComposeFile(t *testing.T) {
	c := readCompose(t)
	for _, name := range []string{"postgres", "nats", "bridge", "writer", "consumer"} {
		require.Contains(t, c.Services, name)
	}
	for name, s := range c.Services {
		require.True(t, s.Image != "" || s.Build != nil, "%s: image or build", name)
		for dep, d := range s.DependsOn {
			require.Contains(t, c.Services, dep, "%s depends on an unknown service", name)
			require.Contains(t, []string{"service_started", "service_healthy", "service_completed_successfully"}, d.Condition)
			if d.Condition == "service_healthy" {
				require.NotNil(t, c.Services[dep].Healthcheck, "%s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
		for _, v := range s.Volumes {
			src := strings.Split(v, ":")[0]
			if strings.HasPrefix(src, ".") {
				_, err := os.Stat(filepath.Join(composeDir, src))
				require.NoError(t, err, "%s mounts %s", name, src)
			} else {
				require.Contains(t, c.Volumes, src, "%s: named volume %s not declared", name, src)
			}
		}
	}

	// Postgres: logical decoding, wal2json installed.
	pg := c.Services["postgres"]
	require.NotNil(t, pg.Build)
	require.Contains(t, strings.Join(pg.Command, " "), "-c wal_level=logical")
	df, err := os.ReadFile(filepath.Join(composeDir, pg.Build.Context, "Dockerfile"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^FROM postgres:15\s*$`, string(df))
	require.Regexp(t, `apt-get install [^\n]*postgresql-15-wal2json`, string(df))
	_, pgStages := parseDockerfile(t, filepath.Join(composeDir, pg.Build.Context, "Dockerfile"))
	require.Len(t, pgStages, 1)

	// NATS: JetStream with its store on a volume.
	ns := c.Services["nats"]
	args := ns.Command
	require.Contains(t, args, "-js")
	sd := ""
	for i, a := range args {
		if a == "-sd" && i+1 < len(args) {
			sd = args[i+1]
		}
	}
	require.NotEmpty(t, sd, "nats: -sd <store dir>")
	src, _ := mount(ns, sd)
	require.NotEmpty(t, src, "nats: the store dir %s must be a volume", sd)
	require.Contains(t, strings.Join(ns.Healthcheck.Test, " "), "js-enabled-only=true")

	// The bridge: this repository's image, the quickstart config.
	br := c.Services["bridge"]
	require.NotNil(t, br.Build)
	ctxDir, err := filepath.Abs(filepath.Join(composeDir, br.Build.Context))
	require.NoError(t, err)
	rootAbs, err := filepath.Abs(root)
	require.NoError(t, err)
	require.Equal(t, rootAbs, ctxDir, "the build context is the repository root")
	require.Equal(t, "deploy/Dockerfile", br.Build.Dockerfile)
	cfgSrc, mode := mount(br, "/etc/bridge/bridge.yaml")
	require.Equal(t, "./bridge.yaml", cfgSrc, "the image's CMD reads /etc/bridge/bridge.yaml")
	require.Equal(t, "ro", mode)
	require.Equal(t, "service_healthy", br.DependsOn["postgres"].Condition)
	require.Equal(t, "service_healthy", br.DependsOn["nats"].Condition)
	y, err := os.ReadFile(filepath.Join(composeDir, cfgSrc))
	require.NoError(t, err)
	cfg := loadConfig(t, string(y), br.Environment)
	require.Equal(t, "nats://nats:4222", cfg.NATS.URL)
	port := listenPort(t, cfg.HTTP.Listen)
	require.Equal(t, "0.0.0.0", strings.Split(cfg.HTTP.Listen, ":")[0], "reachable from outside the container")
	published := false
	for _, p := range br.Ports {
		published = published || strings.HasSuffix(p, ":"+strconv.Itoa(port))
	}
	require.True(t, published, "the bridge publishes its http.listen port %d: %v", port, br.Ports)
	requireConsoleClosed(t, cfg, "compose")
	grace, err := time.ParseDuration(br.StopGracePeriod)
	require.NoError(t, err)
	require.Greater(t, grace, cfg.Shutdown.Timeout*time.Duration(goodbyes(cfg)),
		"stop_grace_period must exceed shutdown.timeout × %d goodbyes", goodbyes(cfg))

	// The writer runs writer.sh against the same database and slot.
	wr := c.Services["writer"]
	require.Equal(t, "postgres", wr.Environment["PGHOST"])
	require.Equal(t, cfg.Sources["shop"].Config["slot"], wr.Environment["SLOT"])
	require.Equal(t, "service_healthy", wr.DependsOn["postgres"].Condition)
	scriptSrc, _ := mount(wr, "/writer.sh")
	require.Equal(t, "./writer.sh", scriptSrc)
	require.Equal(t, []string{"sh", "/writer.sh"}, []string(wr.Entrypoint))
	out, err := exec.Command("sh", "-n", filepath.Join(composeDir, "writer.sh")).CombinedOutput()
	require.NoError(t, err, "writer.sh: %s", out)
}

// TestComposeQuickstartRuns runs what `docker compose up` would, minus
// Docker: the binary built like the image's, with compose.yaml's bridge
// environment and config (pointed at a private PostgreSQL and NATS, and a
// free port), and writer.sh through psql. Every transaction arrives.
func TestComposeQuickstartRuns(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		if dir, derr := pgtest.BinDir(); derr == nil {
			psql = filepath.Join(dir, "psql")
		}
		if _, err := os.Stat(psql); err != nil {
			t.Skip("psql not installed: apt-get install postgresql-client-15")
		}
	}
	c := readCompose(t)
	br := c.Services["bridge"]
	b := buildLikeImage(t)
	pg := pgtest.StartT(t, pgtest.Options{})
	ns := natsembed.StartT(t, natsembed.Options{})

	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	env := os.Environ()
	for k, v := range br.Environment {
		switch k {
		case "PG_DSN":
			v = pg.DSN("")
		case "NATS_URL":
			v = ns.URL()
		case "BRIDGE_HTTP__LISTEN":
			v = httpAddr // never a fixed port in tests
		}
		env = append(env, k+"="+v)
	}
	cfgSrc, _ := mount(br, "/etc/bridge/bridge.yaml")
	var out syncBuffer
	cmd := exec.Command(b.bin, "run", "-c", filepath.Join(composeDir, cfgSrc))
	cmd.Env, cmd.Stdout, cmd.Stderr = env, &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	require.Eventually(t, func() bool { return httpStatus("http://"+httpAddr+"/readyz") == http.StatusOK },
		60*time.Second, 50*time.Millisecond, "/readyz never answered 200:\n%s", &out)

	// writer.sh, three transactions, with the writer service's settings.
	wr := c.Services["writer"]
	wcmd := exec.Command("sh", filepath.Join(composeDir, "writer.sh"))
	wcmd.Env = append(os.Environ(), "PATH="+filepath.Dir(psql)+":"+os.Getenv("PATH"),
		"PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(pg.Port), "PGUSER=postgres", "PGDATABASE=postgres",
		"SLOT="+wr.Environment["SLOT"], "INTERVAL=0", "ITERATIONS=3")
	wout, err := wcmd.CombinedOutput()
	require.NoError(t, err, "writer.sh:\n%s", wout)

	ms := readStream(t, ns.URL(), "CDC", 5)
	var ops []string
	for _, m := range ms {
		require.Equal(t, "cdc.shop.public.orders", m.Subject)
		require.Regexp(t, `^quickstart\.shop\.[a-z0-9]+:[0-9A-F]{16}:[0-9]+$`, m.Header.Get("Nats-Msg-Id"))
		ops = append(ops, m.Header.Get("Bridge-Op"))
	}
	require.Equal(t, []string{"insert", "update", "insert", "update", "insert"}, ops)
	require.Equal(t, http.StatusOK, httpStatus("http://"+httpAddr+"/livez"))

	// SIGTERM: a clean stop, well within stop_grace_period.
	grace, err := time.ParseDuration(br.StopGracePeriod)
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		require.NoError(t, err, "exit status after SIGTERM:\n%s", &out)
	case <-time.After(grace):
		t.Fatalf("no exit within stop_grace_period %s of SIGTERM:\n%s", grace, &out)
	}
	require.Contains(t, out.String(), `"msg":"bridge stopped"`, "JSON logs, as log.format says")
}

type syncBuffer = syncbuf.Buffer

func httpStatus(url string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// readStream waits up to 30s for stream to hold n messages and returns them.
func readStream(t *testing.T, url, stream string, n int) []*nats.Msg {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var held uint64
	for held < uint64(n) {
		require.NoError(t, ctx.Err(), "stream %s holds %d messages, want %d", stream, held, n)
		if s, err := js.Stream(ctx, stream); err == nil {
			if info, err := s.Info(ctx); err == nil {
				held = info.State.Msgs
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.EqualValues(t, n, held, "no more than the writer committed")
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	var out []*nats.Msg
	for seq := uint64(1); len(out) < n; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		out = append(out, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	}
	return out
}

// ---------------------------------------------------------------------------
// Kubernetes

type k8sMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type k8sHead struct {
	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// intOrString is a port given by number or by name.
type intOrString struct {
	Int  int
	Name string
}

func (p *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a port number or name", n.Line)
	}
	if i, err := strconv.Atoi(n.Value); err == nil && n.Tag == "!!int" {
		p.Int = i
		return nil
	}
	p.Name = n.Value
	return nil
}

type probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	TimeoutSeconds      int `yaml:"timeoutSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	ImagePullPolicy string   `yaml:"imagePullPolicy"`
	Args            []string `yaml:"args"`
	Env             []envVar `yaml:"env"`
	Ports           []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
		Protocol      string `yaml:"protocol"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type deployment struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		Replicas *int `yaml:"replicas"`
		Strategy struct {
			Type string `yaml:"type"`
		} `yaml:"strategy"`
		RevisionHistoryLimit int           `yaml:"revisionHistoryLimit"`
		Selector             labelSelector `yaml:"selector"`
		Template             struct {
			Metadata k8sMeta `yaml:"metadata"`
			Spec     struct {
				TerminationGracePeriodSeconds *int  `yaml:"terminationGracePeriodSeconds"`
				AutomountServiceAccountToken  *bool `yaml:"automountServiceAccountToken"`
				EnableServiceLinks            *bool `yaml:"enableServiceLinks"`
				SecurityContext               struct {
					RunAsNonRoot   *bool  `yaml:"runAsNonRoot"`
					RunAsUser      *int64 `yaml:"runAsUser"`
					RunAsGroup     *int64 `yaml:"runAsGroup"`
					FSGroup        *int64 `yaml:"fsGroup"`
					SeccompProfile struct {
						Type string `yaml:"type"`
					} `yaml:"seccompProfile"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name  string `yaml:"name"`
						Items []struct {
							Key  string `yaml:"key"`
							Path string `yaml:"path"`
						} `yaml:"items"`
					} `yaml:"configMap"`
					EmptyDir *struct {
						SizeLimit string `yaml:"sizeLimit"`
					} `yaml:"emptyDir"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type configMap struct {
	k8sHead `yaml:",inline"`
	Data    map[string]string `yaml:"data"`
}

type secret struct {
	k8sHead    `yaml:",inline"`
	Type       string            `yaml:"type"`
	StringData map[string]string `yaml:"stringData"`
}

type service struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		Type     string            `yaml:"type"`
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
			Protocol   string      `yaml:"protocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type serviceMonitor struct {
	k8sHead `yaml:",inline"`
	Spec    struct {
		Selector          labelSelector `yaml:"selector"`
		NamespaceSelector struct {
			MatchNames []string `yaml:"matchNames"`
		} `yaml:"namespaceSelector"`
		Endpoints []struct {
			Port     string `yaml:"port"`
			Path     string `yaml:"path"`
			Interval string `yaml:"interval"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
	Images     []struct {
		Name   string `yaml:"name"`
		NewTag string `yaml:"newTag"`
	} `yaml:"images"`
}

type manifests struct {
	files      map[string]string // kind/name → file
	ns         []k8sHead
	deploys    []deployment
	configMaps map[string]configMap
	secrets    map[string]secret
	services   []service
	monitors   []serviceMonitor
	kust       kustomization
}

const k8sDir = "k8s"

// kustNamespace is the namespace kustomization.yaml puts everything in.
func (m *manifests) kustNamespace(t *testing.T) string {
	t.Helper()
	if m.kust.Namespace == "" {
		docs := documents(t, filepath.Join(k8sDir, "kustomization.yaml"))
		require.Len(t, docs, 1)
		decodeStrict(t, docs[0], &m.kust, "kustomization.yaml")
		require.NotEmpty(t, m.kust.Namespace)
	}
	return m.kust.Namespace
}

func readManifests(t *testing.T) manifests {
	t.Helper()
	m := manifests{files: map[string]string{}, configMaps: map[string]configMap{}, secrets: map[string]secret{}}
	m.kustNamespace(t)
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, p := range paths {
		for i, doc := range documents(t, p) {
			what := fmt.Sprintf("%s document %d", p, i)
			if filepath.Base(p) == "kustomization.yaml" {
				continue // kustNamespace reads it
			}
			var h k8sHead
			require.NoError(t, doc.Decode(&h), what)
			require.NotEmpty(t, h.APIVersion, what)
			require.NotEmpty(t, h.Metadata.Name, what)
			if h.Kind != "Namespace" {
				require.Equal(t, m.kustNamespace(t), h.Metadata.Namespace, "%s: namespace", what)
			}
			key := h.Kind + "/" + h.Metadata.Name
			require.NotContains(t, m.files, key, "%s defined twice", key)
			m.files[key] = filepath.Base(p)
			switch h.Kind {
			case "Namespace":
				decodeStrict(t, doc, &h, what)
				m.ns = append(m.ns, h)
			case "Deployment":
				var d deployment
				decodeStrict(t, doc, &d, what)
				m.deploys = append(m.deploys, d)
			case "ConfigMap":
				var c configMap
				decodeStrict(t, doc, &c, what)
				m.configMaps[c.Metadata.Name] = c
			case "Secret":
				var s secret
				decodeStrict(t, doc, &s, what)
				m.secrets[s.Metadata.Name] = s
			case "Service":
				var s service
				decodeStrict(t, doc, &s, what)
				m.services = append(m.services, s)
			case "ServiceMonitor":
				var s serviceMonitor
				decodeStrict(t, doc, &s, what)
				m.monitors = append(m.monitors, s)
			default:
				t.Fatalf("%s: kind %s has no check here", what, h.Kind)
			}
		}
	}
	return m
}

func TestKubernetesManifests(t *testing.T) {
	m := readManifests(t)
	require.Len(t, m.deploys, 1)
	d := m.deploys[0]
	require.Equal(t, "apps/v1", d.APIVersion)

	// One active replica per slot; the old pod gone before the new starts.
	require.NotNil(t, d.Spec.Replicas)
	require.Equal(t, 1, *d.Spec.Replicas)
	require.Equal(t, "Recreate", d.Spec.Strategy.Type)
	for k, v := range d.Spec.Selector.MatchLabels {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "the selector must match the pod's labels")
	}
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.Equal(t, []string{"run", "-c", "/etc/bridge/bridge.yaml"}, c.Args)

	// Non-root, read-only, nothing extra.
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	require.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.NotNil(t, pod.SecurityContext.RunAsUser)
	require.NotZero(t, *pod.SecurityContext.RunAsUser)
	require.Equal(t, "RuntimeDefault", pod.SecurityContext.SeccompProfile.Type)
	require.NotNil(t, c.SecurityContext.ReadOnlyRootFilesystem)
	require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	require.NotNil(t, c.SecurityContext.AllowPrivilegeEscalation)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.Equal(t, []string{"ALL"}, c.SecurityContext.Capabilities.Drop)
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.MountPath] = vm.Name
	}
	require.Contains(t, mounts, "/tmp", "large transactions spill to /tmp: it must be writable")
	require.Contains(t, mounts, "/etc/bridge")

	// Resources.
	require.NotEmpty(t, c.Resources.Requests["cpu"])
	require.NotEmpty(t, c.Resources.Requests["memory"])
	limit := quantity(t, c.Resources.Limits["memory"])

	// The ConfigMap's bridge.yaml, with the environment the Deployment sets.
	var cm configMap
	for _, v := range pod.Volumes {
		if v.Name == mounts["/etc/bridge"] {
			require.NotNil(t, v.ConfigMap)
			cm = m.configMaps[v.ConfigMap.Name]
			require.Len(t, v.ConfigMap.Items, 1)
			require.Equal(t, "bridge.yaml", v.ConfigMap.Items[0].Path)
			require.Contains(t, cm.Data, v.ConfigMap.Items[0].Key)
		}
	}
	require.NotEmpty(t, cm.Data["bridge.yaml"], "the config volume's ConfigMap")
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, ok := m.secrets[ref.Name]
			require.True(t, ok, "env %s: no Secret %s", e.Name, ref.Name)
			v, ok := s.StringData[ref.Key]
			require.True(t, ok, "env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			env[e.Name] = v
		case e.ValueFrom != nil:
			t.Fatalf("env %s: unexpected valueFrom", e.Name)
		default:
			env[e.Name] = e.Value
		}
	}
	require.Contains(t, env, "BRIDGE_SOURCES__SHOP__CONFIG__DSN", "the DSN comes from the Secret")
	require.NotContains(t, cm.Data["bridge.yaml"], "CHANGE-ME", "no secrets in the ConfigMap")
	cfg := loadConfig(t, cm.Data["bridge.yaml"], env)
	require.Equal(t, env["BRIDGE_SOURCES__SHOP__CONFIG__DSN"], cfg.Sources["shop"].Config["dsn"])
	require.Equal(t, env["BRIDGE_NATS__PASSWORD"], cfg.NATS.Password)
	require.NotEmpty(t, cfg.NATS.URL, "a NATS cluster, not the embedded server")
	require.Equal(t, 3, cfg.Checkpoint.Replicas, "R3 checkpoints on a cluster")
	for name, s := range cfg.Sinks {
		if s.Type == "nats_jetstream" {
			require.EqualValues(t, 3, s.Config["replicas"], "sinks.%s: R3 stream on a cluster", name)
		}
	}
	if v, ok := env["GOMEMLIMIT"]; ok {
		require.Less(t, quantity(t, v), limit, "GOMEMLIMIT below the memory limit")
	}
	requireConsoleClosed(t, cfg, "deploy/k8s")
	require.False(t, cfg.HTTP.Console, "deploy/k8s: every pod of the cluster reaches the pod's port: the console stays off unless turned on")

	// Probes and ports agree with http.listen.
	port := listenPort(t, cfg.HTTP.Listen)
	require.Len(t, c.Ports, 1)
	require.Equal(t, port, c.Ports[0].ContainerPort, "containerPort = http.listen's port")
	resolve := func(p intOrString) int {
		if p.Name == "" {
			return p.Int
		}
		for _, cp := range c.Ports {
			if cp.Name == p.Name {
				return cp.ContainerPort
			}
		}
		t.Fatalf("no container port named %s", p.Name)
		return 0
	}
	require.NotNil(t, c.LivenessProbe)
	require.NotNil(t, c.LivenessProbe.HTTPGet)
	require.Equal(t, "/livez", c.LivenessProbe.HTTPGet.Path)
	require.Equal(t, port, resolve(c.LivenessProbe.HTTPGet.Port))
	require.NotNil(t, c.ReadinessProbe)
	require.NotNil(t, c.ReadinessProbe.HTTPGet)
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, port, resolve(c.ReadinessProbe.HTTPGet.Port))

	// A clean stop fits in the grace period.
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	need := cfg.Shutdown.Timeout * time.Duration(goodbyes(cfg))
	require.Greater(t, grace, need, "terminationGracePeriodSeconds must exceed shutdown.timeout × %d goodbyes", goodbyes(cfg))

	// The Service reaches the pod's metrics port; the ServiceMonitor the Service.
	require.Len(t, m.services, 1)
	svc := m.services[0]
	for k, v := range svc.Spec.Selector {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "the Service selects the pod")
	}
	require.Len(t, svc.Spec.Ports, 1)
	require.Equal(t, port, resolve(svc.Spec.Ports[0].TargetPort))
	for _, sm := range m.monitors {
		require.Equal(t, "monitoring.coreos.com/v1", sm.APIVersion)
		for k, v := range sm.Spec.Selector.MatchLabels {
			require.Equal(t, v, svc.Metadata.Labels[k], "the ServiceMonitor selects the Service")
		}
		require.Len(t, sm.Spec.Endpoints, 1)
		require.Equal(t, svc.Spec.Ports[0].Name, sm.Spec.Endpoints[0].Port)
		require.Equal(t, "/metrics", sm.Spec.Endpoints[0].Path)
	}
	require.Equal(t, strconv.Itoa(port), d.Spec.Template.Metadata.Annotations["prometheus.io/port"])

	// The kustomization lists every file but the optional ServiceMonitor.
	require.Equal(t, "Kustomization", m.kust.Kind)
	listed := map[string]bool{}
	for _, r := range m.kust.Resources {
		_, err := os.Stat(filepath.Join(k8sDir, r))
		require.NoError(t, err)
		listed[r] = true
	}
	for key, f := range m.files {
		if !strings.HasPrefix(key, "ServiceMonitor/") {
			require.True(t, listed[f], "kustomization.yaml must list %s", f)
		}
	}
	require.Len(t, m.kust.Images, 1)
	require.Equal(t, m.kust.Images[0].Name, strings.Split(c.Image, ":")[0])

	// kubectl, when installed, renders the kustomization offline.
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, kubectl, "kustomize", k8sDir).CombinedOutput()
		require.NoError(t, err, "kubectl kustomize: %s", out)
		require.Contains(t, string(out), "kind: Deployment")
	} else {
		t.Log("kubectl not installed: kustomization not rendered")
	}
}

// ---------------------------------------------------------------------------
// systemd

// unitFile is a parsed systemd unit: section → key → values, in order
// (keys may repeat).
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			require.NotContains(t, u, section, "line %d: section [%s] twice", n, section)
			u[section] = map[string][]string{}
		default:
			require.NotEmpty(t, section, "line %d: key outside a section", n)
			require.False(t, strings.HasSuffix(line, "\\"), "line %d: keep directives on one line", n)
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "line %d: not key=value: %q", n, line)
			u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	require.NoError(t, sc.Err())
	return u
}

func (u unitFile) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func TestSystemdUnit(t *testing.T) {
	const path = "systemd/bridge.service"
	u := parseUnit(t, path)
	for _, s := range []string{"Unit", "Service", "Install"} {
		require.Contains(t, u, s)
	}
	for k, want := range map[string]string{
		"Type":            "simple",
		"User":            "bridge",
		"ExecStart":       "/usr/local/bin/bridge run -c /etc/bridge/bridge.yaml",
		"EnvironmentFile": "-/etc/bridge/bridge.env",
		"Restart":         "on-failure",
		"NoNewPrivileges": "yes",
		"ProtectSystem":   "strict",
		"ReadWritePaths":  "/var/lib/bridge",
		"StateDirectory":  "bridge",
		"KillSignal":      "SIGTERM",
	} {
		assert.Equal(t, want, u.get("Service", k), "[Service] %s", k)
	}
	require.Equal(t, "/var/lib/bridge", u.get("Service", "WorkingDirectory"), "data_dir's default ./data lands in the state directory")
	require.Equal(t, "multi-user.target", u.get("Install", "WantedBy"))
	require.Contains(t, u.get("Unit", "After"), "network-online.target")

	// TimeoutStopSec exceeds the stop of the annotated example config
	// (embedded NATS: one more goodbye) with the default shutdown.timeout.
	stop, err := time.ParseDuration(u.get("Service", "TimeoutStopSec") + "s")
	require.NoError(t, err)
	y, err := os.ReadFile(filepath.Join(root, "bridge.yaml"))
	require.NoError(t, err)
	cfg := loadConfig(t, string(y), nil)
	require.Empty(t, cfg.NATS.URL)
	need := cfg.Shutdown.Timeout * time.Duration(goodbyes(cfg))
	require.Greater(t, stop, need, "TimeoutStopSec must exceed shutdown.timeout × %d goodbyes", goodbyes(cfg))

	// systemd's own checks, when systemd-analyze is installed: the unit
	// with ExecStart pointing at an existing binary must verify without a
	// single complaint.
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: unit not verified by systemd")
		return
	}
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	tmp := filepath.Join(t.TempDir(), "bridge.service")
	require.NoError(t, os.WriteFile(tmp, bytes.ReplaceAll(text, []byte("/usr/local/bin/bridge"), []byte("/bin/true")), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, sa, "verify", tmp).CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify: %s", out)
	for _, line := range strings.Split(string(out), "\n") {
		require.NotContains(t, line, "bridge.service", "systemd-analyze verify complains: %s", out)
	}
	out, err = exec.CommandContext(ctx, sa, "security", "--offline=true", tmp).CombinedOutput()
	if err == nil {
		m := regexp.MustCompile(`Overall exposure level for bridge.service: ([0-9.]+)`).FindSubmatch(out)
		require.NotNil(t, m, "%s", out)
		score, err := strconv.ParseFloat(string(m[1]), 64)
		require.NoError(t, err)
		require.LessOrEqual(t, score, 2.0, "systemd-analyze security exposure (0 best, 10 worst)")
		t.Logf("systemd-analyze security: exposure %.1f", score)
	} else {
		t.Logf("systemd-analyze security --offline not supported here: %s", bytes.TrimSpace(out))
	}
}

// ---------------------------------------------------------------------------
// Documentation links

// slug is GitHub's anchor for a Markdown heading.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of the headings of the Markdown file at path
// (outside code blocks).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]bool{}
	fence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence && strings.HasPrefix(line, "#") {
			out[slug(strings.TrimLeft(line, "#"))] = true
		}
	}
	return out
}

// TestDocsLinks checks every relative link of the documentation: the file
// exists and, when the link names a heading, the heading does.
func TestDocsLinks(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	files = append(files, "README.md", filepath.Join(root, "README.md"))
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		text := regexp.MustCompile("(?s)```.*?```").ReplaceAllString(string(b), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, frag, _ := strings.Cut(link, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
			}
			st, err := os.Stat(path)
			require.NoError(t, err, "%s links to %s", f, link)
			if frag != "" {
				require.False(t, st.IsDir(), "%s: %s", f, link)
				require.True(t, anchors(t, path)[frag], "%s links to %s: no such heading in %s", f, link, path)
			}
		}
	}
}
