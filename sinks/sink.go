// Package sinks holds the Sink contract, the registry of sink plugins and the
// errors sinks return. Implementations live in sub-packages and never import
// the runtime.
package sinks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/registry"
)

// Sink delivers batches of changes to one destination. The bridge calls
// Connect, then Write any number of times (never concurrently, so order
// holds), then Close. Each change arrives with Subject and Payload already
// set by the router.
type Sink interface {
	// Connect dials. It is retried with backoff until it returns nil, and
	// again after a Write returns ErrNotConnected.
	Connect(ctx context.Context) error
	// Write returns when every change is durably accepted or failed. nil:
	// all delivered; *BatchError: the listed indexes failed and the others
	// were delivered; any other error: the whole batch failed.
	Write(ctx context.Context, batch []cdc.Change) error
	// Close flushes in-flight work and returns by ctx's deadline, even if
	// the server hangs.
	Close(ctx context.Context) error
}

// Resumer is implemented by sinks that can report what they already hold
// beyond a checkpoint, so a replay after a crash publishes nothing twice even
// past the destination's dedupe window (DESIGN.md §4.6).
type Resumer interface {
	// Cursor returns an opaque position after the last successful Write; the
	// pipeline stores it with the checkpoint. Called between Writes.
	Cursor() string
	// Delivered lists the positions of producer's changes the destination
	// holds after cursor (as returned by Cursor at some earlier checkpoint;
	// empty means from the beginning).
	Delivered(ctx context.Context, producer, cursor string) (map[cdc.Pos]struct{}, error)
}

// SubjectSet is the subjects a sink accepts, as its configuration states
// them.
type SubjectSet struct {
	// Filters are NATS subject filters ("cdc.shop.>"): a subject the sink
	// is given must match one of them.
	Filters []string
	// Of names what binds them, for messages: `stream "CDC"`.
	Of string
	// Key is the key of the sink's config block that sets them
	// ("subjects"); "" when none does.
	Key string
}

// SubjectLimiter is implemented by sinks that accept only some subjects
// and know which from their configuration alone (a JetStream stream the
// sink creates binds its configured subjects). Before the first change the
// runtime refuses, and `bridge validate` reports, a route whose subject
// template can render a subject outside them, naming the route, the
// subjects and the sink's key. It does no I/O.
type SubjectLimiter interface {
	// AcceptedSubjects returns the subjects the sink accepts; ok is false
	// when only the server knows them (a stream the sink does not create).
	AcceptedSubjects() (set SubjectSet, ok bool)
}

// SubjectBlind is implemented by sinks that file each change by
// something other than its subject (nats_kv: by its row's key). A route's
// dead-letter subject (on_schema_change: dead_letter) cannot set a change
// aside in such a sink, so the runtime refuses, and `bridge validate`
// reports, a route with that policy to one. It does no I/O.
type SubjectBlind interface{ SubjectBlind() bool }

// Checker is implemented by sinks that can check their destination
// without changing anything, for `bridge validate --connect`.
type Checker interface {
	// Check connects and checks what Connect checks and sets up (what
	// Connect would create is reported as such, not created), and that
	// the destination takes the subjects of req. It returns one
	// config.Check per line, in the order they should print; a failure to
	// connect is a failed Check, not an error. ctx bounds the whole check.
	Check(ctx context.Context, req CheckRequest) []config.Check
}

// CheckRequest is what the runtime asks a Checker to check besides the
// sink's own setup.
type CheckRequest struct {
	// Subjects lists the subjects the routes give this sink's changes.
	Subjects []SubjectUse
}

// SubjectUse is a subject one route gives changes.
type SubjectUse struct {
	// Route names the route for messages: "routes[0].subject".
	Route string
	// Subject is a NATS subject whose "*" tokens stand for a value known
	// only per change (a column, a table a glob matches).
	Subject string
}

// AtMostOnce is implemented by sinks that do not hold back the checkpoint
// (core NATS): a failed write there is logged and counted, not retried forever.
type AtMostOnce interface{ AtMostOnce() bool }

// Deduplicator is implemented by sinks that, without a Resumer, drop by
// themselves what a replay after a crash writes to them again (a KV mirror
// that compares each key's stored position): the pipeline replays from the
// checkpoint into them and they stay exactly once in effect.
type Deduplicator interface{ Deduplicates() bool }

// Guarantee describes what a crash of the bridge means for s: "exactly
// once" (a Resumer: nothing past the checkpoint is written twice, snapshot
// reads included), "exactly once in effect" (a Deduplicator), "at most
// once" (an AtMostOnce sink) or "at least once" (none of them: after a
// crash, changes and snapshot reads since the last checkpoint are written
// to it again, with the same ids, and only its own dedupe by id keeps them
// once). why says so in a sentence for users.
func Guarantee(s Sink) (kind, why string) {
	if amo, ok := s.(AtMostOnce); ok && amo.AtMostOnce() {
		return "at most once", "a change the destination does not take is dropped, never written twice"
	}
	if _, ok := s.(Resumer); ok {
		return "exactly once", "after a crash the bridge reads what the destination holds past the checkpoint and does not write it again, snapshot rows included"
	}
	if d, ok := s.(Deduplicator); ok && d.Deduplicates() {
		return "exactly once in effect", "after a crash the bridge writes what follows the checkpoint again and the sink drops what it holds already"
	}
	return "at least once", "after a crash the bridge writes what follows the checkpoint again, snapshot rows included, with the same ids (Change.ID): the destination must drop what it holds already by id to keep each change once"
}

