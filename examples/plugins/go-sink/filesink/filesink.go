// Package filesink is the example out-of-process sink: it appends each
// change to a file as a JSON line and keeps every change once, by id, so it
// can declare that it resumes (exactly once across crashes of the bridge
// and of itself). It serves pluginv1's Sink and Conformance services; main
// calls pluginv1.Serve with it.
//
// Its config block (bridge.yaml: sinks.<name>.config.config):
//
//	path: /var/lib/cdc/changes.jsonl   # required: the file, created if missing
//	pid_file: /run/cdc-sink.pid        # optional: written with the process id
//	dedupe: true                       # default; false writes a change again when sent again
//
// With dedupe: false the plugin still resumes: the bridge asks it what it
// holds (Delivered) after a crash of either side, and after a Write it gave
// up on (a deadline), and does not send that again, so every change is
// still written once. One mutex orders every RPC, so Delivered answers
// after a Write still under way has finished.
// The cursor is the number of lines the file held after a Write; Delivered
// returns the ids of the lines after it. A line cut short by a crash is
// dropped when the file is opened again. Break and Heal (for `bridge plugin
// test`) create and remove "<path>.broken", which makes Connect and Write
// fail until it is gone.
package filesink

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
)

// Line is one change in the file.
type Line struct {
	ID      string            `json:"id"`
	Subject string            `json:"subject"`
	Headers map[string]string `json:"headers,omitempty"`
	Payload []byte            `json:"payload"`
}

// Config is the plugin's config block.
type Config struct {
	Path     string `json:"path"`
	PIDFile  string `json:"pid_file"`
	NoDedupe bool   `json:"-"`
}

// Sink is the plugin. The bridge calls its RPCs one at a time for Write;
// a mutex guards the rest.
type Sink struct {
	pluginv1.UnimplementedSinkServer
	pluginv1.UnimplementedConformanceServer

	mu    sync.Mutex
	cfg   Config
	f     *os.File
	ids   map[string]struct{}
	lines int
}

// New returns an unconfigured sink.
func New() *Sink { return &Sink{} }

// Describe says the sink resumes and dedupes.
func (s *Sink) Describe(context.Context, *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{
		ContractMinor: pluginv1.ContractMinor,
		Name:          "go-sink",
		Version:       "0.1.0",
		Doc:           "appends each change to a file as a JSON line, once per id (example)",
		Resumes:       true,
		Dedupes:       !s.cfg.NoDedupe,
	}, nil
}

// Configure decodes the block strictly.
func (s *Sink) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	var raw map[string]any
	resp := &pluginv1.ConfigureResponse{}
	if err := json.Unmarshal(req.GetConfigJson(), &raw); err != nil {
		resp.FieldErrors = append(resp.FieldErrors, &pluginv1.FieldError{Key: "", Message: "not a JSON object: " + err.Error()})
		return resp, nil
	}
	var cfg Config
	for k, v := range raw {
		if k == "dedupe" {
			b, ok := v.(bool)
			if !ok {
				resp.FieldErrors = append(resp.FieldErrors, &pluginv1.FieldError{Key: k, Message: fmt.Sprintf("expected true or false, got %T", v)})
			}
			cfg.NoDedupe = !b
			continue
		}
		str, ok := v.(string)
		switch {
		case k != "path" && k != "pid_file":
			resp.FieldErrors = append(resp.FieldErrors, &pluginv1.FieldError{Key: k, Message: "unknown key (known: path, pid_file, dedupe)"})
		case !ok:
			resp.FieldErrors = append(resp.FieldErrors, &pluginv1.FieldError{Key: k, Message: fmt.Sprintf("expected a string, got %T", v)})
		case k == "path":
			cfg.Path = str
		default:
			cfg.PIDFile = str
		}
	}
	if cfg.Path == "" && len(resp.FieldErrors) == 0 {
		resp.FieldErrors = append(resp.FieldErrors, &pluginv1.FieldError{Key: "path", Message: "must be set"})
	}
	if len(resp.FieldErrors) == 0 {
		s.mu.Lock()
		s.cfg = cfg
		s.mu.Unlock()
		if cfg.PIDFile != "" {
			if err := os.WriteFile(cfg.PIDFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
				return nil, fmt.Errorf("writing pid_file: %w", err)
			}
		}
	}
	return resp, nil
}

func (s *Sink) broken() bool {
	_, err := os.Stat(s.cfg.Path + ".broken")
	return err == nil
}

// Connect opens the file and loads the ids it holds.
func (s *Sink) Connect(context.Context, *pluginv1.ConnectRequest) (*pluginv1.ConnectResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.open(); err != nil {
		// A missing directory will not appear by retrying: permanent.
		_, derr := os.Stat(filepath.Dir(s.cfg.Path))
		return &pluginv1.ConnectResponse{Error: &pluginv1.Error{Message: err.Error(), Permanent: errors.Is(derr, os.ErrNotExist)}}, nil
	}
	return &pluginv1.ConnectResponse{}, nil
}

