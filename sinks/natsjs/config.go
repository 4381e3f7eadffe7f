package natsjs

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
)

// Config is the sink's `config:` block.
type Config struct {
	// URL is a comma-separated list of NATS server URLs. Default: the
	// bridge's nats.url (or the embedded server, or nats.context's). With
	// url and context empty, the bridge's credentials and tls apply too,
	// each unless this block sets its own; with url or context set, only
	// the keys given here are used.
	URL string `koanf:"url"`
	// NATSClient holds context, creds, nkey_seed_file, user, password,
	// token and tls, as in the nats section.
	config.NATSClient `koanf:",squash"`
	// Stream is the JetStream stream every message goes to. Required. Use
	// one stream per source, or subjects no other writer uses, so the
	// bridge can find its tail on restart (DESIGN.md §4.6).
	Stream string `koanf:"stream"`
	// Subjects the stream binds. Default ["cdc.>"]; an empty list means the
	// default. Every routed subject must match one of the stream's subjects.
	Subjects []string `koanf:"subjects"`
	// CreateStream makes Connect create the stream (file storage) or update
	// it so it binds Subjects (added to the stream's own) with
	// DuplicateWindow and Replicas. Default true. With false the stream
	// must exist already.
	CreateStream bool `koanf:"create_stream"`
	// DuplicateWindow is the stream's dedupe window (Nats-Msg-Id), a
	// duration. Default 2m. Exactly-once holds beyond it too: on restart
	// the bridge reads the stream's tail instead of relying on it.
	DuplicateWindow time.Duration `koanf:"duplicate_window"`
	// Replicas of the stream when the bridge creates or updates it (1-5).
	// Default 1; use 3 on a cluster.
	Replicas int `koanf:"replicas"`
	// MaxPending is the number of published messages awaiting their ack at
	// any time (the pipelining window), in messages. Default 4096.
	MaxPending int `koanf:"max_pending"`
	// AckTimeout is how long a publish waits for its ack before it fails
	// (and is retried), a duration. Default 10s.
	AckTimeout time.Duration `koanf:"ack_timeout"`
	// DeadLetterSubject, when set, receives a change the server refuses for
	// good (a message larger than max_payload or the stream's max_msg_size,
	// counting its payload and every header the bridge sends; a subject
	// that is invalid or not bound to the stream) instead of stopping the
	// bridge. The dead letter carries the change's headers and Nats-Msg-Id,
	// Bridge-Dead-Letter-Reason and Bridge-Original-Subject, and the payload
	// when it fits (else Bridge-Payload-Bytes). It must be bound to the
	// stream. Default "" (stop with the error).
	DeadLetterSubject string `koanf:"dead_letter_subject"`
	// LargePayloadBucket, when set, is a JetStream object store (created
	// when missing) that receives payloads too large for one message (the
	// payload plus every header the bridge sends over max_payload or the
	// stream's max_msg_size), under the change's id; the message then carries the headers
	// Bridge-Payload-Object ("<bucket>/<id>") and Bridge-Payload-Bytes and
	// no payload. Default "" (such a change is refused: dead letter or stop).
	LargePayloadBucket string `koanf:"large_payload_bucket"`
	// AtomicTransactions publishes each Postgres transaction of 2 to 1000
	// changes as one JetStream atomic batch (nats-server >= 2.12, stream
	// allow_atomic, set when the bridge creates or updates the stream), so
	// consumers see all of it or none. Larger transactions, and streams
	// that do not allow it, are published message by message. Default
	// false: nats-server 2.15 stages each batch of an R1 file stream in a
	// file store of its own, about 8 ms per transaction here.
	AtomicTransactions bool `koanf:"atomic_transactions"`
	// ExpectLastSequence makes every publish carry
	// Nats-Expected-Last-Sequence (the first message of an atomic batch),
	// chained from the stream's last sequence at the start of a run, so
	// the stream refuses anything published by an instance that is no
	// longer the owner: a zombie bridge resumed after a standby took over,
	// or publishes of a killed one still in the server's queue. Requires
	// that nothing else writes to the stream (one stream per source): a
	// run that finds another producer's message in the stream's tail
	// turns it off with a warning. Set false for a shared stream, which
	// then relies on the checkpoint's compare-and-set and the duplicate
	// window alone. Default true.
	ExpectLastSequence bool `koanf:"expect_last_sequence"`
	// FastBatch publishes each Write of 64 changes or more as one
	// fast-ingest batch (ADR-50, nats-server >= 2.14, stream allow_batched,
	// set when the bridge creates or updates the stream): flow-controlled
	// acks every ~250 messages instead of one per message, less client CPU
	// per change. Duplicates are still dropped by Nats-Msg-Id. Transactions that
	// go out as atomic batches (atomic_transactions) do not use it; a stream
	// that does not allow it gets per-message publishing. With
	// expect_last_sequence, a Write's first change goes alone and is
	// awaited (a replay goes on message by message, as without fast_batch),
	// then the rest as one fast batch whose every message carries its
	// Nats-Expected-Last-Sequence. A fenced batch the stream refuses
	// midway (another instance published) can take up to ack_timeout to
	// fail. Default false.
	FastBatch bool `koanf:"fast_batch"`
}

