package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const producer = "shop.main.e1"

func decoder(raw map[string]any) config.Decoder {
	return (*config.Config)(nil).Decoder("sinks.hooks.config", raw)
}

// request is one request the receiver got.
type request struct {
	header http.Header
	body   []byte
	envs   []Envelope
}

// receiver is an HTTP endpoint recording what it accepted. status, when
// set, picks the answer to each request (n counts from 0); 0 means 200.
type receiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	status   func(n int, r *http.Request) int
	n        int
	accepted []request
	broken   bool
}

func newReceiver(t testing.TB) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	n := rc.n
	rc.n++
	status, broken := rc.status, rc.broken
	rc.mu.Unlock()
	code := http.StatusOK
	if status != nil {
		if c := status(n, r); c != 0 {
			code = c
		}
	}
	if broken {
		code = http.StatusServiceUnavailable
	}
	if code < 200 || code > 299 {
		http.Error(w, "nope: "+http.StatusText(code), code)
		return
	}
	var envs []Envelope
	if bytes.HasPrefix(bytes.TrimSpace(body), []byte("[")) {
		err = json.Unmarshal(body, &envs)
	} else {
		var e Envelope
		err = json.Unmarshal(body, &e)
		envs = []Envelope{e}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.accepted = append(rc.accepted, request{header: r.Header.Clone(), body: body, envs: envs})
	rc.mu.Unlock()
	w.WriteHeader(code)
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.accepted...)
}

func (rc *receiver) setStatus(f func(n int, r *http.Request) int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.status, rc.n = f, 0
}

func (rc *receiver) setBroken(b bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.broken = b
}

// received flattens the accepted requests for sinktest.
func (rc *receiver) received() []sinktest.Received {
	var out []sinktest.Received
	for _, r := range rc.requests() {
		for _, e := range r.envs {
			p := []byte(e.Payload)
			if e.PayloadBase64 != nil {
				p = e.PayloadBase64
			}
			out = append(out, sinktest.Received{ID: e.ID, Subject: e.Subject, Payload: p, Headers: e.Headers})
		}
	}
	return out
}

func newSink(t testing.TB, raw map[string]any) *Sink {
	t.Helper()
	sk, err := New(decoder(raw), sinks.Env{Name: "hooks"})
	require.NoError(t, err)
	s := sk.(*Sink)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	require.NoError(t, s.Connect(t.Context()))
	return s
}

func TestRegistered(t *testing.T) {
	p, err := sinks.Default.Lookup("webhook")
	require.NoError(t, err)
	require.NotNil(t, p.New)
	require.Equal(t, DefaultConfig(), p.Config)
	require.NotEmpty(t, p.Doc)
}

