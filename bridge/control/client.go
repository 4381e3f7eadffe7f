package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Client asks the running instances of one bridge over NATS, as `bridge
// status`, `bridge pause` and the other commands do.
type Client struct {
	nc     *nats.Conn
	bridge string
	// Quiet is how long a request every instance answers waits for more
	// answers after the last one. Default 300ms.
	Quiet time.Duration
}

// NewClient returns a client of bridge's instances over nc.
func NewClient(nc *nats.Conn, bridge string) *Client {
	return &Client{nc: nc, bridge: bridge, Quiet: 300 * time.Millisecond}
}

// answer is one instance's reply: its JSON, or its service error.
type answer struct {
	data []byte
	err  *Error
}

// PermissionError is NATS refusing the client's user a subject.
type PermissionError struct {
	Subject string
	Err     error
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("NATS refused this user %s (%v): grant it in the NATS server's permissions (docs/control.md, \"Permissions\")", e.Subject, e.Err)
}

func (e *PermissionError) Unwrap() error { return e.Err }

// gather publishes body to subject and collects the answers: the first
// only when first, else every answer until none came for c.Quiet or ctx
// ends. No answer at all is ErrNoAnswer.
func (c *Client) gather(ctx context.Context, subject string, body []byte, hdr nats.Header, first bool) ([]answer, error) {
	inbox := c.nc.NewRespInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("subscribing to the replies: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := &nats.Msg{Subject: subject, Reply: inbox, Data: body, Header: hdr}
	if err := c.nc.PublishMsg(msg); err != nil {
		return nil, fmt.Errorf("publishing to %s: %w", subject, err)
	}
	// The server answers a refused publish or subscription with an error
	// before the flush's pong.
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = c.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("reaching NATS: %w", err)
	}
	if err := c.nc.LastError(); err != nil && errors.Is(err, nats.ErrPermissionViolation) {
		switch {
		case strings.Contains(err.Error(), `"`+subject+`"`):
			return nil, &PermissionError{Subject: "publishing to " + subject, Err: err}
		case strings.Contains(err.Error(), `"`+inbox+`"`), strings.Contains(err.Error(), "Subscription"):
			return nil, &PermissionError{Subject: "subscribing to its reply inbox " + inbox, Err: err}
		}
	}
	var out []answer
	for {
		wctx, wcancel := ctx, context.CancelFunc(func() {})
		if len(out) > 0 {
			wctx, wcancel = context.WithTimeout(ctx, c.Quiet)
		}
		m, err := sub.NextMsgWithContext(wctx)
		wcancel()
		if err != nil {
			if len(out) > 0 {
				return out, nil
			}
			if errors.Is(err, nats.ErrNoResponders) {
				return nil, fmt.Errorf("%w on %s: no bridge listens there", ErrNoAnswer, subject)
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return nil, fmt.Errorf("%w on %s", ErrNoAnswer, subject)
			}
			return nil, fmt.Errorf("waiting for answers on %s: %w", subject, err)
		}
		if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
			return nil, fmt.Errorf("%w on %s: no bridge listens there", ErrNoAnswer, subject)
		}
		a := answer{data: m.Data}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			e := &Error{}
			if json.Unmarshal(m.Data, e) != nil || e.Description == "" {
				e = &Error{Description: m.Header.Get(micro.ErrorHeader)}
			}
			e.Code = code
			a.err = e
		}
		out = append(out, a)
		if first {
			return out, nil
		}
	}
}

// all asks every instance and decodes each answer into a new T.
func all[T any](ctx context.Context, c *Client, action string, body []byte) ([]T, []*Error, error) {
	as, err := c.gather(ctx, Subject(c.bridge, action), body, nil, false)
	if err != nil {
		return nil, nil, err
	}
	var out []T
	var errs []*Error
	for _, a := range as {
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		var v T
		if err := json.Unmarshal(a.data, &v); err != nil {
			return nil, nil, fmt.Errorf("an answer on %s does not decode: %w", Subject(c.bridge, action), err)
		}
		out = append(out, v)
	}
	return out, errs, nil
}

// Status asks every instance for its status, sorted by instance.
func (c *Client) Status(ctx context.Context) ([]StatusReply, error) {
	out, errs, err := all[StatusReply](ctx, c, ActionStatus, nil)
	if err == nil && len(out) == 0 && len(errs) > 0 {
		err = errs[0]
	}
	slices.SortFunc(out, func(a, b StatusReply) int { return strings.Compare(a.Instance, b.Instance) })
	return out, err
}

