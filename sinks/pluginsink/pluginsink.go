package pluginsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sinks/pluginsink/pluginv1"
)

// Type is the sink type in bridge.yaml.
const Type = "plugin"

func init() {
	sinks.MustRegister(Type, sinks.Plugin{
		New:    New,
		Config: DefaultConfig(),
		Doc:    "an executable in any language, run as a child process and spoken to over gRPC (hashicorp/go-plugin, contract bridge.plugin.v1); its sha256 pinned, restarted after a crash",
		Exec:   &sinks.Exec{Describe: describe, Test: Test},
	})
}

var errClosed = errors.New("plugin sink closed")

// describeTimeout bounds Describe and Configure at each start.
const describeTimeout = 10 * time.Second

// Sink runs a plugin process and delivers to it. Write is never called
// concurrently with itself; Close may be called at any time.
type Sink struct {
	cfg     Config
	name    string
	log     *slog.Logger
	cfgJSON []byte
	desc    *pluginv1.DescribeResponse

	// op serializes Connect, Write and Delivered (the pipeline never
	// overlaps them; tests might) and guards the fields below it.
	op      sync.Mutex
	crashes int // process starts since the last successful Write
	// unsure: what the plugin holds past cursor is not known, because the
	// process was restarted or a Write failed (no answer: a crash, a
	// timeout, a cancelled call; or a whole-batch error) since the last
	// successful Write. The next Write of a resuming plugin asks first.
	unsure bool
	cursor string // the plugin's cursor after the last successful Write

	// mu guards p and closed; Close takes only mu, so it never waits for
	// a Write or a restart.
	mu     sync.Mutex
	p      *proc // nil when no process runs
	closed bool
}

// current returns the running process, nil when none, or an error after Close.
func (s *Sink) current() (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, sinks.Permanent(fmt.Errorf("%s: %w", who(s.name, s.cfg.Command), errClosed))
	}
	return s.p, nil
}

// resuming is a Sink whose plugin resumes: a sinks.Resumer.
type resuming struct{ *Sink }

// deduping is a Sink whose plugin dedupes: a sinks.Deduplicator.
type deduping struct{ *Sink }

// New checks the config, starts the plugin (checksum, handshake, Describe,
// Configure) and returns the sink; what the plugin said it can do decides
// the type returned (see the package doc). It does no network I/O: the
// plugin is a child process.
func New(decode config.Decoder, env sinks.Env) (sinks.Sink, error) {
	cfg := DefaultConfig()
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	s, err := Start(cfg, env)
	if err != nil {
		return nil, err
	}
	switch {
	case s.desc.GetResumes():
		return resuming{s}, nil
	case s.desc.GetDedupes():
		return deduping{s}, nil
	}
	return s, nil
}

// Start starts the plugin of cfg and returns its sink, whatever it can do.
func Start(cfg Config, env sinks.Env) (*Sink, error) {
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	block := cfg.Config
	if block == nil {
		block = map[string]any{}
	}
	cfgJSON, err := json.Marshal(block)
	if err != nil {
		return nil, config.Field("config", "cannot be sent to the plugin as JSON: %v", err)
	}
	s := &Sink{cfg: cfg, name: env.Name, log: log, cfgJSON: cfgJSON}
	p, d, err := s.launch()
	if err != nil {
		return nil, err
	}
	s.p, s.desc = p, d
	log.Info("plugin started", "plugin", d.GetName(), "version", d.GetVersion(), "contract", fmt.Sprintf("v%d.%d", pluginv1.ProtocolVersion, d.GetContractMinor()),
		"resumes", d.GetResumes(), "dedupes", d.GetDedupes())
	return s, nil
}

// Describe returns what the plugin said of itself at its first start.
func (s *Sink) Describe() *pluginv1.DescribeResponse { return s.desc }

// launch starts a process and configures it.
func (s *Sink) launch() (*proc, *pluginv1.DescribeResponse, error) {
	p, err := start(&s.cfg, s.name)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), describeTimeout)
	defer cancel()
	d, err := p.describeAndConfigure(ctx, s.name, s.cfgJSON)
	if err != nil {
		p.stop()
		if sinks.IsPermanent(err) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%s: %w%s", who(s.name, s.cfg.Command), err, p.stderrNote())
	}
	if d.GetContractMinor() > pluginv1.ContractMinor {
		s.log.Warn("plugin was built against a later minor of the contract; what that minor added is not used",
			"plugin", d.GetName(), "contract_minor", d.GetContractMinor(), "bridge_minor", pluginv1.ContractMinor)
	}
	return p, d, nil
}

