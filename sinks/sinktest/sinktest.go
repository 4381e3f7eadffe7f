// Package sinktest is the conformance suite every sink runs, ours and
// users': Run builds fresh instances through the sink's registered Factory
// and checks the sinks.Sink contract against the real destination.
//
// A sink's test describes its destination in a Harness and calls Run:
//
//	func TestConformance(t *testing.T) {
//		srv := startMyServer(t)
//		sinktest.Run(t, sinktest.Harness{
//			Type:  "acme_kafka",
//			YAML:  "brokers: [" + srv.Addr() + "]\ntopic: cdc\n",
//			Read:  func(t *testing.T) []sinktest.Received { return readTopic(t, srv, "cdc") },
//			Break: func(t *testing.T) { srv.Stop(t) },
//			Heal:  func(t *testing.T) { srv.Start(t) },
//		})
//	}
//
// Each case is a subtest with its own producer id ("sinktest.<case>.<random
// epoch>"), so cases never see each other's changes even on a shared or
// persistent destination, and ends with a goroutine leak check
// (goleak.VerifyNone, ignoring the goroutines alive when the case began).
// The cases:
//
//   - config: the plugin is registered with New, Doc and a struct Config;
//     the YAML block decodes through config.Decoder, survives an encode and
//     decode round trip unchanged, and the Factory accepts it; an unknown
//     key fails with a *config.FieldError naming its full YAML path.
//   - connect_close: Close before Connect, Connect twice, an empty Write,
//     Close twice all return nil; a Write after Close fails.
//   - ordered: several batches arrive complete and in order, each with its
//     ID, payload, subject and headers as written.
//   - partial_failure (needs Break): a Write to the broken destination
//     fails; every index a *sinks.BatchError does not list really arrived;
//     after Heal and Connect the retried changes arrive, in order.
//   - break_during_write (needs Break): the same, with Break called while a
//     large Write is under way.
//   - close_deadline: Close under a 100ms deadline returns in time, also
//     with the destination broken (and then a Write and a fresh instance's
//     Connect under 100ms deadlines return in time too).
//   - replay: the same batch written twice (and, when Dedupes, part of it
//     again by a second instance, as after a restart) is stored once when
//     Dedupes, at least once otherwise.
//
// A destination that keeps the latest state of each row rather than every
// change (a key-value mirror) sets Harness.Mirror: the cases then check the
// rows it holds instead of the messages, by folding the changes written
// per key in order (see Harness.Mirror).
//
// Between failures the suite drives the sink as the pipeline does: it
// retries the indexes a *sinks.BatchError lists (the whole batch after any
// other error), calling Connect before each retry.
package sinktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// Harness describes a sink and its destination to Run.
type Harness struct {
	// Type is the sink's registered type, e.g. "nats_jetstream". Required.
	Type string
	// Registry holds Type. Default sinks.Default, where init registers.
	Registry *sinks.Registry
	// YAML is the sink's `config:` block, pointing at the test destination.
	// Every instance is built from it through the Factory. Required.
	YAML string
	// Env is passed to the Factory. Name defaults to "sinktest" (it is also
	// the middle of the YAML path in errors: "sinks.sinktest.config") and
	// Logger to one that discards.
	Env sinks.Env

	// Read returns what the destination holds so far, in arrival order,
	// every message written by any instance (Run keeps those of the current
	// case). It is called from the test goroutine, polled until what a case
	// expects is there, and never while the destination is broken.
	// Required.
	Read func(t *testing.T) []Received
	// Break makes the destination fail (stop a server, answer 503, ...)
	// until Heal. It may be called while a Write is under way. Optional:
	// without it the failure cases are skipped. Heal is required with it.
	Break func(t *testing.T)
	// Heal undoes Break and returns once the destination serves again
	// (and, for Read, once any reader of it is back). Run heals a broken
	// destination at the end of each case. Resources created here that
	// outlive the case must be tied to the t that built the Harness.
	Heal func(t *testing.T)

	// AtMostOnce says the sink implements sinks.AtMostOnce returning true
	// (Run checks that it does): a change its Write did not report failed
	// may still be missing after a failure, so only changes written while
	// the destination is healthy must arrive.
	AtMostOnce bool
	// Dedupes says the destination stores a replayed change (same ID) once;
	// otherwise Run expects at least once.
	Dedupes bool
	// Wait bounds how long Run polls Read for what a case expects (and,
	// doubled, how long a Write or Connect may keep failing after Heal).
	// Default 10s.
	Wait time.Duration
	// Mirror, when set, says the destination keeps the latest state of
	// each row rather than every change (a key-value mirror such as
	// nats_kv). It returns the key the destination files c's row under,
	// and false for a change the destination does not hold (a logical
	// decoding message). Derive it from the change (schema, table, key
	// values) independently of the sink's own code, so that a sink filing
	// rows under the wrong keys fails. Read then returns what the
	// destination holds now: one Received per key, Key set, a deleted row
	// either absent or a tombstone (Deleted set, ID the delete's). Run
	// checks the cases by folding the changes written per key in order:
	// where messages must arrive once each and in order, every key must
	// hold the last change written to it; where they must have arrived
	// (after a failure), every key must hold its last delivered change or
	// a later one, never an earlier one: a retried or replayed change must
	// not win over a later one the destination holds.
	Mirror func(c *cdc.Change) (key string, ok bool)
	// IgnoreLeaks are extra options for the per-case goroutine leak check,
	// for goroutines the destination rather than the sink starts. Goroutines
	// alive at the start of a case and right after each Heal are ignored
	// already; an in-process destination that starts goroutines when first
	// used (a stream, a topic) is best given those before Run.
	IgnoreLeaks []goleak.Option
}