// Sources asks every instance for its sources, sorted by instance.
func (c *Client) Sources(ctx context.Context) ([]SourcesReply, error) {
	out, errs, err := all[SourcesReply](ctx, c, ActionSources, nil)
	if err == nil && len(out) == 0 && len(errs) > 0 {
		err = errs[0]
	}
	slices.SortFunc(out, func(a, b SourcesReply) int { return strings.Compare(a.Instance, b.Instance) })
	return out, err
}

// ReloadResult is one instance's answer to a reload.
type ReloadResult struct {
	Reply ReloadReply
	// Err is the instance's refusal (CodeInvalid, with the problems).
	Err *Error
}

// Reload asks every instance to reload its configuration.
func (c *Client) Reload(ctx context.Context) ([]ReloadResult, error) {
	as, err := c.gather(ctx, Subject(c.bridge, ActionReload), nil, nil, false)
	if err != nil {
		return nil, err
	}
	var out []ReloadResult
	for _, a := range as {
		var r ReloadResult
		if a.err != nil {
			r.Err = a.err
			out = append(out, r)
			continue
		}
		if err := json.Unmarshal(a.data, &r.Reply); err != nil {
			return nil, fmt.Errorf("an answer to reload does not decode: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// NoHolderError says that instances answered but none holds the source.
type NoHolderError struct {
	Source string
	// States lists what each instance running the source reported.
	States []string
}

func (e *NoHolderError) Error() string {
	if len(e.States) == 0 {
		return fmt.Sprintf("no running instance of the bridge has a source named %q", e.Source)
	}
	return fmt.Sprintf("no instance holds source %q now (%s)", e.Source, strings.Join(e.States, "; "))
}

// Unwrap makes a NoHolderError an ErrNoAnswer: the caller falls back.
func (e *NoHolderError) Unwrap() error { return ErrNoAnswer }

// Holder finds the instance holding source: it asks every instance for
// its sources. An error wrapping ErrNoAnswer means none answered, or none
// holds it (a *NoHolderError).
func (c *Client) Holder(ctx context.Context, source string) (string, error) {
	srcs, err := c.Sources(ctx)
	if err != nil {
		return "", err
	}
	nh := &NoHolderError{Source: source}
	for _, r := range srcs {
		for _, s := range r.Sources {
			if s.Name != source {
				continue
			}
			if s.Holder {
				return r.Instance, nil
			}
			nh.States = append(nh.States, fmt.Sprintf("instance %s: %s", r.Instance, s.State))
		}
	}
	return "", nh
}

// onSource sends an action on source to the instance holding it and
// decodes its answer into out.
func (c *Client) onSource(ctx context.Context, action, source string, req, out any) error {
	inst, err := c.Holder(ctx, source)
	if err != nil {
		return err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hdr := nats.Header{InstanceHeader: []string{inst}}
	subject := SourceSubject(c.bridge, action, source)
	as, err := c.gather(ctx, subject, body, hdr, true)
	if err != nil {
		if errors.Is(err, ErrNoAnswer) {
			return fmt.Errorf("instance %s, which holds source %q, did not answer on %s in time: the %s may still be under way; see `bridge status`", inst, source, subject, action)
		}
		return err
	}
	if e := as[0].err; e != nil {
		if e.Instance == "" {
			e.Instance = inst
		}
		return e
	}
	return json.Unmarshal(as[0].data, out)
}

// Pause asks the instance holding source to pause it.
func (c *Client) Pause(ctx context.Context, source string, req PauseRequest) (SourceReply, error) {
	var out SourceReply
	err := c.onSource(ctx, ActionPause, source, req, &out)
	return out, err
}

// Resume asks the instance holding source to resume it.
func (c *Client) Resume(ctx context.Context, source string, req ResumeRequest) (SourceReply, error) {
	var out SourceReply
	err := c.onSource(ctx, ActionResume, source, req, &out)
	return out, err
}

// Snapshot asks the instance holding source to queue a snapshot.
func (c *Client) Snapshot(ctx context.Context, source string, req SnapshotRequest) (SnapshotReply, error) {
	var out SnapshotReply
	err := c.onSource(ctx, ActionSnapshot, source, req, &out)
	return out, err
}

// Resync asks the instance holding source for an operator resync.
func (c *Client) Resync(ctx context.Context, source string, req ResyncRequest) (ResyncReply, error) {
	var out ResyncReply
	err := c.onSource(ctx, ActionResync, source, req, &out)
	return out, err
}
