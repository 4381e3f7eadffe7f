package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bridgecdc/bridge/bridge/control"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console/"

// Actions are the control plane's actions the console's buttons call:
// the App's control.Bridge answers them, so a button does what `bridge
// pause` does, with the same checks and replies.
type Actions interface {
	Pause(ctx context.Context, source string, req control.PauseRequest) (control.SourceReply, error)
	Resume(ctx context.Context, source string, req control.ResumeRequest) (control.SourceReply, error)
	Snapshot(ctx context.Context, source string, req control.SnapshotRequest) (control.SnapshotReply, error)
}

// Options configure a Console. Status is required.
type Options struct {
	// Status returns the bridge's status, the control plane's model:
	// the console shows the states it reports, never recomputes them.
	Status func(context.Context) control.StatusReply
	// Gatherer is the bridge's metrics registry (what /metrics serves).
	Gatherer prometheus.Gatherer
	// Actions answers the buttons; nil hides them and refuses the calls.
	Actions Actions
	// Protect wraps the console's API (not its static files, which hold
	// no data): the same authentication as `bridge serve`. nil: open,
	// which the App allows on a loopback address only.
	Protect func(http.Handler) http.Handler
	// Allow decides, for a request Protect let through, whether its
	// caller may read the overview (control false) or pause, resume and
	// snapshot sources (control true), and names it for the logs and the
	// pause it records (a token's subject, the proxy's user): never a name
	// the request chooses. A refusal's error says why in one line and is
	// answered with 403. nil: every caller may do everything, named by its
	// remote address (the open console on loopback).
	Allow func(r *http.Request, control bool) (who string, err error)
	// Feed serves the live tail: the feeds HTTP API of `bridge serve`
	// (GET /v1/feed) over the bridge's own stream, mounted at
	// <Prefix>api/v1/feed. nil: no tail.
	Feed http.Handler
	// Interval is the time between two samples of the history. Default 10s.
	Interval time.Duration
	// Keep is how long the history reaches back. Default 1h; the ring of
	// each source holds Keep/Interval samples (360 by default: 23 KiB a
	// source).
	Keep time.Duration
	// Log receives the actions taken. Default slog.Default().
	Log *slog.Logger
}

// Console is the web console: one page, its JSON API and the history of
// the last hour. Build it with New; run its sampler with Run.
type Console struct {
	opt  Options
	hist *history
}

// New returns a console with opt.
func New(opt Options) (*Console, error) {
	if opt.Status == nil {
		return nil, errors.New("console: Options.Status is required")
	}
	if opt.Interval <= 0 {
		opt.Interval = 10 * time.Second
	}
	if opt.Keep <= 0 {
		opt.Keep = time.Hour
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	size := max(int(opt.Keep/opt.Interval), 2)
	return &Console{opt: opt, hist: newHistory(size)}, nil
}

// Run samples the sources every Interval until ctx ends.
func (c *Console) Run(ctx context.Context) {
	t := time.NewTicker(c.opt.Interval)
	defer t.Stop()
	c.Sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Sample(ctx)
		}
	}
}

// Sample records one sample of every source into the history.
func (c *Console) Sample(ctx context.Context) {
	st := c.opt.Status(ctx)
	f := gather(c.opt.Gatherer)
	now := time.Now()
	keep := map[string]bool{}
	for _, s := range st.Sources {
		keep[s.Name] = true
		lagBytes, lagSec, age, retained := -1.0, -1.0, -1.0, -1.0
		if s.LagBytes != nil {
			lagBytes = float64(*s.LagBytes)
		}
		if s.Slot != nil {
			retained = float64(s.Slot.RetainedWALBytes)
		}
		delivered := s.Delivered
		if sf := f.src[s.Name]; sf != nil {
			if sf.lagSeconds != nil {
				lagSec = *sf.lagSeconds
			}
			if sf.checkpointAge != nil {
				age = *sf.checkpointAge
			}
		}
		c.hist.record(s.Name, now, delivered, [4]float64{lagBytes, lagSec, age, retained})
	}
	c.hist.forget(keep)
}

// Overview is what GET <Prefix>api/overview answers: the page's whole
// picture, rebuilt at each request.
type Overview struct {
	control.Identity
	ConfigRev  string    `json:"config_rev"`
	ConfigFrom string    `json:"config_from"`
	Started    time.Time `json:"started"`
	Now        time.Time `json:"now"`
	Sources    []Source  `json:"sources"`
	Sinks      []Sink    `json:"sinks"`
	// Actions is true when the buttons may be used.
	Actions bool `json:"actions"`
	// Tail is true when the live tail is served.
	Tail bool `json:"tail"`
	// IntervalSeconds is the time between two samples of the history.
	IntervalSeconds float64 `json:"interval_seconds"`
}

