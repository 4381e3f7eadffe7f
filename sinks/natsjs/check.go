package natsjs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

// AcceptedSubjects implements sinks.SubjectLimiter: with create_stream the
// stream is made to bind the configured subjects (and the dead-letter
// subject), and a route must stay within them; without it only the
// server's stream knows (Check reads it).
func (s *Sink) AcceptedSubjects() (sinks.SubjectSet, bool) {
	if !s.cfg.CreateStream {
		return sinks.SubjectSet{}, false
	}
	return sinks.SubjectSet{Filters: slices.Clone(s.cfg.Subjects), Of: fmt.Sprintf("stream %q", s.cfg.Stream), Key: "subjects"}, true
}

// Check implements sinks.Checker: the connection and its credentials,
// JetStream, the stream (created or updated by Connect, or as it must be
// without create_stream), the large-payload bucket, and, for every
// subject of req and the dead-letter subject, that the account may
// publish there and the stream binds it. Subject probes are publishes the
// stream refuses (they expect a last sequence no stream reaches): nothing
// is stored, nothing created or changed.
func (s *Sink) Check(ctx context.Context, req sinks.CheckRequest) []config.Check {
	var out []config.Check
	add := func(c ...config.Check) { out = append(out, c...) }
	name, url := s.cfg.Stream, redact(s.cfg.URL)
	p, err := natsconn.DialProbe(ctx, s.nconn)
	if err != nil {
		return append(out, config.Check{Status: config.CheckFail, What: config.Redact(err.Error()), Fix: s.connectFix(err)})
	}
	defer p.Close()
	nc := p.NC
	cluster := nc.ConnectedClusterName()
	where := "not clustered"
	if cluster != "" {
		where = "cluster " + cluster
	}
	add(config.Check{Status: config.CheckOK, What: fmt.Sprintf("connected to NATS at %s (server %s, nats-server %s, %s)", url, nc.ConnectedServerName(), nc.ConnectedServerVersion(), where)})
	js, err := jetstream.New(nc)
	if err != nil {
		return append(out, config.Check{Status: config.CheckFail, What: fmt.Sprintf("opening JetStream: %v", err)})
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return append(out, s.apiFail(p, "reading the JetStream account", "$JS.API.INFO", err))
	}
	add(config.Check{Status: config.CheckOK, What: "JetStream is enabled for the account"})

	// The stream, and the subjects it binds once Connect has made it so.
	var bound []string
	exists := false
	st, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && !s.cfg.CreateStream:
		add(config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("stream %q does not exist on %s (create_stream is false)", name, url),
			Fix: fmt.Sprintf("nats stream add %s --subjects %q --storage file --dupe-window %s; or set create_stream: true",
				name, strings.Join(s.cfg.Subjects, ","), s.cfg.DuplicateWindow)})
	case errors.Is(err, jetstream.ErrStreamNotFound):
		bound = s.cfg.Subjects
		add(s.replicasCheck(cluster, fmt.Sprintf("stream %q", name))...)
		add(s.overlapChecks(ctx, js)...)
		add(config.Check{Status: config.CheckOK, What: fmt.Sprintf("stream %q does not exist yet: `bridge run` creates it (subjects [%s], replicas %d, duplicate window %s)",
			name, strings.Join(s.cfg.Subjects, ", "), s.cfg.Replicas, s.cfg.DuplicateWindow)})
	case err != nil:
		add(s.apiFail(p, fmt.Sprintf("reading stream %q", name), "$JS.API.STREAM.INFO."+name, err))
	default:
		exists = true
		cfg := st.CachedInfo().Config
		bound = cfg.Subjects
		add(config.Check{Status: config.CheckOK, What: fmt.Sprintf("stream %q exists: subjects [%s], %d messages, replicas %d, duplicate window %s",
			name, strings.Join(cfg.Subjects, ", "), st.CachedInfo().State.Msgs, cfg.Replicas, cfg.Duplicates)})
		if s.cfg.CreateStream {
			add(s.updateChecks(cfg, cluster)...)
			for _, subj := range s.cfg.Subjects {
				if !slices.Contains(bound, subj) {
					bound = append(bound, subj)
				}
			}
		} else {
			if s.cfg.AtomicTransactions && !cfg.AllowAtomicPublish {
				add(config.Check{Status: config.CheckWarn,
					What: fmt.Sprintf("stream %q does not allow atomic publishing: transactions are published message by message (consumers may see part of one)", name),
					Fix:  "nats stream edit " + name + " --allow-batch (nats-server >= 2.12), or set create_stream: true"})
			}
			if s.cfg.FastBatch && !cfg.AllowBatchPublish {
				add(config.Check{Status: config.CheckWarn,
					What: fmt.Sprintf("stream %q does not allow fast batches: fast_batch publishes message by message", name),
					Fix:  "allow batched publishing on the stream (nats-server >= 2.14), or set create_stream: true"})
			}
		}
	}
	if b := s.cfg.LargePayloadBucket; b != "" {
		switch _, err := js.ObjectStore(ctx, b); {
		case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			add(s.replicasCheck(cluster, fmt.Sprintf("object store %q", b))...)
			add(config.Check{Status: config.CheckOK, What: fmt.Sprintf("object store %q (large_payload_bucket) does not exist yet: `bridge run` creates it", b)})
		case err != nil:
			add(s.apiFail(p, fmt.Sprintf("reading object store %q (large_payload_bucket)", b), "$JS.API.STREAM.INFO.OBJ_"+b, err))
		default:
			add(config.Check{Status: config.CheckOK, What: fmt.Sprintf("object store %q (large_payload_bucket) exists", b)})
		}
	}
	return append(out, s.subjectChecks(ctx, p, req, bound, exists)...)
}

