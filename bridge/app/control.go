package app

import (
	"context"
	"errors"

	"github.com/bridgecdc/bridge/bridge/control"
	"github.com/bridgecdc/bridge/bridge/pipeline"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/buildinfo"
)

// The control plane: the App serves bridge/control's endpoints on its
// NATS connection while Run runs.

// controlService is the running service.
type controlService struct {
	svc *control.Service
}

// Instance returns the App's instance id: its run id, which checkpoints
// record and the control plane reports.
func (a *App) Instance() string { return a.run }

// startControl registers the control service on the checkpoint connection;
// a failure (a NATS user without the permission to subscribe) is logged,
// and the bridge streams on without it.
func (a *App) startControl(ctx context.Context) {
	if a.nc == nil {
		return
	}
	svc, err := control.Start(a.nc, controlBridge{a}, control.Options{
		Bridge: a.cfg.Name, Instance: a.run, Version: buildinfo.String(),
		Description: "Postgres → NATS bridge " + a.cfg.Name, Log: a.log,
	})
	if err != nil {
		a.log.Warn("the control service did not start; `bridge status` and the other commands read the bucket and Postgres directly",
			"err", err, "subjects", control.Subject(a.cfg.Name, ">"))
		return
	}
	a.mu.Lock()
	a.ctl = &controlService{svc: svc}
	a.mu.Unlock()
	a.log.Info("control service on NATS", "service", control.ServiceName, "subjects", control.Subject(a.cfg.Name, ">"), "instance", a.run)
}

// stopControl stops the control service, if it runs.
func (a *App) stopControl() {
	a.mu.Lock()
	c := a.ctl
	a.ctl = nil
	a.mu.Unlock()
	if c != nil {
		_ = c.svc.Stop()
	}
}

// controlBridge is the App as control.Bridge sees it.
type controlBridge struct{ a *App }

func (b controlBridge) Status(context.Context) control.StatusReply {
	a := b.a
	a.mu.Lock()
	rev, from := a.rev, a.cfgFrom
	a.mu.Unlock()
	out := control.StatusReply{
		Identity:  control.Identity{Bridge: a.cfg.Name, Instance: a.run, Version: buildinfo.String()},
		ConfigRev: rev, ConfigFrom: from, Started: a.started.UTC(), Sources: []control.SourceStatus{},
	}
	out.Fleet, _ = a.Fleet()
	for _, r := range a.runnerList() {
		out.Sources = append(out.Sources, r.status())
	}
	return out
}

// status is r's source as the control plane reports it.
func (r *runner) status() control.SourceStatus {
	ps := r.p.Status()
	s := control.SourceStatus{
		Name: r.source, Type: r.typ, State: string(ps.State), Since: ps.Since.UTC(), Holder: ps.Holder,
		LastError: ps.LastError, Epoch: ps.Epoch, Checkpoint: ps.Checkpoint.String(), ConfigRev: ps.ConfigRev,
		Paused: ps.Control.Paused, Delivered: ps.Delivered, Sinks: r.sinkNames, Streams: r.streams,
	}
	if !ps.LastErrorAt.IsZero() {
		at := ps.LastErrorAt.UTC()
		s.LastErrorAt = &at
	}
	if ps.Control.Paused {
		at := ps.Control.At.UTC()
		s.PauseReason, s.PausedBy, s.PausedAt = ps.Control.Reason, ps.Control.By, &at
	}
	for _, h := range ps.Held {
		s.Held = append(s.Held, control.HeldTable{Table: h.Table, Version: h.Version, RegistryKey: h.RegistryKey,
			Policy: h.Policy, Since: h.Since.UTC(), Reason: h.Reason, DeadLettered: h.DeadLettered})
	}
	if r.gauge != nil {
		if g, ok := r.gauge.Last(); ok {
			row := g.Row
			s.Slot = &control.Slot{Name: g.Slot, Exists: row.Exists, Active: row.Active, RetainedWALBytes: row.Retained(),
				WALStatus: row.WALStatus, CurrentWALLSN: row.CurrentWAL.String(), PolledAt: g.At.UTC()}
			if row.CurrentWAL != 0 {
				lag := uint64(0)
				if row.CurrentWAL > ps.Checkpoint {
					lag = uint64(row.CurrentWAL - ps.Checkpoint)
				}
				s.LagBytes = &lag
			}
		}
	}
	return s
}