func (p *proc) stderrNote() string {
	if l := p.stderr.last(); l != "" {
		return fmt.Sprintf(" (its last stderr line: %q)", l)
	}
	return ""
}

// Connect starts the plugin again if it crashed (after a backoff; see
// Config.RestartInitial) and asks it to connect to its destination.
func (s *Sink) Connect(ctx context.Context) error {
	s.op.Lock()
	defer s.op.Unlock()
	p, err := s.current()
	if err != nil {
		return err
	}
	if p != nil && p.exited() {
		s.crashed(p, "exited")
		p = nil
	}
	if p == nil {
		if p, err = s.restart(ctx); err != nil {
			return err
		}
	}
	r, err := p.sink.Connect(ctx, &pluginv1.ConnectRequest{})
	if err != nil {
		if ctx.Err() == nil && transport(err) {
			s.crashed(p, "stopped answering: "+err.Error())
		}
		return fmt.Errorf("%s: connecting: %w", who(s.name, s.cfg.Command), err)
	}
	if e := r.GetError(); e != nil {
		return s.pluginError("connecting", e)
	}
	return nil
}

// crashed forgets p, a process that died or stopped answering.
func (s *Sink) crashed(p *proc, how string) {
	s.log.Warn("plugin crashed; it will be started again", "sink", s.name, "command", s.cfg.Command, "how", how, "stderr", p.stderr.last())
	p.stop()
	s.mu.Lock()
	if s.p == p {
		s.p = nil
	}
	s.mu.Unlock()
}

// restart starts a new process after the backoff, or fails permanently
// after MaxCrashes. Called with op held.
func (s *Sink) restart(ctx context.Context) (*proc, error) {
	if s.crashes >= s.cfg.MaxCrashes {
		return nil, sinks.Permanent(fmt.Errorf("%s: crashed %d times in a row without a successful write (max_crashes): fix the plugin (`bridge plugin test %s` shows its faults), then restart the bridge",
			who(s.name, s.cfg.Command), s.crashes, s.cfg.Command))
	}
	wait := s.backoff(s.crashes)
	s.crashes++
	t := time.NewTimer(wait)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return nil, fmt.Errorf("%s: waiting %s to restart it: %w", who(s.name, s.cfg.Command), wait, ctx.Err())
	}
	p, d, err := s.launch()
	if err != nil {
		return nil, err
	}
	if d.GetResumes() != s.desc.GetResumes() || d.GetDedupes() != s.desc.GetDedupes() {
		p.stop()
		return nil, sinks.Permanent(fmt.Errorf("%s: the restarted plugin describes other capabilities (resumes %t, dedupes %t) than at the bridge's start: restart the bridge after replacing a plugin",
			who(s.name, s.cfg.Command), d.GetResumes(), d.GetDedupes()))
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.stop()
		return nil, sinks.Permanent(fmt.Errorf("%s: %w", who(s.name, s.cfg.Command), errClosed))
	}
	s.p = p
	s.mu.Unlock()
	s.unsure = true
	s.log.Info("plugin restarted", "sink", s.name, "after", wait, "restart", s.crashes)
	return p, nil
}

// backoff returns the wait before restart n+1: RestartInitial doubling up
// to RestartMax, with equal jitter.
func (s *Sink) backoff(n int) time.Duration {
	d := s.cfg.RestartInitial
	for range n {
		d *= 2
		if d >= s.cfg.RestartMax {
			d = s.cfg.RestartMax
			break
		}
	}
	return d/2 + rand.N(d/2+1)
}

// ctxErr returns ctx's error when the call failed because of ctx: gRPC's
// own timer may report a deadline a moment before ctx does.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if _, ok := ctx.Deadline(); ok && status.Code(err) == codes.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return nil
}