// Received is one message as the destination holds it.
type Received struct {
	// ID is the change's ID as the destination recorded it (Nats-Msg-Id,
	// Idempotency-Key, a field of the stored record). Required: it is the
	// dedupe key every sink must carry.
	ID string
	// Subject is the subject the message was published to; "" when the
	// destination has none, and then not checked.
	Subject string
	// Payload is the message body as the sink was given it.
	Payload []byte
	// Headers are the message's headers; nil when the destination keeps
	// none, and then not checked. Otherwise every header of the change must
	// be there with its value.
	Headers map[string]string
	// Key is the row's key, for a Harness.Mirror destination.
	Key string
	// Deleted marks a Harness.Mirror destination's tombstone of a deleted
	// row; its Payload is checked when not nil.
	Deleted bool
}

// Timing of the suite.
const (
	// shortDeadline is the deadline of the Close (and broken Write and
	// Connect) under test; slack is how much later they may return.
	shortDeadline = 100 * time.Millisecond
	slack         = 400 * time.Millisecond
	// defaultWait is Harness.Wait's default.
	defaultWait = 10 * time.Second
)

// Run runs the conformance cases against the sink h describes, each as a
// subtest of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Registry == nil {
		h.Registry = sinks.Default
	}
	if h.Env.Name == "" {
		h.Env.Name = "sinktest"
	}
	if h.Env.Logger == nil {
		h.Env.Logger = slog.New(slog.DiscardHandler)
	}
	if h.Wait <= 0 {
		h.Wait = defaultWait
	}
	require.NotEmpty(t, h.Type, "sinktest: Harness.Type must be set")
	require.NotNil(t, h.Read, "sinktest: Harness.Read must be set")
	require.Equal(t, h.Break == nil, h.Heal == nil, "sinktest: set both Harness.Break and Harness.Heal, or neither")
	p, err := h.Registry.Lookup(h.Type)
	require.NoError(t, err, "sinktest: the sink type is not registered")
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(h.YAML), &raw), "sinktest: Harness.YAML is not a YAML mapping")
	if raw == nil {
		raw = map[string]any{}
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	epoch := hex.EncodeToString(b[:])
	for _, c := range []struct {
		name       string
		needsBreak bool
		run        func(*runner)
	}{
		{"config", false, (*runner).configCase},
		{"connect_close", false, (*runner).connectClose},
		{"ordered", false, (*runner).ordered},
		{"partial_failure", true, (*runner).partialFailure},
		{"break_during_write", true, (*runner).breakDuringWrite},
		{"close_deadline", false, (*runner).closeDeadline},
		{"replay", false, (*runner).replay},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.needsBreak && h.Break == nil {
				t.Skip("sinktest: Harness.Break is not set")
			}
			r := &runner{t: t, h: h, p: p, raw: raw, producer: "sinktest." + c.name + "." + epoch}
			r.ignore = append([]goleak.Option{goleak.IgnoreCurrent()}, h.IgnoreLeaks...)
			t.Cleanup(r.cleanup) // registered first: runs after every other cleanup of the case
			c.run(r)
		})
	}
}

