package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/console"
	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/buildinfo"
)

// The web console (bridge/console) on the HTTP listener: mounted by
// startHTTP when http.console is on; its API behind serve.auth when that
// is set, and served beyond loopback only then.

// WithConsoleInterval sets the time between two samples of the console's
// history (default 10s, an hour in 360 samples). For tests.
func WithConsoleInterval(d time.Duration) Option { return func(a *App) { a.consoleEvery = d } }

// ConsoleOff returns why the web console is not served on http.listen
// with cfg, in one line, or "" when it is: http.console is off; the
// listener is beyond loopback and serve.auth is not set; or serve.auth is
// an authenticating proxy's header (serve.client_header) and http.listen
// can be reached without the proxy (not loopback, no mutual TLS), so that
// anyone could send the header.
func ConsoleOff(cfg *config.Config) string {
	hc := cfg.HTTP
	if !hc.Console {
		return "" // not served, and nothing to say: it was turned off
	}
	l := consoleListener(hc)
	switch mode := cfg.Serve.EffectiveMode(); {
	case !config.IsLoopback(hc.Listen) && mode == config.AuthNone:
		return fmt.Sprintf("the web console is off: http.listen %q is beyond loopback and serve.auth is not set; set serve.auth (JWTs with the bridge:status and bridge:control scopes) to serve it there, or http.console: false to silence this", hc.Listen)
	case mode == config.AuthProxy && !l.ProxyTrusted():
		return fmt.Sprintf("the web console is off: http.listen %q can be reached without the authenticating proxy, so anyone could send serve.client_header %q; listen on 127.0.0.1 behind a proxy on the same host, require the proxy's certificate with http.tls.client_ca_file, use JWTs (serve.auth), or set http.console: false to silence this", hc.Listen, cfg.Serve.ClientHeader)
	}
	return ""
}

// consoleListener describes http.listen for serve.Auth.On.
func consoleListener(hc config.HTTP) serve.Listener {
	return serve.Listener{Key: "http.listen", Addr: hc.Listen, TLS: hc.TLS.Enabled(), MutualTLS: hc.TLS.ClientCAFile != ""}
}

// mountConsole mounts the console on mux, or nothing when http.console is
// off, or a page saying why when it is not allowed (ConsoleOff); stop ends
// its sampler and its tail.
func (a *App) mountConsole(mux *http.ServeMux) (stop func(), err error) {
	hc := a.cfg.HTTP
	if !hc.Console {
		return func() {}, nil
	}
	mode := a.cfg.Serve.EffectiveMode()
	if off := ConsoleOff(a.cfg); off != "" {
		a.log.Warn(off, "addr", hc.Listen)
		mux.HandleFunc(console.Prefix, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "console-off", "detail": off})
		})
		return func() {}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	sc, fc, err := serve.FromConfig(ctx, a.cfg.Serve, a.log)
	if err != nil {
		cancel()
		return nil, err
	}
	// On http.listen, not serve.listen: whether the proxy's header and a
	// token in the URL are trusted depends on this listener.
	sc.Auth = sc.Auth.On(consoleListener(hc))
	var allow func(*http.Request, bool) (string, error)
	if auth := sc.Auth; auth != nil {
		allow = func(r *http.Request, control bool) (string, error) {
			scope := serve.ScopeStatus
			if control {
				scope = serve.ScopeControl
			}
			who, err := auth.Permit(r, scope)
			if auth.Mode() == config.AuthProxy {
				return fmt.Sprintf("proxy user %q", who), err
			}
			return fmt.Sprintf("token sub %q", who), err
		}
	}
	tail := &consoleTail{a: a, sc: sc, fc: fc, ctx: ctx}
	c, err := console.New(console.Options{
		Status:   a.consoleStatus,
		Gatherer: a.metrics.Registry(),
		Actions:  controlBridge{a},
		Protect:  sc.Auth.Protect,
		Allow:    allow,
		Feed:     tail,
		Interval: a.consoleEvery,
		Log:      a.log,
	})
	if err != nil {
		cancel()
		return nil, err
	}
	mux.Handle(console.Prefix, c.Handler())
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	done := make(chan struct{})
	var started atomic.Bool
	a.mu.Lock()
	a.consoleRun = func() {
		started.Store(true)
		go func() { defer close(done); c.Run(ctx) }()
	}
	a.mu.Unlock()
	auth := "none (loopback)"
	if sc.Auth != nil {
		auth = "serve.auth " + mode
	}
	a.log.Info("web console", "url", "/console/", "auth", auth)
	if !config.IsLoopback(hc.Listen) && !hc.TLS.Enabled() {
		a.log.Warn("the web console's tokens and rows cross the network in clear: set http.tls to serve it over HTTPS", "addr", hc.Listen)
	}
	return func() {
		cancel()
		if started.Load() {
			<-done
		}
		tail.close()
	}, nil
}