// Source is a source: the control plane's status and the figures of
// /metrics, with its history.
type Source struct {
	control.SourceStatus
	LagSeconds           *float64           `json:"lag_seconds,omitempty"`
	CheckpointAgeSeconds *float64           `json:"checkpoint_age_seconds,omitempty"`
	SafeWALBytes         *float64           `json:"safe_wal_bytes,omitempty"`
	Rate                 *float64           `json:"changes_per_second,omitempty"`
	Errors               map[string]float64 `json:"errors"`
	History              Points             `json:"history"`
	Snapshot             *Snapshot          `json:"snapshot,omitempty"`
}

// Sink is one sink of one source.
type Sink struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	// Delivered counts the source's changes written to every sink.
	Delivered uint64 `json:"delivered"`
	// WriteErrors counts the failed batch writes to this sink.
	WriteErrors float64 `json:"write_errors"`
	// DeadLetters counts the changes the sink stored on its
	// dead_letter_subject; nil for a sink that cannot divert changes.
	DeadLetters *float64 `json:"dead_letters,omitempty"`
	// Latency is the publish latency of successful batches; nil before
	// the first.
	Latency *Histogram `json:"latency,omitempty"`
}

// overview builds the Overview now.
func (c *Console) overview(ctx context.Context) Overview {
	st := c.opt.Status(ctx)
	f := gather(c.opt.Gatherer)
	o := Overview{Identity: st.Identity, ConfigRev: st.ConfigRev, ConfigFrom: st.ConfigFrom, Started: st.Started,
		Now: time.Now().UTC(), Sources: []Source{}, Sinks: []Sink{}, Actions: c.opt.Actions != nil, Tail: c.opt.Feed != nil,
		IntervalSeconds: c.opt.Interval.Seconds()}
	for _, s := range st.Sources {
		src := Source{SourceStatus: s, Errors: map[string]float64{}, History: c.hist.points(s.Name)}
		sf := f.src[s.Name]
		if sf != nil {
			src.LagSeconds, src.CheckpointAgeSeconds, src.SafeWALBytes, src.Errors = sf.lagSeconds, sf.checkpointAge, sf.safeWAL, sf.errors
		}
		if rates := src.History.Series["rate"]; len(rates) > 0 && rates[len(rates)-1] >= 0 {
			r := rates[len(rates)-1]
			src.Rate = &r
		}
		if sn := f.snaps[s.Name]; sn != nil && len(sn.Tables) > 0 {
			src.Snapshot = sn
		}
		o.Sources = append(o.Sources, src)
		for _, name := range s.Sinks {
			key := [2]string{s.Name, name}
			sk := Sink{Name: name, Source: s.Name, Delivered: s.Delivered, Latency: f.sinks[key], WriteErrors: f.writeErrs[key]}
			if d, ok := f.dead[key]; ok {
				sk.DeadLetters = &d
			}
			o.Sinks = append(o.Sinks, sk)
		}
	}
	return o
}