// runner is the state of one case.
type runner struct {
	t        *testing.T
	h        Harness
	p        sinks.Plugin
	raw      map[string]any
	producer string
	built    []sinks.Sink
	broken   bool
	ignore   []goleak.Option
}

func (r *runner) path() string { return "sinks." + r.h.Env.Name + ".config" }

// newSink builds an instance through the Factory; the case closes it at the end.
func (r *runner) newSink() sinks.Sink {
	r.t.Helper()
	s, err := r.p.New((*config.Config)(nil).Decoder(r.path(), r.raw), r.h.Env)
	require.NoError(r.t, err, "building the sink from Harness.YAML")
	require.NotNil(r.t, s)
	r.built = append(r.built, s)
	return s
}

func (r *runner) cleanup() {
	for _, s := range r.built {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Close(ctx)
		cancel()
	}
	if r.broken {
		r.heal()
	}
	goleak.VerifyNone(r.t, r.ignore...)
}

func (r *runner) brk() {
	r.t.Helper()
	r.broken = true
	r.h.Break(r.t)
}

func (r *runner) heal() {
	r.t.Helper()
	r.h.Heal(r.t)
	r.broken = false
	// A restarted in-process server has new goroutines; they are not the sink's.
	r.ignore = append(r.ignore, goleak.IgnoreCurrent())
}

// connect calls Connect until it succeeds, as the pipeline does.
func (r *runner) connect(s sinks.Sink) {
	r.t.Helper()
	deadline := time.Now().Add(2 * r.h.Wait)
	backoff := 20 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(r.t.Context(), 5*time.Second)
		err := s.Connect(ctx)
		cancel()
		if err == nil {
			return
		}
		require.False(r.t, sinks.IsPermanent(err), "Connect failed permanently: %v", err)
		if time.Now().After(deadline) {
			r.t.Fatalf("Connect still failing %s after the destination is healthy: %v", 2*r.h.Wait, err)
		}
		r.pause(&backoff)
	}
}

// pause waits backoff, doubling it up to 500ms.
func (r *runner) pause(backoff *time.Duration) {
	select {
	case <-time.After(*backoff):
	case <-r.t.Context().Done():
	}
	*backoff = min(2**backoff, 500*time.Millisecond)
}

// write calls Write with a generous deadline and requires success.
func (r *runner) write(s sinks.Sink, batch []cdc.Change) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(r.t, s.Write(ctx, batch), "Write to a healthy destination")
}

// failed returns the indexes of batch that err reports failed: those a
// *sinks.BatchError lists, or all of them. It checks the listed indexes.
func (r *runner) failed(err error, batch []cdc.Change) []int {
	r.t.Helper()
	if err == nil {
		return nil
	}
	var be *sinks.BatchError
	if errors.As(err, &be) && len(be.Failed) > 0 {
		idx := be.Indexes()
		for _, i := range idx {
			require.True(r.t, i >= 0 && i < len(batch), "BatchError lists index %d of a batch of %d", i, len(batch))
			require.Error(r.t, be.Failed[i], "BatchError lists index %d with a nil error", i)
		}
		return idx
	}
	all := make([]int, len(batch))
	for i := range all {
		all[i] = i
	}
	return all
}

// deliver writes batch until all of it is delivered, as the pipeline does:
// the indexes a *sinks.BatchError lists are retried (everything after any
// other error), with Connect before each retry.
func (r *runner) deliver(s sinks.Sink, batch []cdc.Change) {
	r.t.Helper()
	deadline := time.Now().Add(2 * r.h.Wait)
	backoff := 20 * time.Millisecond
	pending := batch
	for len(pending) > 0 {
		ctx, cancel := context.WithTimeout(r.t.Context(), 5*time.Second)
		err := s.Write(ctx, pending)
		cancel()
		if err == nil {
			return
		}
		require.False(r.t, sinks.IsPermanent(err), "Write failed permanently: %v", err)
		pending = pick(pending, r.failed(err, pending))
		if time.Now().After(deadline) {
			r.t.Fatalf("Write still failing %s after the destination is healthy: %v", 2*r.h.Wait, err)
		}
		r.connect(s)
		r.pause(&backoff)
	}
}