// startConsole starts the console's sampler, once Start has built the
// pipelines: its status reads what Start writes.
func (a *App) startConsole() {
	a.mu.Lock()
	run := a.consoleRun
	a.consoleRun = nil
	a.mu.Unlock()
	if run != nil {
		run()
	}
}

// consoleStatus is the control plane's status once Run runs; before, the
// bridge's identity only (Start is still writing what status reads).
func (a *App) consoleStatus(ctx context.Context) control.StatusReply {
	a.mu.Lock()
	starting := a.consoleRun != nil
	a.mu.Unlock()
	if starting {
		return control.StatusReply{Identity: control.Identity{Bridge: a.cfg.Name, Instance: a.run, Version: buildinfo.String()},
			ConfigFrom: "(starting)", Sources: []control.SourceStatus{}}
	}
	return controlBridge{a}.Status(ctx)
}

// consoleTail serves the console's live tail: `bridge serve`'s feed
// handler over the stream the bridge writes, built at the first request
// (the stream exists only once the sinks started).
type consoleTail struct {
	a   *App
	sc  serve.Config
	fc  feeds.Config
	ctx context.Context

	mu sync.Mutex
	fs *feeds.Feeds
	h  http.Handler
}

// stream picks the stream to tail: serve.stream when the bridge writes
// it, else the first stream a source's nats_jetstream sink writes.
func (t *consoleTail) stream() string {
	var written []string
	for _, r := range t.a.runnerList() {
		for _, s := range r.streams {
			if _, name, ok := strings.Cut(s, ": "); ok {
				written = append(written, name)
			}
		}
	}
	if len(written) == 0 || slices.Contains(written, t.fc.Stream) {
		return t.fc.Stream
	}
	return written[0]
}

func (t *consoleTail) handler() (http.Handler, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h != nil {
		return t.h, nil
	}
	js := t.a.jetStream()
	if js == nil {
		return nil, errNotStarted
	}
	fc := t.fc
	fc.Stream = t.stream()
	fs, err := feeds.New(t.ctx, js, fc)
	if err != nil {
		return nil, err
	}
	t.fs, t.h = fs, serve.New(fs, t.sc, t.a.log).Handler()
	return t.h, nil
}

func (t *consoleTail) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, err := t.handler()
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "no-tail", "detail": "the live tail cannot read the stream: " + err.Error()})
		return
	}
	h.ServeHTTP(w, r)
}

func (t *consoleTail) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fs != nil {
		t.fs.Close()
		t.fs, t.h = nil, nil
	}
}

// errNotStarted answers a tail requested before the App reached NATS.
var errNotStarted = errors.New("the bridge is starting; retry in a moment")

// jetStream returns the App's JetStream context once Run runs (the
// console's sampler started), nil before.
func (a *App) jetStream() jetstream.JetStream {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.consoleRun != nil {
		return nil
	}
	return a.js
}