// DefaultMaxChanges is this sink type's default for the framework key
// sinks.<name>.batch.max_changes: the default max_pending, so one Write fills
// the window of acks in flight.
const DefaultMaxChanges = 4096

// DefaultSubjects is the default of Config.Subjects.
var DefaultSubjects = []string{"cdc.>"}

// DefaultConfig returns the defaults. URL and credentials default to the
// bridge's nats section; New fills them in.
func DefaultConfig() Config {
	return Config{
		Subjects:        append([]string(nil), DefaultSubjects...),
		CreateStream:    true,
		DuplicateWindow: 2 * time.Minute,
		Replicas:        1,
		MaxPending:      4096,
		AckTimeout:      10 * time.Second,
		// A standby's takeover cannot be overtaken by a zombie.
		ExpectLastSequence: true,
	}
}

// Validate reports every invalid field at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	switch {
	case c.Stream == "":
		errs = append(errs, config.Field("stream", "must be set"))
	case strings.ContainsAny(c.Stream, " \t\r\n.*>/\\") || len(c.Stream) > 255:
		errs = append(errs, config.Field("stream", "%q is not a valid stream name: no spaces, '.', '*', '>', '/' or '\\', at most 255 bytes", c.Stream))
	}
	for i, s := range c.Subjects {
		if !validFilter(s) {
			errs = append(errs, config.Field(fmt.Sprintf("subjects[%d]", i), "%q is not a valid subject", s))
		}
	}
	if c.DuplicateWindow <= 0 {
		errs = append(errs, config.Field("duplicate_window", "must be > 0, got %s", c.DuplicateWindow))
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, config.Field("replicas", "must be between 1 and 5, got %d", c.Replicas))
	}
	if c.MaxPending <= 0 {
		errs = append(errs, config.Field("max_pending", "must be > 0, got %d", c.MaxPending))
	}
	if c.AckTimeout <= 0 {
		errs = append(errs, config.Field("ack_timeout", "must be > 0, got %s", c.AckTimeout))
	}
	if c.Password != "" && c.User == "" {
		errs = append(errs, config.Field("user", "must be set when password is"))
	}
	errs = append(errs, config.CheckNATSClient(c.NATSClient)...)
	errs = append(errs, natsconn.Check("", c.URL, c.NATSClient, time.Now())...)
	if c.DeadLetterSubject != "" && (!validSubject(c.DeadLetterSubject) || strings.ContainsAny(c.DeadLetterSubject, "*>")) {
		errs = append(errs, config.Field("dead_letter_subject", "%q is not a valid subject without wildcards", c.DeadLetterSubject))
	}
	return errors.Join(errs...)
}

// validFilter reports whether s is a valid subject, wildcards allowed.
func validFilter(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		if t == "" || (t == ">" && i != len(toks)-1) {
			return false
		}
		if len(t) > 1 && strings.ContainsAny(t, "*>") {
			return false
		}
	}
	return true
}

// validSubject reports whether s can be published to: valid, no wildcards.
func validSubject(s string) bool {
	if !validFilter(s) {
		return false
	}
	for t := range strings.SplitSeq(s, ".") {
		if t == "*" || t == ">" {
			return false
		}
	}
	return true
}

// matchSubject reports whether the literal subject subj matches filter.
func matchSubject(filter, subj string) bool {
	for {
		ft, frest, fmore := strings.Cut(filter, ".")
		st, srest, smore := strings.Cut(subj, ".")
		switch {
		case ft == ">":
			return true
		case ft != "*" && ft != st:
			return false
		case !fmore || !smore:
			return fmore == smore
		}
		filter, subj = frest, srest
	}
}

// covered reports whether subj matches one of filters.
func covered(filters []string, subj string) bool {
	for _, f := range filters {
		if matchSubject(f, subj) {
			return true
		}
	}
	return false
}