func pick(batch []cdc.Change, idx []int) []cdc.Change {
	out := make([]cdc.Change, len(idx))
	for j, i := range idx {
		out[j] = batch[i]
	}
	return out
}

// read returns what the destination holds of this case's producer.
func (r *runner) read() []Received {
	r.t.Helper()
	prefix := r.producer + ":"
	var out []Received
	for _, m := range r.h.Read(r.t) {
		if strings.HasPrefix(m.ID, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// eventually polls read until check returns nil, and fails with check's
// last complaint when it does not within Harness.Wait. It returns the last read.
func (r *runner) eventually(check func(got []Received) error) []Received {
	r.t.Helper()
	deadline := time.Now().Add(r.h.Wait)
	tick := 5 * time.Millisecond
	for {
		got := r.read()
		err := check(got)
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("after %s: %v", r.h.Wait, err)
		}
		select {
		case <-time.After(tick):
		case <-r.t.Context().Done():
			r.t.Fatalf("%v", err)
		}
		tick = min(2*tick, 100*time.Millisecond)
	}
}

// has checks that every change of want arrived.
func has(want ...[]cdc.Change) func([]Received) error {
	return func(got []Received) error {
		seen := map[string]bool{}
		for _, m := range got {
			seen[m.ID] = true
		}
		var missing []string
		for _, b := range want {
			for i := range b {
				if id := b[i].ID(); !seen[id] {
					missing = append(missing, id)
				}
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d changes did not arrive, first %s (%d messages arrived)", len(missing), missing[0], len(got))
		}
		return nil
	}
}

// exactly checks that the changes of want arrived once each, in order, and
// nothing else.
func exactly(want []cdc.Change) func([]Received) error {
	return func(got []Received) error {
		if err := has(want)(got); err != nil {
			return err
		}
		ids := make([]string, len(got))
		for i, m := range got {
			ids[i] = m.ID
		}
		wantIDs := idsOf(want)
		for k := range max(len(ids), len(wantIDs)) {
			switch {
			case k >= len(ids):
				return fmt.Errorf("%d messages arrived, want %d", len(ids), len(wantIDs))
			case k >= len(wantIDs):
				return fmt.Errorf("%d messages arrived, want %d: #%d is %s, arrived again or never written", len(ids), len(wantIDs), k, ids[k])
			case ids[k] != wantIDs[k]:
				return fmt.Errorf("arrived out of order or more than once: message #%d is %s, want %s", k, ids[k], wantIDs[k])
			}
		}
		return nil
	}
}

func idsOf(batch []cdc.Change) []string {
	out := make([]string, len(batch))
	for i := range batch {
		out[i] = batch[i].ID()
	}
	return out
}

// checkContent checks every message against the change it claims to be and
// that first arrivals come in the order of all (one sequence, written in order).
func (r *runner) checkContent(got []Received, all []cdc.Change) {
	r.t.Helper()
	if r.h.Mirror != nil {
		r.checkEntries(got, all)
		return
	}
	pos := make(map[string]int, len(all))
	for i := range all {
		pos[all[i].ID()] = i
	}
	last := -1
	seen := map[string]bool{}
	for k, m := range got {
		i, ok := pos[m.ID]
		require.True(r.t, ok, "message #%d has id %q, which was never written", k, m.ID)
		c := &all[i]
		require.Equal(r.t, string(c.Payload), string(m.Payload), "payload of %s", m.ID)
		if m.Subject != "" {
			require.Equal(r.t, c.Subject, m.Subject, "subject of %s", m.ID)
		}
		if m.Headers != nil {
			for k, v := range c.Headers {
				require.Equal(r.t, v, m.Headers[k], "header %q of %s", k, m.ID)
			}
		}
		if seen[m.ID] {
			continue // a duplicate: allowed where it is, checked by the caller
		}
		seen[m.ID] = true
		require.Greater(r.t, i, last, "%s arrived (first) after %s, but was written before it", m.ID, all[max(last, 0)].ID())
		last = i
	}
}

// count returns how many times each id arrived.
func count(got []Received) map[string]int {
	n := map[string]int{}
	for _, m := range got {
		n[m.ID]++
	}
	return n
}

// checkOnce fails when a change arrived more than once.
func (r *runner) checkOnce(got []Received) {
	r.t.Helper()
	for id, n := range count(got) {
		require.Equal(r.t, 1, n, "%s arrived %d times, but the destination dedupes", id, n)
	}
}