// transport reports whether err is the connection to the plugin failing
// rather than an error the plugin returned.
func transport(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// pluginError turns an Error the plugin returned into the sinks contract's.
func (s *Sink) pluginError(doing string, e *pluginv1.Error) error {
	err := fmt.Errorf("%s: %s: %s", who(s.name, s.cfg.Command), doing, e.GetMessage())
	switch {
	case e.GetPermanent():
		return sinks.Permanent(err)
	case e.GetNotConnected():
		return fmt.Errorf("%w: %w", err, sinks.ErrNotConnected)
	}
	return err
}

// Write sends the batch to the plugin. After a restart, or after a Write
// that failed without saying which changes failed (a crash, a timeout or a
// cancelled call, which the plugin may have carried out in part or whole
// all the same, or a whole-batch error), a plugin that resumes is first
// asked what it holds past the last successful Write, and that is not sent
// again. A crash during the Write fails it with sinks.ErrNotConnected: the
// pipeline connects (restarts) and retries.
func (s *Sink) Write(ctx context.Context, batch []cdc.Change) error {
	s.op.Lock()
	defer s.op.Unlock()
	p, err := s.current()
	if err != nil {
		return err
	}
	if len(batch) == 0 {
		return nil
	}
	if p == nil || p.exited() {
		return fmt.Errorf("%s: not running: %w", who(s.name, s.cfg.Command), sinks.ErrNotConnected)
	}
	// A plugin that does not answer within write_timeout is hung: it is
	// stopped below and started again, as after a crash.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
	defer cancel()
	hung := func(what string) error {
		s.crashed(p, fmt.Sprintf("no answer within write_timeout (%s) %s", s.cfg.WriteTimeout, what))
		return fmt.Errorf("%s: did not answer within write_timeout (%s) %s; stopped and started again, it is asked what it holds and given the rest: %w",
			who(s.name, s.cfg.Command), s.cfg.WriteTimeout, what, sinks.ErrNotConnected)
	}
	send := make([]int, 0, len(batch)) // indexes of batch sent
	if s.unsure && s.desc.GetResumes() {
		held, err := s.held(ctx, p, batch)
		if err != nil && parent.Err() == nil && ctx.Err() != nil {
			return hung("reading what it holds")
		}
		if err != nil {
			return err
		}
		for i := range batch {
			if _, ok := held[batch[i].ID()]; !ok {
				send = append(send, i)
			}
		}
		if n := len(batch) - len(send); n > 0 {
			s.log.Info("plugin holds part of the batch already after a failed write or a restart; not writing it again", "sink", s.name, "held", n)
		}
	} else {
		for i := range batch {
			send = append(send, i)
		}
	}
	if len(send) == 0 {
		s.unsure, s.crashes = false, 0
		return nil
	}
	req := &pluginv1.WriteRequest{Changes: make([]*pluginv1.Change, len(send))}
	for j, i := range send {
		req.Changes[j] = toProto(&batch[i])
	}
	r, err := p.sink.Write(ctx, req)
	if err != nil || r.GetError() != nil {
		// The plugin may have written some or all of the batch before the
		// call failed (or before it gave up): ask before the next Write.
		s.unsure = true
	}
	if err != nil {
		if parent.Err() == nil && ctx.Err() != nil {
			return hung(fmt.Sprintf("writing %d changes (first %s)", len(send), batch[send[0]].ID()))
		}
		if cerr := ctxErr(parent, err); cerr != nil {
			return fmt.Errorf("%s: writing %d changes (first %s): %w", who(s.name, s.cfg.Command), len(send), batch[send[0]].ID(), cerr)
		}
		if transport(err) || p.exited() {
			s.crashed(p, err.Error())
			return fmt.Errorf("%s: crashed writing %d changes (first %s); they are written again once it restarts: %w",
				who(s.name, s.cfg.Command), len(send), batch[send[0]].ID(), sinks.ErrNotConnected)
		}
		return fmt.Errorf("%s: writing %d changes (first %s): %w", who(s.name, s.cfg.Command), len(send), batch[send[0]].ID(), err)
	}
	if e := r.GetError(); e != nil {
		return s.pluginError(fmt.Sprintf("writing %d changes (first %s)", len(send), batch[send[0]].ID()), e)
	}
	var berr sinks.BatchError
	for _, f := range r.GetFailed() {
		j := int(f.GetIndex())
		if j >= len(send) {
			return fmt.Errorf("%s: reported change #%d failed in a batch of %d: a bug in the plugin", who(s.name, s.cfg.Command), j, len(send))
		}
		i := send[j]
		e := f.GetError()
		if e == nil {
			e = &pluginv1.Error{Message: "failed"}
		}
		berr.Fail(i, s.pluginError("writing "+batch[i].ID(), e))
	}
	s.unsure, s.crashes = false, 0
	if c := r.GetCursor(); c != "" {
		s.cursor = c
	}
	return berr.Err()
}

// held returns the ids of batch's producers the plugin holds past the
// cursor of the last successful Write. Called with op held.
func (s *Sink) held(ctx context.Context, p *proc, batch []cdc.Change) (map[string]struct{}, error) {
	out := map[string]struct{}{}
	seen := map[string]bool{}
	for i := range batch {
		pr := batch[i].Producer
		if seen[pr] {
			continue
		}
		seen[pr] = true
		r, err := p.sink.Delivered(ctx, &pluginv1.DeliveredRequest{Producer: pr, Cursor: s.cursor})
		if err != nil {
			if ctx.Err() == nil && transport(err) {
				s.crashed(p, err.Error())
				return nil, fmt.Errorf("%s: crashed reading what it holds: %w", who(s.name, s.cfg.Command), sinks.ErrNotConnected)
			}
			return nil, fmt.Errorf("%s: reading what it holds after cursor %q: %w", who(s.name, s.cfg.Command), s.cursor, err)
		}
		for _, id := range r.GetIds() {
			out[id] = struct{}{}
		}
	}
	return out, nil
}

func toProto(c *cdc.Change) *pluginv1.Change {
	return &pluginv1.Change{
		Id: c.ID(), Subject: c.Subject, Payload: c.Payload, Headers: c.Headers,
		Producer: c.Producer, CommitLsn: uint64(c.CommitLSN), Seq: c.Seq,
		Schema: c.Schema, Table: c.Table, Op: string(c.Op), CommitTimeUs: c.CommitTime.UnixMicro(),
	}
}

// Close asks the plugin to close, bounded by ctx, and stops the process.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	p := s.p
	s.p = nil
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	var err error
	if !p.exited() {
		r, rerr := p.sink.Close(ctx, &pluginv1.CloseRequest{})
		switch {
		case rerr != nil:
			err = fmt.Errorf("%s: closing: %w", who(s.name, s.cfg.Command), rerr)
		case r.GetError() != nil:
			err = s.pluginError("closing", r.GetError())
		}
	}
	p.stop()
	return err
}

