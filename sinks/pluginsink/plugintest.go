package pluginsink

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

// describe starts the plugin of a config block and returns one line about it.
func describe(decode config.Decoder, env sinks.Env) (string, error) {
	cfg := DefaultConfig()
	if err := decode(&cfg); err != nil {
		return "", err
	}
	s, err := Start(cfg, env)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Close(ctx)
	d := s.Describe()
	kind := "at least once"
	switch {
	case d.GetResumes():
		kind = "exactly once (resumes)"
	case d.GetDedupes():
		kind = "exactly once in effect (dedupes)"
	}
	return fmt.Sprintf("%s %s, contract v1.%d, %s: %s", d.GetName(), d.GetVersion(), d.GetContractMinor(), kind, d.GetDoc()), nil
}

// Test runs sinktest.Run against the plugin executable at path: see
// sinks.Exec.Test. The plugin must serve Conformance.Read (the suite reads
// back what the destination holds through it); without Break and Heal the
// failure cases are skipped.
func Test(path string, args []string, block map[string]any) (bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	sum, err := FileSHA256(abs)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", path, err)
	}
	if block == nil {
		block = map[string]any{}
	}
	raw := map[string]any{"command": abs, "sha256": sum, "args": args, "config": block}
	cfg := DefaultConfig()
	if err := (*config.Config)(nil).Decoder("plugin", raw)(&cfg); err != nil {
		return false, err
	}
	reader, err := Start(cfg, sinks.Env{Name: "plugin_test"})
	if err != nil {
		return false, err
	}
	defer reader.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := reader.Read(ctx); err != nil {
		if errors.Is(err, ErrNoConformance) {
			return false, fmt.Errorf("%s: serve bridge.plugin.v1.Conformance (Read at least) so that `bridge plugin test` can read back what the plugin wrote", err)
		}
		return false, err
	}
	y, err := yaml.Marshal(raw)
	if err != nil {
		return false, err
	}
	d := reader.Describe()
	h := sinktest.Harness{
		Type:    Type,
		YAML:    string(y),
		Dedupes: d.GetDedupes(),
		Read: func(t *testing.T) []sinktest.Received {
			recs, err := reader.Read(t.Context())
			if err != nil {
				t.Fatalf("reading back: %v", err)
			}
			out := make([]sinktest.Received, len(recs))
			for i, r := range recs {
				out[i] = sinktest.Received{ID: r.GetId(), Subject: r.GetSubject(), Payload: r.GetPayload(), Headers: r.GetHeaders()}
				if out[i].Headers == nil {
					out[i].Headers = map[string]string{}
				}
			}
			return out
		},
	}
	if reader.CanBreak(ctx) {
		h.Break = func(t *testing.T) {
			if err := reader.Break(t.Context()); err != nil {
				t.Fatalf("Break: %v", err)
			}
		}
		h.Heal = func(t *testing.T) {
			if err := reader.Heal(t.Context()); err != nil {
				t.Fatalf("Heal: %v", err)
			}
		}
	}
	fmt.Printf("bridge plugin test: %s (sha256 %s): %s %s, contract v1.%d, resumes %t, dedupes %t\n",
		path, sum, d.GetName(), d.GetVersion(), d.GetContractMinor(), d.GetResumes(), d.GetDedupes())
	tests := []testing.InternalTest{{Name: "TestPluginConformance", F: func(t *testing.T) { sinktest.Run(t, h) }}}
	m := testing.MainStart(deps{}, tests, nil, nil, nil)
	_ = flag.Set("test.v", "true") // registered by MainStart (testing.Init)
	return m.Run() == 0, nil
}

// deps is what testing.MainStart needs to run tests outside `go test`.
type deps struct{}

func (deps) ImportPath() string                        { return "bridge plugin test" }
func (deps) ModulePath() string                        { return "" }
func (deps) MatchString(pat, str string) (bool, error) { return regexp.MatchString(pat, str) }
func (deps) SetPanicOnExit0(bool)                      {}
func (deps) StartCPUProfile(io.Writer) error           { return errors.New("not supported") }
func (deps) StopCPUProfile()                           {}
func (deps) StartTestLog(io.Writer)                    {}
func (deps) StopTestLog() error                        { return nil }
func (deps) WriteProfileTo(string, io.Writer, int) error {
	return errors.New("not supported")
}
func (deps) CoordinateFuzzing(time.Duration, int64, time.Duration, int64, int, []corpusEntry, []reflect.Type, string, string) error {
	return errors.New("not supported")
}
func (deps) RunFuzzWorker(func(corpusEntry) error) error { return errors.New("not supported") }
func (deps) ReadCorpus(string, []reflect.Type) ([]corpusEntry, error) {
	return nil, nil
}
func (deps) CheckCorpus([]any, []reflect.Type) error { return nil }
func (deps) ResetCoverage()                          {}
func (deps) SnapshotCoverage()                       {}
func (deps) InitRuntimeCoverage() (string, func(string, string) (string, error), func() float64) {
	return "", nil, nil
}

// corpusEntry is testing's (an alias of this struct type there).
type corpusEntry = struct {
	Parent     string
	Path       string
	Data       []byte
	Values     []any
	Generation int
	IsSeed     bool
}