// Handler serves the console under Prefix: the page and its files, GET
// api/overview, POST api/sources/{source}/{pause,resume,snapshot} and the
// tail at GET api/v1/feed.
func (c *Console) Handler() http.Handler {
	static, _ := fs.Sub(assets, "assets")
	files := http.StripPrefix(Prefix, http.FileServerFS(static))
	api := http.NewServeMux()
	api.HandleFunc("GET "+Prefix+"api/overview", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := c.allow(w, r, false); !ok {
			return
		}
		o := c.overview(r.Context())
		if o.Actions && c.opt.Allow != nil {
			_, err := c.opt.Allow(r, true)
			o.Actions = err == nil // the page shows buttons to those who may press them
		}
		writeJSON(w, http.StatusOK, o)
	})
	api.HandleFunc("POST "+Prefix+"api/sources/{source}/{action}", c.action)
	if c.opt.Feed != nil {
		api.Handle("GET "+Prefix+"api/v1/feed", http.StripPrefix(strings.TrimSuffix(Prefix, "/")+"/api", c.opt.Feed))
	}
	var protected http.Handler = api
	if c.opt.Protect != nil {
		protected = c.opt.Protect(api)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		if strings.HasPrefix(r.URL.Path, Prefix+"api/") {
			w.Header().Set("Cache-Control", "no-store")
			protected.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// allow answers 403 with the reason when r's caller may not read the
// overview (control false) or act (control true), and returns the caller
// as the logs and the records name it.
func (c *Console) allow(w http.ResponseWriter, r *http.Request, control bool) (string, bool) {
	if c.opt.Allow == nil {
		return "console, no authentication, from " + r.RemoteAddr, true
	}
	who, err := c.opt.Allow(r, control)
	if err != nil {
		c.opt.Log.Info("console: request refused", "reason", err.Error(), "method", r.Method, "path", r.URL.Path, "who", who, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusForbidden, actionError{Error: "forbidden", Detail: err.Error()})
		return "", false
	}
	return "console, " + who, true
}

// actionError is the JSON body of a refused or failed action.
type actionError struct {
	Error  string `json:"error"`
	Code   string `json:"code,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// maxActionBody bounds an action's JSON body.
const maxActionBody = 64 << 10

// action calls the control plane's action on a source. It takes JSON only
// and refuses a request from another origin: a page elsewhere cannot send
// a JSON POST here without a CORS preflight, which the console never
// answers, so it cannot press the buttons for a visitor.
func (c *Console) action(w http.ResponseWriter, r *http.Request) {
	source, name := r.PathValue("source"), r.PathValue("action")
	if c.opt.Actions == nil {
		writeJSON(w, http.StatusForbidden, actionError{Error: "actions are off", Detail: "this console shows the bridge but offers no actions"})
		return
	}
	by, ok := c.allow(w, r, true)
	if !ok {
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		writeJSON(w, http.StatusUnsupportedMediaType, actionError{Error: "bad content type", Detail: fmt.Sprintf("send the action's request as Content-Type: application/json (got %q)", ct)})
		return
	}
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			writeJSON(w, http.StatusForbidden, actionError{Error: "cross-origin request", Detail: fmt.Sprintf("origin %q is not this console's (%s)", o, r.Host)})
			return
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxActionBody+1))
	if err != nil || len(body) > maxActionBody {
		writeJSON(w, http.StatusBadRequest, actionError{Error: "bad request", Detail: fmt.Sprintf("the body must be a JSON object of at most %d bytes", maxActionBody)})
		return
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		body = []byte("{}")
	}
	decode := func(v any) bool {
		if err := json.Unmarshal(body, v); err != nil {
			writeJSON(w, http.StatusBadRequest, actionError{Error: "bad request", Detail: fmt.Sprintf("%s request: %v", name, err)})
			return false
		}
		return true
	}
	ctx := r.Context()
	var reply any
	// The actor is who authenticated, whatever the body's "by" says.
	switch name {
	case control.ActionPause:
		var req control.PauseRequest
		if !decode(&req) {
			return
		}
		req.By = by
		reply, err = c.opt.Actions.Pause(ctx, source, req)
	case control.ActionResume:
		var req control.ResumeRequest
		if !decode(&req) {
			return
		}
		req.By = by
		reply, err = c.opt.Actions.Resume(ctx, source, req)
	case control.ActionSnapshot:
		var req control.SnapshotRequest
		if !decode(&req) {
			return
		}
		req.By = by
		reply, err = c.opt.Actions.Snapshot(ctx, source, req)
	default:
		writeJSON(w, http.StatusNotFound, actionError{Error: "no such action", Detail: fmt.Sprintf("%q is not one of pause, resume, snapshot", name)})
		return
	}
	if err != nil {
		var ce *control.Error
		status, body := http.StatusInternalServerError, actionError{Error: err.Error()}
		if errors.As(err, &ce) {
			body.Code, body.Error = ce.Code, ce.Description
			body.Detail = strings.Join(ce.Details, "\n")
			status = httpStatus(ce.Code)
		}
		c.opt.Log.Info("console: action refused", "action", name, "source", source, "by", by, "remote", r.RemoteAddr, "err", err)
		writeJSON(w, status, body)
		return
	}
	c.opt.Log.Info("console: action taken", "action", name, "source", source, "by", by, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, reply)
}

// httpStatus maps a control error code to its HTTP status.
func httpStatus(code string) int {
	switch code {
	case control.CodeBadRequest:
		return http.StatusBadRequest
	case control.CodeNotFound:
		return http.StatusNotFound
	case control.CodeConflict:
		return http.StatusConflict
	case control.CodeInvalid:
		return http.StatusUnprocessableEntity
	case control.CodeTimeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
