package app

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The App's HTTP listener (http.listen): /metrics, /livez and /readyz.

// startHTTP listens on http.listen and serves /metrics, /livez and /readyz.
func (a *App) startHTTP() error {
	addr := a.cfg.HTTP.Listen
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http.listen: serving /metrics on %s: %w (choose another address, or set it to \"\" to turn the server off)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	a.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.httpAddr = ln.Addr().String()
	srv := a.httpSrv
	go func() { _ = srv.Serve(ln) }()
	a.log.Info("serving /metrics, /livez and /readyz", "addr", a.httpAddr)
	return nil
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