// subjectChecks probes every subject of req and the dead-letter subject:
// the account may publish there, and the stream binds it (or will, once
// Connect has created or updated it).
func (s *Sink) subjectChecks(ctx context.Context, p *natsconn.Probe, req sinks.CheckRequest, bound []string, exists bool) []config.Check {
	type use struct{ route, pattern, sample string }
	var uses []use
	for _, u := range req.Subjects {
		uses = append(uses, use{u.Route, u.Subject, strings.ReplaceAll(u.Subject, "*", "_")})
	}
	if d := s.cfg.DeadLetterSubject; d != "" {
		uses = append(uses, use{fmt.Sprintf("sinks.%s.config.dead_letter_subject", s.name), d, d})
	}
	var samples []string
	for _, u := range uses {
		if !slices.Contains(samples, u.sample) {
			samples = append(samples, u.sample)
		}
	}
	if len(samples) == 0 {
		return nil
	}
	name := s.cfg.Stream
	res, err := p.TryPublish(ctx, name, samples)
	if err != nil {
		fix := ""
		if len(p.Denied(false)) > 0 {
			fix = "allow the bridge's NATS user to subscribe to _INBOX.> (it reads its publish acks there)"
		}
		return []config.Check{{Status: config.CheckFail, What: fmt.Sprintf("probing the subjects: %v", err), Fix: fix}}
	}
	var out []config.Check
	if d := p.Denied(false); len(d) > 0 {
		out = append(out, config.Check{Status: config.CheckFail,
			What: fmt.Sprintf("permission denied: subscribe to %s", d[0]),
			Fix:  "allow the bridge's NATS user to subscribe to _INBOX.> (it reads its publish acks there)"})
	}
	for _, u := range uses {
		r := res[u.sample]
		desc := fmt.Sprintf("%s: %s", u.route, u.pattern)
		switch {
		case r.Outcome == natsconn.Denied:
			out = append(out, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("%s: permission denied on %s", u.route, u.sample),
				Fix:  fmt.Sprintf("allow the bridge's NATS user to publish to %s", u.pattern)})
		case !covered(bound, u.pattern):
			out = append(out, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("%s gives subjects outside stream %q's subjects [%s]", desc, name, strings.Join(bound, ", ")),
				Fix:  fmt.Sprintf("change the subject, or add %s to the stream's subjects (sinks.%s.config.subjects with create_stream, else nats stream edit %s --subjects ...)", u.pattern, s.name, name)})
		case r.Outcome == natsconn.OtherStream:
			out = append(out, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("%s: %s belongs to another stream, not %q", desc, u.sample, name),
				Fix:  "change the subject, or take it out of the other stream's subjects (nats stream info --all lists them)"})
		case r.Outcome == natsconn.Bound || (r.Outcome == natsconn.NoStream && !exists):
			out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("%s may be published, into stream %q", desc, name)})
		case r.Outcome == natsconn.NoStream:
			out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("%s may be published; `bridge run` adds it to stream %q", desc, name)})
		case r.Outcome == natsconn.NoAnswer:
			out = append(out, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("%s: a probe publish to %s got no answer in time (denied without a report, or a slow server)", desc, u.sample)})
		default:
			out = append(out, config.Check{Status: config.CheckWarn,
				What: fmt.Sprintf("%s: stream %q answered a probe publish to %s with: %s", desc, name, u.sample, r.Detail)})
		}
	}
	return out
}

