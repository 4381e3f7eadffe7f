package app

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/httpguard"
	"github.com/bridgecdc/bridge/internal/reload"
)

// The App's HTTP listener (http.listen): /metrics, /livez and /readyz,
// the web console under /console/ (console.go), behind the Host and
// Origin checks of internal/httpguard (http.allowed_hosts),
// over TLS with http.tls (reloaded on SIGHUP and when the files change),
// /metrics behind http.token when it is set.

// validateHTTP checks what the config package leaves to the runtime: that
// the files of http.tls load. Errors name their YAML path.
func validateHTTP(cfg *config.Config) []error {
	if cfg.HTTP.Listen == "" {
		return nil
	}
	return reload.Check("http.tls", cfg.HTTP.TLS)
}

// startHTTP listens on http.listen and serves /metrics, /livez and /readyz.
func (a *App) startHTTP() error {
	hc := a.cfg.HTTP
	addr := hc.Listen
	if addr == "" {
		return nil
	}
	var stls *reload.ServerTLS
	if hc.TLS.Enabled() {
		var err error
		if stls, err = reload.NewServerTLS("http.tls", hc.TLS, a.log); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http.listen: serving /metrics on %s: %w (choose another address, or set it to \"\" to turn the server off)", addr, err)
	}
	metrics := promhttp.HandlerFor(a.metrics.Registry(), promhttp.HandlerOpts{})
	if hc.Token != "" {
		metrics = requireToken(hc.Token, metrics)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	stopConsole, err := a.mountConsole(mux) // console.go
	if err != nil {
		_ = ln.Close()
		return err
	}
	// On loopback only this machine's names are served (DNS rebinding), and
	// a state-changing request must come from the console's own page.
	guard := httpguard.New(httpguard.Options{Listen: addr, Hosts: hc.AllowedHosts, Key: "http.allowed_hosts", Log: a.log})
	a.httpSrv = &http.Server{Handler: guard.Handler(mux), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 16 << 10, ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)}
	a.httpAddr = ln.Addr().String()
	srv := a.httpSrv
	srv.RegisterOnShutdown(stopConsole)
	scheme := "http"
	if stls != nil {
		scheme = "https"
		srv.TLSConfig = stls.Config()
		ctx, cancel := context.WithCancel(context.Background())
		srv.RegisterOnShutdown(cancel)
		if err := stls.Watch(ctx, reload.OnSIGHUP(ctx)); err != nil {
			cancel()
			_ = ln.Close()
			return fmt.Errorf("http.tls: %w", err)
		}
		go func() { _ = srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { _ = srv.Serve(ln) }()
	}
	a.log.Info("serving /metrics, /livez and /readyz", "addr", a.httpAddr, "scheme", scheme, "metrics_token", hc.Token != "", "mutual_tls", hc.TLS.ClientCAFile != "")
	if hc.Token != "" && stls == nil && !config.IsLoopback(addr) {
		a.log.Warn("http.token crosses the network in clear: set http.tls to serve /metrics over HTTPS", "addr", a.httpAddr)
	}
	return nil
}

// requireToken lets a request through to next only with "Authorization:
// Bearer <token>"; others get 401 with WWW-Authenticate.
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="bridge metrics"`)
			http.Error(w, "unauthorized: /metrics needs Authorization: Bearer <http.token>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// readyz answers 200 when every pipeline is streaming and its checkpoint
// keeps up with deliveries (http.max_checkpoint_age), else 503; the body
// has a line per source.
func (a *App) readyz(w http.ResponseWriter, _ *http.Request) {
	maxAge := a.cfg.HTTP.MaxCheckpointAge
	if maxAge <= 0 {
		maxAge = defaultMaxCheckpointAge
	}
	pipes := a.metrics.Pipes()
	ok := len(pipes) > 0
	var b strings.Builder
	if len(pipes) == 0 {
		b.WriteString("starting\n")
	}
	now := time.Now()
	for _, pt := range pipes {
		age := pt.CheckpointAge(now)
		p := pt.State()
		switch {
		case !p.Ready():
			ok = false
			fmt.Fprintf(&b, "%s: not streaming\n", pt.Source())
		case age > maxAge:
			ok = false
			fmt.Fprintf(&b, "%s: checkpoint %s behind deliveries (max %s)\n", pt.Source(), age.Round(time.Millisecond), maxAge)
		default:
			fmt.Fprintf(&b, "%s: streaming, checkpoint %s\n", pt.Source(), p.Checkpointed())
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(b.String()))
}