func TestConfig(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		sk, err := New(decoder(map[string]any{"url": "https://h.example/x"}), sinks.Env{})
		require.NoError(t, err)
		want := DefaultConfig()
		want.URL = "https://h.example/x"
		require.Equal(t, want, sk.(*Sink).cfg)
		require.True(t, want.Batch)
		require.Equal(t, 10*time.Second, want.Timeout)
	})
	for _, tc := range []struct {
		name string
		raw  map[string]any
		path string
		msg  string
	}{
		{"url missing", map[string]any{}, "url", "must be set"},
		{"url scheme", map[string]any{"url": "ftp://u:secret@h/x"}, "url", "http:// or https://"},
		{"url without host", map[string]any{"url": "http:///x"}, "url", "with a host"},
		{"timeout", map[string]any{"url": "http://h", "timeout": "0s"}, "timeout", "must be > 0"},
		{"batch not a bool", map[string]any{"url": "http://h", "batch": "yes"}, "batch", "expected a boolean"},
		{"header name", map[string]any{"url": "http://h", "headers": map[string]any{"Bad Header": "secret"}}, "headers.Bad Header", "not a valid header name"},
		{"header reserved", map[string]any{"url": "http://h", "headers": map[string]any{"content-type": "text/plain"}}, "headers.content-type", "set by the sink"},
		{"header value", map[string]any{"url": "http://h", "headers": map[string]any{"X-A": "secret\r\nX-B: 1"}}, "headers.X-A", "line breaks"},
		{"unknown key", map[string]any{"url": "http://h", "batched": true}, "batched", "unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(decoder(tc.raw), sinks.Env{})
			var fe *config.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, "sinks.hooks.config."+tc.path, fe.Path)
			require.Contains(t, fe.Msg, tc.msg)
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// TestDocExample decodes the YAML example of doc.go.
func TestDocExample(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(f.Doc.Text(), "\n") {
		if strings.HasPrefix(l, "\t") {
			lines = append(lines, strings.TrimPrefix(l, "\t"))
		}
	}
	i := strings.Index(strings.Join(lines, "\n"), "sinks:")
	require.GreaterOrEqual(t, i, 0, "doc.go has no indented bridge.yaml example")
	var doc struct {
		Sinks map[string]struct {
			Type   string         `yaml:"type"`
			Batch  map[string]any `yaml:"batch"`
			Config map[string]any `yaml:"config"`
		} `yaml:"sinks"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(strings.Join(lines, "\n")[i:]), &doc))
	hooks := doc.Sinks["hooks"]
	require.Equal(t, "webhook", hooks.Type)
	sk, err := New(decoder(hooks.Config), sinks.Env{})
	require.NoError(t, err)
	cfg := sk.(*Sink).cfg
	require.Equal(t, "https://hooks.example.com/cdc", cfg.URL)
	require.True(t, cfg.Batch)
	require.Equal(t, 5*time.Second, cfg.Timeout)
	require.Equal(t, map[string]string{"Authorization": "Bearer ${HOOK_TOKEN}"}, cfg.Headers)
}

func TestBatchRequest(t *testing.T) {
	rc := newReceiver(t)
	s := newSink(t, map[string]any{"url": rc.srv.URL + "/cdc", "headers": map[string]any{"Authorization": "Bearer t0k"}})
	batch := sinktest.Changes(7, producer)
	require.NoError(t, s.Write(t.Context(), batch))

	reqs := rc.requests()
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.Equal(t, batch[0].ID()+".."+batch[6].ID(), r.header.Get("Idempotency-Key"))
	require.Equal(t, "Bearer t0k", r.header.Get("Authorization"))
	require.Empty(t, r.header.Get("Traceparent"), "change headers go in the envelopes with batch: true")
	require.True(t, json.Valid(r.body))
	require.Len(t, r.envs, 7)
	for i, e := range r.envs {
		require.Equal(t, batch[i].ID(), e.ID)
		require.Equal(t, batch[i].Subject, e.Subject)
		require.Equal(t, batch[i].Headers, e.Headers)
		require.Equal(t, string(batch[i].Payload), string(e.Payload), "payload embedded verbatim")
		require.Nil(t, e.PayloadBase64)
	}

	require.NoError(t, s.Write(t.Context(), batch[:1]))
	require.Equal(t, batch[0].ID(), rc.requests()[1].header.Get("Idempotency-Key"), "a batch of one has the change's id")
}

func TestPerChangeRequests(t *testing.T) {
	rc := newReceiver(t)
	s := newSink(t, map[string]any{"url": rc.srv.URL, "batch": false, "headers": map[string]any{"X-Tenant": "acme"}})
	batch := sinktest.Changes(5, producer)
	batch[1].Headers["X-Tenant"] = "forged"     // configured headers win
	batch[2].Headers["Idempotency-Key"] = "bad" // the sink's own win
	require.NoError(t, s.Write(t.Context(), batch))

	reqs := rc.requests()
	require.Len(t, reqs, 5)
	for i, r := range reqs {
		c := &batch[i]
		require.Equal(t, c.ID(), r.header.Get("Idempotency-Key"))
		require.Equal(t, c.Headers["traceparent"], r.header.Get("Traceparent"))
		require.Equal(t, "acme", r.header.Get("X-Tenant"))
		require.Len(t, r.envs, 1)
		require.Equal(t, c.ID(), r.envs[0].ID)
		require.Equal(t, string(c.Payload), string(r.envs[0].Payload))
		require.False(t, bytes.HasPrefix(r.body, []byte("[")), "one envelope, not an array")
	}
}

func TestPayloadNotJSON(t *testing.T) {
	rc := newReceiver(t)
	s := newSink(t, map[string]any{"url": rc.srv.URL})
	batch := sinktest.Changes(2, producer)
	batch[0].Payload = []byte{0xff, 0x00, '{'}
	batch[1].Payload = nil
	require.NoError(t, s.Write(t.Context(), batch))
	envs := rc.requests()[0].envs
	require.Nil(t, envs[0].Payload)
	require.Equal(t, batch[0].Payload, envs[0].PayloadBase64)
	require.Nil(t, envs[1].Payload)
	require.Nil(t, envs[1].PayloadBase64)
}

func TestStatus(t *testing.T) {
	rc := newReceiver(t)
	s := newSink(t, map[string]any{"url": rc.srv.URL})
	batch := sinktest.Changes(3, producer)
	for _, tc := range []struct {
		code      int
		ok        bool
		permanent bool
	}{
		{200, true, false}, {201, true, false}, {202, true, false}, {204, true, false},
		{400, false, true}, {401, false, true}, {403, false, true}, {404, false, true}, {409, false, true},
		{413, false, true}, {422, false, true},
		{408, false, false}, {429, false, false},
		{500, false, false}, {502, false, false}, {503, false, false}, {504, false, false},
		{301, false, true}, {302, false, true}, {307, false, true},
	} {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			rc.setStatus(func(int, *http.Request) int { return tc.code })
			err := s.Write(t.Context(), batch)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Equal(t, tc.permanent, sinks.IsPermanent(err), "%v", err)
			require.ErrorContains(t, err, http.StatusText(tc.code))
		})
	}
	t.Run("body quoted", func(t *testing.T) {
		rc.setStatus(func(int, *http.Request) int { return 422 })
		require.ErrorContains(t, s.Write(t.Context(), batch), `"nope: Unprocessable Entity"`)
	})
}

func TestPerChangeFailure(t *testing.T) {
	for _, tc := range []struct {
		code      int
		permanent bool
	}{{503, false}, {400, true}} {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			rc := newReceiver(t)
			s := newSink(t, map[string]any{"url": rc.srv.URL, "batch": false})
			rc.setStatus(func(n int, _ *http.Request) int {
				if n == 2 {
					return tc.code
				}
				return 0
			})
			batch := sinktest.Changes(6, producer)
			err := s.Write(t.Context(), batch)
			var berr *sinks.BatchError
			require.ErrorAs(t, err, &berr)
			require.Equal(t, []int{2, 3, 4, 5}, berr.Indexes())
			require.Equal(t, tc.permanent, sinks.IsPermanent(berr.Failed[2]))
			for i := 3; i < 6; i++ {
				require.ErrorIs(t, berr.Failed[i], errSkipped)
				require.False(t, sinks.IsPermanent(berr.Failed[i]))
			}
			require.Len(t, rc.requests(), 2, "nothing sent after the failure")
			require.Equal(t, batch[1].ID(), rc.requests()[1].envs[0].ID)
		})
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	s := newSink(t, map[string]any{"url": srv.URL, "timeout": "100ms"})
	start := time.Now()
	err := s.Write(t.Context(), sinktest.Changes(2, producer))
	require.Less(t, time.Since(start), time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "no response within timeout 100ms")
	require.False(t, sinks.IsPermanent(err))

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	require.ErrorIs(t, s.Write(ctx, sinktest.Changes(2, producer)), context.DeadlineExceeded, "ctx bounds the request too")
	require.Less(t, time.Since(start), 500*time.Millisecond)
}

func TestSecretsNotEchoed(t *testing.T) {
	// Nothing listens on port 1: connection refused, a retryable error.
	s := newSink(t, map[string]any{"url": "http://bob:hunter2@127.0.0.1:1/hook?token=s3cret"})
	err := s.Write(t.Context(), sinktest.Changes(1, producer))
	require.Error(t, err)
	require.False(t, sinks.IsPermanent(err))
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "s3cret")
	require.Contains(t, err.Error(), "http://127.0.0.1:1/hook")
}

// TestAnswerScrubbed: a receiver that echoes the request in its error
// answer (the Authorization header, or the token alone) does not put the
// secret into the bridge's errors and logs.
func TestAnswerScrubbed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		auth := r.Header.Get("Authorization")
		_, _ = fmt.Fprintf(w, "bad auth %q, token %s", auth, strings.TrimPrefix(auth, "Bearer "))
	}))
	t.Cleanup(srv.Close)
	s := newSink(t, map[string]any{"url": srv.URL, "headers": map[string]any{"Authorization": "Bearer tok-s3cret-123"}})
	err := s.Write(t.Context(), sinktest.Changes(1, producer))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
	require.Contains(t, err.Error(), "bad auth")
}

// TestPlainHTTPWarned: an http:// url to another machine is warned about
// at start (rows and headers in clear); loopback is not.
func TestPlainHTTPWarned(t *testing.T) {
	for _, tc := range []struct {
		url  string
		warn bool
	}{{"http://hooks.example.com/in", true}, {"http://10.0.0.7:8080/in", true}, {"https://hooks.example.com/in", false},
		{"http://127.0.0.1:9/in", false}, {"http://localhost:9/in", false}, {"http://[::1]:9/in", false}} {
		var logs bytes.Buffer
		sk, err := New(decoder(map[string]any{"url": tc.url}), sinks.Env{Name: "hooks", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		require.NoError(t, sk.Close(t.Context()))
		require.Equal(t, tc.warn, strings.Contains(logs.String(), "cross the network in clear"), "%s: %s", tc.url, logs.String())
	}
}

func TestInstancesIndependent(t *testing.T) {
	rc := newReceiver(t)
	a := newSink(t, map[string]any{"url": rc.srv.URL, "headers": map[string]any{"X-Who": "a"}})
	b := newSink(t, map[string]any{"url": rc.srv.URL, "batch": false, "headers": map[string]any{"X-Who": "b"}})
	require.NoError(t, a.Write(t.Context(), sinktest.Changes(2, "x.a.e1")))
	require.NoError(t, a.Close(t.Context()))
	require.NoError(t, b.Write(t.Context(), sinktest.Changes(2, "x.b.e1")), "closing a leaves b alone")
	reqs := rc.requests()
	require.Len(t, reqs, 3)
	require.Equal(t, []string{"a", "b", "b"}, []string{reqs[0].header.Get("X-Who"), reqs[1].header.Get("X-Who"), reqs[2].header.Get("X-Who")})
}

func TestClose(t *testing.T) {
	rc := newReceiver(t)
	s := newSink(t, map[string]any{"url": rc.srv.URL})
	require.NoError(t, s.Close(t.Context()))
	require.NoError(t, s.Close(t.Context()))
	require.True(t, sinks.IsPermanent(s.Write(t.Context(), sinktest.Changes(1, producer))))
	require.True(t, sinks.IsPermanent(s.Connect(t.Context())))
	require.Empty(t, rc.requests())
}

// TestConformance runs the sinktest suite in both modes; Break makes the
// receiver answer 503.
func TestConformance(t *testing.T) {
	for _, batch := range []bool{true, false} {
		name := "batch"
		if !batch {
			name = "per_change"
		}
		t.Run(name, func(t *testing.T) {
			rc := newReceiver(t)
			sinktest.Run(t, sinktest.Harness{
				Type:  "webhook",
				YAML:  "url: " + rc.srv.URL + "/cdc\ntimeout: 2s\nbatch: " + map[bool]string{true: "true", false: "false"}[batch] + "\n",
				Read:  func(*testing.T) []sinktest.Received { return rc.received() },
				Break: func(*testing.T) { rc.setBroken(true) },
				Heal:  func(*testing.T) { rc.setBroken(false) },
			})
		})
	}
}