func (b controlBridge) Runs(source string) (bool, bool) {
	r, err := b.a.runnerOf(source)
	if err != nil {
		return false, false
	}
	return true, r.p.Status().Holder
}

func (b controlBridge) Pause(ctx context.Context, source string, req control.PauseRequest) (control.SourceReply, error) {
	r, err := b.a.runnerOf(source)
	if err != nil {
		return control.SourceReply{}, control.Errorf(control.CodeNotFound, "%v", err)
	}
	by := req.By
	if by == "" {
		by = "control endpoint"
	}
	ps, err := r.p.Pause(ctx, req.Reason, by+" (via instance "+b.a.run+")")
	out := control.SourceReply{Source: r.status()}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return out, control.Errorf(control.CodeTimeout, "the pause of source %q is recorded, but its run had not reached a transaction boundary within the wait (state %s); it pauses there", source, ps.State)
	case err != nil:
		return out, control.Errorf(control.CodeFailed, "pausing source %q: %v", source, err)
	case ps.State != pipeline.StatePaused:
		return out, control.Errorf(control.CodeConflict, "source %q is %s, not paused: %s", source, ps.State, ps.LastError)
	}
	b.a.log.Info("source paused", "source", source, "checkpoint", ps.Checkpoint.String(), "by", by, "reason", req.Reason)
	return out, nil
}

func (b controlBridge) Resume(ctx context.Context, source string, req control.ResumeRequest) (control.SourceReply, error) {
	r, err := b.a.runnerOf(source)
	if err != nil {
		return control.SourceReply{}, control.Errorf(control.CodeNotFound, "%v", err)
	}
	by := req.By
	if by == "" {
		by = "control endpoint"
	}
	ps, err := r.p.Resume(ctx, by+" (via instance "+b.a.run+")")
	out := control.SourceReply{Source: r.status()}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return out, control.Errorf(control.CodeTimeout, "source %q is resumed, but no run streamed within the wait (state %s)", source, ps.State)
	case err != nil:
		return out, control.Errorf(control.CodeFailed, "resuming source %q: %v", source, err)
	}
	return out, nil
}

func (b controlBridge) Snapshot(ctx context.Context, source string, req control.SnapshotRequest) (control.SnapshotReply, error) {
	a := b.a
	if _, err := a.runnerOf(source); err != nil {
		return control.SnapshotReply{}, control.Errorf(control.CodeNotFound, "%v", err)
	}
	id, tables, err := a.RequestSnapshot(ctx, a.js, source, req.Tables, req.Where)
	if err != nil {
		return control.SnapshotReply{}, control.Errorf(control.CodeBadRequest, "snapshot of source %s refused: %v", source, err)
	}
	by := req.By
	if by == "" {
		by = "control endpoint"
	}
	a.log.Info("snapshot requested", "source", source, "snapshot", id, "tables", tables, "where", req.Where, "by", by)
	return control.SnapshotReply{Source: source, ID: id, Tables: tables, Where: req.Where}, nil
}

func (b controlBridge) Resync(ctx context.Context, source string, req control.ResyncRequest) (control.ResyncReply, error) {
	r, err := b.a.runnerOf(source)
	if err != nil {
		return control.ResyncReply{}, control.Errorf(control.CodeNotFound, "%v", err)
	}
	producer, err := r.p.ResyncOnline(ctx, req.Reason)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return control.ResyncReply{}, control.Errorf(control.CodeTimeout, "%v", err)
		}
		return control.ResyncReply{}, control.Errorf(control.CodeFailed, "resync of source %q: %v", source, err)
	}
	return control.ResyncReply{Source: source, Producer: producer}, nil
}

func (b controlBridge) Reload(ctx context.Context) (control.ReloadReply, error) {
	res, err := b.a.Reload(ctx)
	out := control.ReloadReply{Revision: res.Revision, Previous: res.Previous, Changes: res.Changes}
	if out.Changes == nil {
		out.Changes = []string{}
	}
	if err != nil {
		e := &control.Error{Code: control.CodeInvalid, Description: "the configuration was refused whole; nothing changed"}
		var ferrs config.Errors
		switch {
		case errors.As(err, &ferrs):
			for _, fe := range ferrs {
				e.Details = append(e.Details, fe.Error())
			}
		case errors.Is(err, errCannotReload):
			e.Code, e.Description = control.CodeConflict, err.Error()
		default:
			e.Details = errorLines(err)
		}
		return out, e
	}
	return out, nil
}