// updateChecks says what Connect changes on an existing stream, and fails
// what it cannot change.
func (s *Sink) updateChecks(cfg jetstream.StreamConfig, cluster string) []config.Check {
	var changes []string
	for _, subj := range s.cfg.Subjects {
		if !slices.Contains(cfg.Subjects, subj) {
			changes = append(changes, "adds subject "+subj)
		}
	}
	if cfg.Duplicates != s.cfg.DuplicateWindow {
		changes = append(changes, fmt.Sprintf("sets the duplicate window to %s (now %s)", s.cfg.DuplicateWindow, cfg.Duplicates))
	}
	var out []config.Check
	if cfg.Replicas != s.cfg.Replicas {
		changes = append(changes, fmt.Sprintf("sets replicas to %d (now %d)", s.cfg.Replicas, cfg.Replicas))
		out = append(out, s.replicasCheck(cluster, fmt.Sprintf("stream %q", s.cfg.Stream))...)
	}
	if s.cfg.AtomicTransactions && !cfg.AllowAtomicPublish {
		changes = append(changes, "allows atomic publishing")
	}
	if s.cfg.FastBatch && !cfg.AllowBatchPublish {
		changes = append(changes, "allows batched publishing")
	}
	if len(changes) > 0 {
		out = append(out, config.Check{Status: config.CheckOK, What: fmt.Sprintf("`bridge run` updates stream %q (create_stream): it %s", s.cfg.Stream, strings.Join(changes, ", "))})
	}
	return out
}

// replicasCheck fails replicas above 1 on a server that is not clustered.
func (s *Sink) replicasCheck(cluster, what string) []config.Check {
	if s.cfg.Replicas <= 1 || cluster != "" {
		return nil
	}
	return []config.Check{{Status: config.CheckFail,
		What: fmt.Sprintf("replicas is %d, but the NATS server at %s is not clustered: %s cannot have %d replicas", s.cfg.Replicas, redact(s.cfg.URL), what, s.cfg.Replicas),
		Fix:  fmt.Sprintf("set sinks.%s.config.replicas: 1, or connect to a cluster of at least %d servers", s.name, s.cfg.Replicas)}}
}

// overlapChecks fails configured subjects another stream binds already:
// the stream cannot be created with them.
func (s *Sink) overlapChecks(ctx context.Context, js jetstream.JetStream) []config.Check {
	var out []config.Check
	for _, subj := range s.cfg.Subjects {
		other, err := js.StreamNameBySubject(ctx, subj)
		if err == nil && other != "" && other != s.cfg.Stream {
			out = append(out, config.Check{Status: config.CheckFail,
				What: fmt.Sprintf("subject %s of stream %q overlaps stream %q, which binds it already: the stream cannot be created", subj, s.cfg.Stream, other),
				Fix:  fmt.Sprintf("use other subjects in sinks.%s.config.subjects, or point stream at %q", s.name, other)})
		}
	}
	return out
}

// apiFail is the failed line of a JetStream API call: a permission denied
// on its subject when the server said so.
func (s *Sink) apiFail(p *natsconn.Probe, doing, subject string, err error) config.Check {
	for _, d := range p.Denied(true) {
		if strings.HasPrefix(d, "$JS.API") {
			return config.Check{Status: config.CheckFail, What: fmt.Sprintf("%s: permission denied on %s", doing, d),
				Fix: "allow the bridge's NATS user to publish to $JS.API.> and subscribe to _INBOX.>"}
		}
	}
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return config.Check{Status: config.CheckFail, What: fmt.Sprintf("%s: JetStream is not enabled on %s", doing, redact(s.cfg.URL)),
			Fix: "start nats-server with -js (or jetstream {} in its config), or enable JetStream for the account"}
	}
	return config.Check{Status: config.CheckFail, What: fmt.Sprintf("%s: %v", doing, err)}
}

// connectFix says what to do about a failed connection.
func (s *Sink) connectFix(err error) string {
	msg := strings.ToLower(err.Error())
	keys := fmt.Sprintf("sinks.%s.config.creds, user, password or token (or the nats section, when url is empty)", s.name)
	var explained *natsconn.Error
	switch {
	case errors.As(err, &explained):
		return "" // the error says its fix
	case strings.Contains(msg, "authorization"), strings.Contains(msg, "authentication"):
		return "check the credentials: " + keys
	case strings.Contains(msg, "no servers available"), strings.Contains(msg, "connection refused"):
		return fmt.Sprintf("is nats-server running at %s? (sinks.%s.config.url, or nats.url)", redact(s.cfg.URL), s.name)
	}
	return ""
}

var (
	_ sinks.SubjectLimiter = (*Sink)(nil)
	_ sinks.Checker        = (*Sink)(nil)
)
