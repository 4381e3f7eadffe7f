package control

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Bridge is what the service controls: a running bridge (app.App). Each
// method is called from its own goroutine and must honour ctx, which the
// service bounds. A method returning an error returns an *Error, or any
// error, which becomes code 500.
type Bridge interface {
	// Status reports the instance and each of its sources.
	Status(ctx context.Context) StatusReply
	// Runs reports whether the instance runs source, and whether it holds
	// it (Status's Holder).
	Runs(source string) (runs, holds bool)
	// Pause, Resume, Snapshot and Resync act on source, which the
	// instance runs.
	Pause(ctx context.Context, source string, req PauseRequest) (SourceReply, error)
	Resume(ctx context.Context, source string, req ResumeRequest) (SourceReply, error)
	Snapshot(ctx context.Context, source string, req SnapshotRequest) (SnapshotReply, error)
	Resync(ctx context.Context, source string, req ResyncRequest) (ResyncReply, error)
	// Reload re-reads the configuration and applies it, or refuses it
	// whole (an *Error with CodeInvalid).
	Reload(ctx context.Context) (ReloadReply, error)
}

// Options configure the service.
type Options struct {
	// Bridge is the bridge's name: the second token of every subject.
	Bridge string
	// Instance is the process's instance id; Version the bridge's version.
	Instance, Version string
	// Description is shown by `nats micro info`.
	Description string
	// MaxWait bounds each action (Default 2m); a request's own wait,
	// shorter, bounds it first.
	MaxWait time.Duration
	Log     *slog.Logger
}

