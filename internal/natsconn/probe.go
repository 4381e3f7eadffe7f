package natsconn

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Probe is a NATS connection for checks that change nothing (`bridge
// validate --connect`). It records the permission violations the server
// reports, which NATS sends apart from the request that caused them.
type Probe struct {
	NC *nats.Conn

	mu         sync.Mutex
	violations []string
}

// DialProbe connects to c.URL with c's credentials and TLS, once (no
// reconnects); ctx's deadline (at most 5s) bounds it. An error is
// Connect's.
func DialProbe(ctx context.Context, c Conn) (*Probe, error) {
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(d), time.Millisecond))
	}
	p := &Probe{}
	nc, err := Connect(c, "bridge validate",
		nats.Timeout(timeout),
		nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			p.mu.Lock()
			p.violations = append(p.violations, err.Error())
			p.mu.Unlock()
		}))
	if err != nil {
		return nil, err
	}
	p.NC = nc
	return p, nil
}

// Close closes the connection.
func (p *Probe) Close() { p.NC.Close() }

// Denied returns the subjects the server refused since the connection
// opened: publishing to (publish true) or subscribing to.
func (p *Probe) Denied(publish bool) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, v := range p.violations {
		m := violationRE.FindStringSubmatch(v)
		if m != nil && strings.EqualFold(m[1], "publish") == publish {
			out = append(out, m[2])
		}
	}
	return out
}

// Outcome is what became of a probe publish.
type Outcome int

// The outcomes of TryPublish.
const (
	// NoAnswer: nothing answered in time (a stream without acks, a slow
	// server, or a refusal not reported).
	NoAnswer Outcome = iota
	// Denied: the account's permissions refuse publishing to the subject.
	Denied
	// NoStream: no stream binds the subject.
	NoStream
	// Bound: the expected stream binds it, and refused the probe as meant.
	Bound
	// OtherStream: another stream binds it.
	OtherStream
	// Refused: a stream refused it for another reason (Detail).
	Refused
	// Stored: a stream stored it; TryPublish's headers should prevent that.
	Stored
)

// Result is what became of one subject's probe.
type Result struct {
	Outcome Outcome
	Detail  string // the stream's error, for Refused
}

// maxSeq is a stream sequence no stream reaches: a publish expecting it
// as the last sequence is refused.
const maxSeq = "9223372036854775807"

// TryPublish publishes, to each subject, a message that JetStream refuses
// whatever stream binds the subject (it expects stream to be the stream,
// and its last sequence to be one no stream reaches),
// with a reply subject, and reports per subject what happened: denied by
// the permissions, no stream, bound to stream or to another, refused
// otherwise, or no answer by ctx's deadline (at most 3s). Nothing is
// stored. An error means the probe itself could not run (the reply
// subscription, the flush).
func (p *Probe) TryPublish(ctx context.Context, stream string, subjects []string) (map[string]Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	inbox := nats.NewInbox()
	// A channel, not a sync subscription: NextMsg turns a no-responders
	// status into an error and drops the message that says whose it is.
	answers := make(chan *nats.Msg, len(subjects))
	sub, err := p.NC.ChanSubscribe(inbox+".*", answers)
	if err != nil {
		return nil, fmt.Errorf("subscribing to %s.*: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	out := make(map[string]Result, len(subjects))
	for i, s := range subjects {
		m := nats.NewMsg(s)
		m.Reply = inbox + "." + strconv.Itoa(i)
		m.Header.Set("Nats-Expected-Stream", stream)
		m.Header.Set("Nats-Expected-Last-Sequence", maxSeq)
		if err := p.NC.PublishMsg(m); err != nil {
			return nil, fmt.Errorf("publishing to %s: %w", s, err)
		}
		out[s] = Result{Outcome: NoAnswer}
	}
	if err := p.NC.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("flushing: %w", err)
	}
	answered := map[string]bool{}
	pending := func() bool { // a subject neither answered nor denied
		denied := p.Denied(true)
		for _, s := range subjects {
			if !answered[s] && !slices.Contains(denied, s) {
				return true
			}
		}
		return false
	}
	tick := time.NewTicker(50 * time.Millisecond) // denials arrive apart from answers
	defer tick.Stop()
wait:
	for pending() {
		var m *nats.Msg
		select {
		case m = <-answers:
		case <-tick.C:
			continue
		case <-ctx.Done():
			break wait // the rest: denied or unanswered, see below
		}
		i, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil || i < 0 || i >= len(subjects) {
			continue
		}
		out[subjects[i]] = classify(m)
		answered[subjects[i]] = true
	}
	for _, s := range p.Denied(true) {
		if r, ok := out[s]; ok && r.Outcome == NoAnswer {
			out[s] = Result{Outcome: Denied}
		}
	}
	return out, nil
}

// classify reads a probe's answer.
func classify(m *nats.Msg) Result {
	if m.Header.Get("Status") == "503" {
		return Result{Outcome: NoStream}
	}
	var ack struct {
		Stream string `json:"stream"`
		Error  *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return Result{Outcome: Refused, Detail: fmt.Sprintf("unexpected answer %q", m.Data)}
	}
	switch {
	case ack.Error == nil:
		return Result{Outcome: Stored, Detail: ack.Stream}
	case ack.Error.ErrCode == 10060: // expected stream does not match
		return Result{Outcome: OtherStream}
	case ack.Error.ErrCode == 10071: // wrong last sequence
		return Result{Outcome: Bound}
	}
	return Result{Outcome: Refused, Detail: ack.Error.Description}
}