// DeadLetterCounter is implemented by sinks that divert changes their
// destination would refuse for good to a dead-letter subject instead of
// stopping. DeadLetters returns how many changes this sink instance has
// stored there, counted when the Write that diverted them returned with
// them stored (a change diverted again by a retried Write counts again).
// The runtime exports it as bridge_sink_dead_letters_total.
type DeadLetterCounter interface{ DeadLetters() uint64 }

// ErrNotConnected makes the pipeline call Connect before retrying.
var ErrNotConnected = errors.New("sinks: not connected")

// BatchError reports per-change failures of one Write.
type BatchError struct {
	// Failed maps batch indexes to their errors.
	Failed map[int]error
}

// Fail records that index i failed with err.
func (b *BatchError) Fail(i int, err error) {
	if b.Failed == nil {
		b.Failed = map[int]error{}
	}
	b.Failed[i] = err
}

// Err returns b, or nil when nothing failed.
func (b *BatchError) Err() error {
	if b == nil || len(b.Failed) == 0 {
		return nil
	}
	return b
}

// Indexes returns the failed indexes in order.
func (b *BatchError) Indexes() []int {
	out := make([]int, 0, len(b.Failed))
	for i := range b.Failed {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

func (b *BatchError) Error() string {
	idx := b.Indexes()
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d of the batch failed", len(idx))
	if len(idx) > 0 {
		fmt.Fprintf(&sb, "; first (#%d): %v", idx[0], b.Failed[idx[0]])
	}
	return sb.String()
}

// Unwrap returns the per-change errors, so errors.Is finds a Permanent one.
func (b *BatchError) Unwrap() []error {
	out := make([]error, 0, len(b.Failed))
	for _, i := range b.Indexes() {
		out = append(out, b.Failed[i])
	}
	return out
}

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks err as not worth retrying: the pipeline stops with it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err, or one it wraps, was marked Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// Env is what the runtime gives a sink factory.
type Env struct {
	// Name is the sink's name in bridge.yaml.
	Name string
	// Logger is scoped to the sink.
	Logger *slog.Logger
	// NATS is the default NATS connection (bridge.yaml's nats section, or the
	// embedded server) for sinks whose own URL is empty.
	NATS NATSEnv
}

// NATSEnv is the bridge's NATS connection setting: bridge.yaml's nats
// section, with URL the server the bridge uses (nats.url, the embedded
// server's, or the one nats.context names). The client keys are as
// configured (nats.context not applied); internal/natsconn resolves them.
type NATSEnv struct {
	URL string
	config.NATSClient
}

// Factory builds a sink from its config block. It must not do network I/O.
type Factory func(decode config.Decoder, env Env) (Sink, error)

// Plugin is a registered sink type.
type Plugin struct {
	// New builds an instance.
	New Factory
	// Config is a zero or default config value; `bridge plugins` lists its keys.
	Config any
	// Doc is one line describing the plugin.
	Doc string
	// Batch holds this type's defaults for the framework's batch keys
	// (sinks.<name>.batch); a zero field keeps the framework's default
	// (max_changes 1000, max_wait 1ms). What a sink's config sets wins.
	Batch config.Batch
	// Exec is set by a type whose instances run another program (type
	// plugin): `bridge plugins` describes the configured ones with it and
	// `bridge plugin test` checks an executable. nil for the others.
	Exec *Exec
}

// Exec is what `bridge plugins` and `bridge plugin test` need of a sink
// type that runs executables.
type Exec struct {
	// Describe starts the program a sink's config block names (checking
	// it as the sink would) and returns one line about it: what it is and
	// the delivery guarantee it declares. It stops the program again.
	Describe func(decode config.Decoder, env Env) (string, error)
	// Test runs the sink conformance suite (sinks/sinktest) against the
	// executable at path, started with args and given block as its own
	// config, printing the report to stdout as `go test -v` does. It
	// returns false when a case failed, and an error when it could not run.
	Test func(path string, args []string, block map[string]any) (passed bool, err error)
}

// BatchDefaults returns the batch defaults of reg's sink types, for
// config.WithBatchDefaults; an unknown type gets none of its own.
func BatchDefaults(reg *Registry) func(sinkType string) config.Batch {
	return func(typ string) config.Batch {
		p, err := reg.Lookup(typ)
		if err != nil {
			return config.Batch{}
		}
		return p.Batch
	}
}

// Registry maps sink types to plugins.
type Registry = registry.Registry[Plugin]

// NewRegistry returns an empty registry, for tests.
func NewRegistry() *Registry { return registry.New[Plugin]("sink") }

// Default is the registry the compiled-in plugins register with from init.
var Default = NewRegistry()

// MustRegister registers p as typ in Default and panics on a duplicate; call
// it from init.
func MustRegister(typ string, p Plugin) {
	if err := Default.Register(typ, p); err != nil {
		panic(err)
	}
}