// Service is a bridge's control service on NATS (nats.go/micro): the
// endpoints of one bridge instance and the $SRV discovery subjects.
type Service struct {
	svc    micro.Service
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start registers the service named ServiceName on nc, with b's endpoints
// under "bridge.<name>" (docs/control.md lists the subjects). Every
// endpoint is subscribed without a queue group: every instance of the
// bridge hears every request; each answers the bridge actions, and only
// the holder of a source (or the instance InstanceHeader names) answers
// the actions on it, so a request reaches the right instance wherever it
// runs. Stop it before closing nc.
func Start(nc *nats.Conn, b Bridge, o Options) (*Service, error) {
	if o.MaxWait <= 0 {
		o.MaxWait = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	svc, err := micro.AddService(nc, micro.Config{
		Name:               ServiceName,
		Version:            semver(o.Version),
		Description:        o.Description,
		QueueGroupDisabled: true,
		Metadata:           map[string]string{"bridge": o.Bridge, "instance": o.Instance, "version": o.Version},
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			o.Log.Warn("control service", "subject", e.Subject, "err", e.Description)
		},
	})
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.svc = svc
	h := &handler{s: s, b: b, o: o}
	g := svc.AddGroup("bridge."+o.Bridge, micro.WithGroupQueueGroupDisabled())
	add := func(action, subject string, fn func(micro.Request)) error {
		return g.AddEndpoint(action, micro.HandlerFunc(fn), micro.WithEndpointSubject(subject), micro.WithEndpointQueueGroupDisabled())
	}
	for _, e := range []struct {
		action, subject string
		fn              func(micro.Request)
	}{
		{ActionStatus, ActionStatus, h.status},
		{ActionSources, ActionSources, h.sources},
		{ActionReload, ActionReload, h.async(h.reload)},
		{ActionPause, ActionPause + ".*", h.async(h.onSource(h.pause))},
		{ActionResume, ActionResume + ".*", h.async(h.onSource(h.resume))},
		{ActionSnapshot, ActionSnapshot + ".*", h.async(h.onSource(h.snapshot))},
		{ActionResync, ActionResync + ".*", h.async(h.onSource(h.resync))},
	} {
		if err := add(e.action, e.subject, e.fn); err != nil {
			_ = s.Stop()
			return nil, err
		}
	}
	// The endpoints' subscriptions reach the server before Start returns,
	// so a request sent right after (from any connection) finds this
	// instance. A connection that is down subscribes again when it is
	// back; that is no reason to fail.
	_ = nc.FlushTimeout(5 * time.Second)
	return s, nil
}

// Stop unsubscribes the endpoints and waits for the actions under way,
// which it cancels.
func (s *Service) Stop() error {
	var err error
	if s.svc != nil {
		err = s.svc.Stop()
	}
	s.cancel()
	s.wg.Wait()
	return err
}

// Info returns the service's micro info (id, endpoints and their subjects).
func (s *Service) Info() micro.Info { return s.svc.Info() }

type handler struct {
	s *Service
	b Bridge
	o Options
}

func (h *handler) id() Identity {
	return Identity{Bridge: h.o.Bridge, Instance: h.o.Instance, Version: h.o.Version}
}

// async runs fn in its own goroutine, so that an action waiting for a
// transaction boundary holds up neither the others nor status.
func (h *handler) async(fn func(micro.Request)) func(micro.Request) {
	return func(req micro.Request) {
		h.s.wg.Add(1)
		go func() {
			defer h.s.wg.Done()
			fn(req)
		}()
	}
}

func (h *handler) status(req micro.Request) {
	ctx, cancel := context.WithTimeout(h.s.ctx, 10*time.Second)
	defer cancel()
	h.respond(req, h.b.Status(ctx), nil)
}

func (h *handler) sources(req micro.Request) {
	ctx, cancel := context.WithTimeout(h.s.ctx, 10*time.Second)
	defer cancel()
	st := h.b.Status(ctx)
	out := SourcesReply{Identity: st.Identity, Sources: []SourceInfo{}}
	for _, s := range st.Sources {
		out.Sources = append(out.Sources, SourceInfo{Name: s.Name, Type: s.Type, State: s.State, Holder: s.Holder})
	}
	h.respond(req, out, nil)
}

func (h *handler) reload(req micro.Request) {
	ctx, cancel := context.WithTimeout(h.s.ctx, h.o.MaxWait)
	defer cancel()
	r, err := h.b.Reload(ctx)
	r.Identity = h.id()
	h.respond(req, r, err)
}

// onSource answers an action on the source its subject's last token names:
// only when this instance runs the source and holds it, or is the
// instance the request's InstanceHeader names.
func (h *handler) onSource(fn func(ctx context.Context, source string, body []byte) (any, error)) func(micro.Request) {
	return func(req micro.Request) {
		subj := req.Subject()
		source := subj[strings.LastIndexByte(subj, '.')+1:]
		runs, holds := h.b.Runs(source)
		target := req.Headers().Get(InstanceHeader)
		switch {
		case target != "" && target != h.o.Instance:
			return // addressed to another instance
		case target == "" && !holds:
			return // the holder answers; when none does, the caller falls back
		case !runs:
			h.respond(req, nil, Errorf(CodeNotFound, "bridge %s (instance %s) runs no source named %q", h.o.Bridge, h.o.Instance, source))
			return
		}
		ctx, cancel := context.WithTimeout(h.s.ctx, h.o.MaxWait)
		defer cancel()
		out, err := fn(ctx, source, req.Data())
		h.respond(req, out, err)
	}
}

func (h *handler) pause(ctx context.Context, source string, body []byte) (any, error) {
	var r PauseRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	ctx, cancel, err := bound(ctx, r.Wait)
	if err != nil {
		return nil, err
	}
	defer cancel()
	out, err := h.b.Pause(ctx, source, r)
	out.Identity = h.id()
	return out, err
}

func (h *handler) resume(ctx context.Context, source string, body []byte) (any, error) {
	var r ResumeRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	ctx, cancel, err := bound(ctx, r.Wait)
	if err != nil {
		return nil, err
	}
	defer cancel()
	out, err := h.b.Resume(ctx, source, r)
	out.Identity = h.id()
	return out, err
}

func (h *handler) snapshot(ctx context.Context, source string, body []byte) (any, error) {
	var r SnapshotRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	out, err := h.b.Snapshot(ctx, source, r)
	out.Identity = h.id()
	return out, err
}

func (h *handler) resync(ctx context.Context, source string, body []byte) (any, error) {
	var r ResyncRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	ctx, cancel, err := bound(ctx, r.Wait)
	if err != nil {
		return nil, err
	}
	defer cancel()
	out, err := h.b.Resync(ctx, source, r)
	out.Identity = h.id()
	return out, err
}

// bound bounds ctx by a request's wait (default 30s).
func bound(ctx context.Context, wait string) (context.Context, context.CancelFunc, error) {
	d, err := Wait(wait, 30*time.Second)
	if err != nil {
		return nil, nil, &Error{Code: CodeBadRequest, Description: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, cancel, nil
}

// Bounds on what a request may carry: its body, and each free text in
// it (reason, by, where), which is logged, kept in the checkpoint bucket
// and echoed in every status.
const (
	maxBody = 64 << 10
	maxText = 1 << 10
)

// decode reads a request body; an empty body is the zero request. A body
// over maxBody, or a reason, by or where over maxText bytes, is refused.
func decode(body []byte, v any) error {
	if len(body) > maxBody {
		return Errorf(CodeBadRequest, "the request body is %d bytes, more than %d", len(body), maxBody)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeBadRequest, "the request body must be JSON (docs/control.md): %v", err)
	}
	type text struct{ name, v string }
	var texts []text
	switch r := v.(type) {
	case *PauseRequest:
		texts = []text{{"reason", r.Reason}, {"by", r.By}}
	case *ResumeRequest:
		texts = []text{{"by", r.By}}
	case *SnapshotRequest:
		texts = []text{{"where", r.Where}, {"by", r.By}}
	case *ResyncRequest:
		texts = []text{{"reason", r.Reason}}
	}
	for _, t := range texts {
		if len(t.v) > maxText {
			return Errorf(CodeBadRequest, "%s is %d bytes, more than %d", t.name, len(t.v), maxText)
		}
	}
	return nil
}

// respond answers with v as JSON, or with err as a service error.
func (h *handler) respond(req micro.Request, v any, err error) {
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Code: CodeFailed, Description: err.Error()}
		}
		e.Instance = h.o.Instance
		if e.Code == "" {
			e.Code = CodeFailed
		}
		b, _ := json.Marshal(e)
		// The header holds one line; the body has it all.
		desc := strings.ReplaceAll(strings.ReplaceAll(e.Description, "\r", " "), "\n", " ")
		_ = req.Error(e.Code, desc, b)
		return
	}
	_ = req.RespondJSON(v)
}

var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$`)

// semver returns v as micro requires it (SemVer, no "v"): "dev" and other
// non-versions become 0.0.0-dev (the metadata keep the original).
func semver(v string) string {
	v = strings.TrimPrefix(v, "v")
	if semverRE.MatchString(v) {
		return v
	}
	return "0.0.0-dev"
}