// Cursor returns the plugin's cursor after the last successful Write.
func (r resuming) Cursor() string {
	r.op.Lock()
	defer r.op.Unlock()
	return r.cursor
}

// Delivered asks the plugin which of producer's changes it holds past cursor.
func (r resuming) Delivered(ctx context.Context, producer, cursor string) (map[cdc.Pos]struct{}, error) {
	r.op.Lock()
	defer r.op.Unlock()
	p, err := r.current()
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("%s: not running: %w", who(r.name, r.cfg.Command), sinks.ErrNotConnected)
	}
	resp, err := p.sink.Delivered(ctx, &pluginv1.DeliveredRequest{Producer: producer, Cursor: cursor})
	if err != nil {
		return nil, fmt.Errorf("%s: reading what it holds after cursor %q: %w", who(r.name, r.cfg.Command), cursor, err)
	}
	out := make(map[cdc.Pos]struct{}, len(resp.GetIds()))
	for _, id := range resp.GetIds() {
		pr, pos, err := cdc.ParseID(id)
		if err != nil {
			return nil, fmt.Errorf("%s: Delivered returned %q: %w", who(r.name, r.cfg.Command), id, err)
		}
		if pr == producer {
			out[pos] = struct{}{}
		}
	}
	return out, nil
}

// Deduplicates reports that the plugin drops what it holds already.
func (d deduping) Deduplicates() bool { return true }

// Deduplicates reports whether the plugin also drops what it holds already.
func (r resuming) Deduplicates() bool { return r.desc.GetDedupes() }

var (
	_ sinks.Sink         = (*Sink)(nil)
	_ sinks.Resumer      = resuming{}
	_ sinks.Deduplicator = deduping{}
)