func (s *Sink) open() error {
	if s.cfg.Path == "" {
		return errors.New("not configured")
	}
	if s.broken() {
		return fmt.Errorf("%s is broken (%s.broken exists)", s.cfg.Path, s.cfg.Path)
	}
	if s.f != nil {
		return nil
	}
	lines, size, err := readLines(s.cfg.Path)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(s.cfg.Path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil { // a line cut short by a crash
		f.Close()
		return err
	}
	if _, err := f.Seek(size, 0); err != nil {
		f.Close()
		return err
	}
	s.f, s.ids, s.lines = f, make(map[string]struct{}, len(lines)), len(lines)
	for _, l := range lines {
		s.ids[l.ID] = struct{}{}
	}
	return nil
}

// readLines returns the whole lines of path and their size in bytes.
func readLines(path string) ([]Line, int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	end := bytes.LastIndexByte(data, '\n') + 1
	var out []Line
	sc := bufio.NewScanner(bytes.NewReader(data[:end]))
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, 0, fmt.Errorf("reading %s line %d: %w", path, len(out)+1, err)
		}
		out = append(out, l)
	}
	return out, int64(end), sc.Err()
}

// Write appends the changes it does not hold yet and syncs the file.
func (s *Sink) Write(_ context.Context, req *pluginv1.WriteRequest) (*pluginv1.WriteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return &pluginv1.WriteResponse{Error: &pluginv1.Error{Message: "not connected", NotConnected: true}}, nil
	}
	if s.broken() {
		return &pluginv1.WriteResponse{Error: &pluginv1.Error{Message: s.cfg.Path + " is broken"}}, nil
	}
	var buf []byte
	var added []string
	for _, c := range req.GetChanges() {
		if _, ok := s.ids[c.GetId()]; ok && !s.cfg.NoDedupe {
			continue
		}
		b, err := json.Marshal(Line{ID: c.GetId(), Subject: c.GetSubject(), Headers: c.GetHeaders(), Payload: c.GetPayload()})
		if err != nil {
			return &pluginv1.WriteResponse{Error: &pluginv1.Error{Message: err.Error(), Permanent: true}}, nil
		}
		buf = append(append(buf, b...), '\n')
		added = append(added, c.GetId())
	}
	if len(buf) > 0 {
		if _, err := s.f.Write(buf); err != nil {
			return &pluginv1.WriteResponse{Error: &pluginv1.Error{Message: err.Error(), NotConnected: true}}, nil
		}
		if err := s.f.Sync(); err != nil {
			return &pluginv1.WriteResponse{Error: &pluginv1.Error{Message: err.Error(), NotConnected: true}}, nil
		}
		for _, id := range added {
			s.ids[id] = struct{}{}
		}
		s.lines += len(added)
	}
	return &pluginv1.WriteResponse{Cursor: strconv.Itoa(s.lines)}, nil
}

// Delivered returns the ids of producer's lines after cursor.
func (s *Sink) Delivered(_ context.Context, req *pluginv1.DeliveredRequest) (*pluginv1.DeliveredResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from := 0
	if req.GetCursor() != "" {
		n, err := strconv.Atoi(req.GetCursor())
		if err != nil {
			return nil, fmt.Errorf("cursor %q: %w", req.GetCursor(), err)
		}
		from = n
	}
	lines, _, err := readLines(s.cfg.Path)
	if err != nil {
		return nil, err
	}
	resp := &pluginv1.DeliveredResponse{}
	for i := from; i < len(lines); i++ {
		if strings.HasPrefix(lines[i].ID, req.GetProducer()+":") {
			resp.Ids = append(resp.Ids, lines[i].ID)
		}
	}
	return resp, nil
}

// Close closes the file.
func (s *Sink) Close(context.Context, *pluginv1.CloseRequest) (*pluginv1.CloseResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		err := s.f.Close()
		s.f = nil
		if err != nil {
			return &pluginv1.CloseResponse{Error: &pluginv1.Error{Message: err.Error()}}, nil
		}
	}
	return &pluginv1.CloseResponse{}, nil
}

// Read returns every line of the file.
func (s *Sink) Read(context.Context, *pluginv1.ReadRequest) (*pluginv1.ReadResponse, error) {
	s.mu.Lock()
	path := s.cfg.Path
	s.mu.Unlock()
	lines, _, err := readLines(path)
	if err != nil {
		return nil, err
	}
	resp := &pluginv1.ReadResponse{}
	for _, l := range lines {
		resp.Records = append(resp.Records, &pluginv1.Record{Id: l.ID, Subject: l.Subject, Payload: l.Payload, Headers: l.Headers})
	}
	return resp, nil
}

// Break makes the destination fail until Heal.
func (s *Sink) Break(context.Context, *pluginv1.BreakRequest) (*pluginv1.BreakResponse, error) {
	return &pluginv1.BreakResponse{}, os.WriteFile(s.cfg.Path+".broken", nil, 0o644)
}

// Heal undoes Break.
func (s *Sink) Heal(context.Context, *pluginv1.HealRequest) (*pluginv1.HealResponse, error) {
	err := os.Remove(s.cfg.Path + ".broken")
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return &pluginv1.HealResponse{}, err
}
