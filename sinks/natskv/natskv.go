package natskv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
)

func init() {
	sinks.MustRegister("nats_kv", sinks.Plugin{
		New:    New,
		Config: DefaultConfig(),
		Doc:    "JetStream KV bucket holding each row's latest change under schema.table.key (Get a row, Watch a table): commit order wins, a replay never overwrites a newer value",
	})
}

// Headers the sink sets on every value, besides the change's own Headers.
// A value carries no Nats-Msg-Id: one change can write two keys (an update
// that changes the key deletes the old one) and a truncate writes its
// table's key twice; the guard, not the duplicate window, drops replays.
const (
	HeaderID        = "Bridge-Id"         // the change's ID, as Nats-Msg-Id on a stream
	HeaderProducer  = "Bridge-Producer"   // "<bridge>.<source>.<epoch>"
	HeaderCommitLSN = "Bridge-Commit-Lsn" // commit end LSN, Postgres form "16/B374D848"
	HeaderSeq       = "Bridge-Seq"        // ordinal of the change in its transaction, decimal
	HeaderTxSize    = "Bridge-Tx-Size"    // number of changes in the transaction, decimal
	HeaderXid       = "Bridge-Xid"        // Postgres transaction id, decimal
	HeaderTable     = "Bridge-Table"      // "schema.table"
	HeaderOp        = "Bridge-Op"         // insert, update, delete, read, truncate
	// HeaderTruncate is on a table's own key: "started" while its keys are
	// being purged, "done" once they are.
	HeaderTruncate = "Bridge-Truncate"
)

// The KV protocol's headers.
const (
	kvOperation = "KV-Operation"
	kvDelete    = "DEL"
	kvPurge     = "PURGE"
)

var errClosed = errors.New("natskv: sink closed")

// Sink mirrors rows into a JetStream KV bucket. It implements sinks.Sink;
// Write is never called concurrently with itself, Close may be called at
// any time, more than once.
type Sink struct {
	cfg  Config
	conn natsconn.Conn // cfg's connection, resolved
	name string
	log  *slog.Logger

	mu     sync.Mutex // guards the fields below
	nc     *nats.Conn
	js     jetstream.JetStream
	kv     jetstream.Stream // the bucket's stream
	closed bool
	reset  bool // Connect ran: the next Write forgets what it knew of the bucket

	// What the bucket holds, as far as the guard needs it (guard.go); used
	// by Write alone.
	cache cache
	// tables whose unchanged TOAST columns were reported.
	toastWarned map[string]bool
}

// New builds a sink from its config block: it fills the defaults, decodes
// (the decoder validates), takes url, credentials and TLS from env.NATS
// when url and context are empty (natsconn.ForSink), and does no network
// I/O.
func New(decode config.Decoder, env sinks.Env) (sinks.Sink, error) {
	cfg := DefaultConfig()
	if err := decode(&cfg); err != nil {
		return nil, err
	}
	conn, err := natsconn.ForSink("sinks."+env.Name+".config", cfg.URL, cfg.NATSClient, env.NATS)
	if err != nil {
		return nil, err
	}
	cfg.URL = conn.URL
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{cfg: cfg, conn: conn, name: env.Name, log: log, toastWarned: map[string]bool{}}, nil
}

// Connect dials the servers (unless already connected) and makes sure the
// bucket exists: created or updated when create_bucket is set, checked
// otherwise. It is idempotent; after a failed Write it waits, within ctx,
// for the client's own reconnection, then checks the bucket again (a
// server restarted with an empty store gets it back). ctx bounds dialling
// and the JetStream round trips.
func (s *Sink) Connect(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sinks.Permanent(errClosed)
	}
	nc, js := s.nc, s.js
	s.mu.Unlock()

	if nc == nil || nc.IsClosed() {
		var err error
		nc, err = natsconn.Dial(ctx, natsconn.Settings{Conn: s.conn, Sink: s.name, FlusherTimeout: s.cfg.AckTimeout}, s.log)
		if err != nil {
			return err
		}
		js, err = jetstream.New(nc, jetstream.WithPublishAsyncTimeout(s.cfg.AckTimeout), jetstream.WithPublishAsyncMaxPending(maxInFlight))
		if err != nil {
			nc.Close()
			return fmt.Errorf("connecting to %s: %w", config.Redact(s.cfg.URL), err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return sinks.Permanent(errClosed)
		}
		s.nc, s.js = nc, js
		s.mu.Unlock()
	} else if err := natsconn.WaitConnected(ctx, nc); err != nil {
		return fmt.Errorf("connecting to %s: %w: %w", config.Redact(s.cfg.URL), sinks.ErrNotConnected, err)
	} else if err := natsconn.Alive(ctx, nc, min(s.cfg.AckTimeout, s.conn.PingWindow()), s.log); err != nil {
		return fmt.Errorf("connecting to %s: %w: %w", config.Redact(s.cfg.URL), sinks.ErrNotConnected, err)
	}
	st, err := s.ensureBucket(ctx, nc, js)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.kv, s.reset = st, true
	s.mu.Unlock()
	return nil
}

// ensureBucket creates, updates or checks the bucket and returns its stream.
func (s *Sink) ensureBucket(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) (jetstream.Stream, error) {
	b, name := s.cfg.Bucket, s.cfg.stream()
	st, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && !s.cfg.CreateBucket:
		return nil, fmt.Errorf("checking bucket %q: it does not exist on %s: create it (for example `nats kv add %s --history %d`) or set create_bucket: true",
			b, config.Redact(s.cfg.URL), b, s.cfg.History)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      b,
			Description: "Postgres rows mirrored by the bridge",
			History:     uint8(s.cfg.History),
			Replicas:    s.cfg.Replicas,
			Storage:     jetstream.FileStorage,
		})
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, s.apiErr(nc, fmt.Sprintf("creating bucket %q", b), err)
		}
		if st, err = js.Stream(ctx, name); err != nil {
			return nil, s.apiErr(nc, fmt.Sprintf("checking bucket %q", b), err)
		}
	case err != nil:
		return nil, s.apiErr(nc, fmt.Sprintf("checking bucket %q", b), err)
	case s.cfg.CreateBucket:
		cfg := st.CachedInfo().Config
		if cfg.MaxMsgsPerSubject != int64(s.cfg.History) || cfg.Replicas != s.cfg.Replicas || !cfg.AllowDirect || !cfg.AllowRollup || cfg.DenyPurge {
			cfg.MaxMsgsPerSubject, cfg.Replicas = int64(s.cfg.History), s.cfg.Replicas
			cfg.AllowDirect, cfg.AllowRollup, cfg.DenyPurge = true, true, false
			if st, err = js.UpdateStream(ctx, cfg); err != nil {
				return nil, s.apiErr(nc, fmt.Sprintf("updating bucket %q (history %d, replicas %d)", b, s.cfg.History, s.cfg.Replicas), err)
			}
		}
	}
	cfg := st.CachedInfo().Config
	if want := fmt.Sprintf("$KV.%s.>", b); !slices.Contains(cfg.Subjects, want) {
		return nil, sinks.Permanent(fmt.Errorf("checking bucket %q: stream %s binds %q, not %q: it is not a KV bucket; choose another bucket name",
			b, name, cfg.Subjects, want))
	}
	if !cfg.AllowDirect {
		return nil, fmt.Errorf("checking bucket %q: its stream does not allow direct gets, which the bridge reads the keys' current values with: `nats stream edit %s --allow-direct`, or set create_bucket: true",
			b, name)
	}
	if cfg.DenyPurge || !cfg.AllowRollup {
		s.log.Warn("the bucket's stream denies purges or rollups: a TRUNCATE (and deletes with delete: purge) will fail",
			"bucket", b, "fix", "nats stream edit "+name+" --allow-rollup --no-deny-purge, or set create_bucket: true")
	}
	if cfg.MaxAge > 0 {
		s.log.Warn("the bucket's values expire (TTL): rows that do not change for that long leave the mirror", "bucket", b, "ttl", cfg.MaxAge)
	}
	return st, nil
}

// apiErr wraps err from a JetStream API call, with the fix where known.
func (s *Sink) apiErr(nc *nats.Conn, doing string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("%s: JetStream is not enabled on %s (start nats-server with -js, or enable it for the account): %w",
			doing, config.Redact(s.cfg.URL), err)
	case !nc.IsConnected() || isConnErr(err):
		return fmt.Errorf("%s: %w: %w", doing, sinks.ErrNotConnected, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// isConnErr reports whether err means the connection is gone.
func isConnErr(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrConnectionDraining)
}

// Close closes the connection; nothing is in flight between Writes. It
// returns by ctx's deadline even if the server hangs. Idempotent; Write
// and Connect fail once it has been called.
func (s *Sink) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	nc := s.nc
	s.mu.Unlock()
	if nc == nil || nc.IsClosed() {
		return nil
	}
	done := make(chan struct{})
	go func() {
		nc.Close() // flushes; bounded by the FlusherTimeout (ack_timeout)
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("closing: %w", ctx.Err())
	}
}

// Interface guards.
// Deduplicates returns true: the guard (guard.go) drops a change whose key
// already holds its position or a later one, so a replay after a crash
// changes nothing (sinks.Deduplicator).
func (s *Sink) Deduplicates() bool { return true }

// SubjectBlind reports that the sink files changes by their row's key,
// whatever their subject (sinks.SubjectBlind).
func (s *Sink) SubjectBlind() bool { return true }

var (
	_ sinks.Sink         = (*Sink)(nil)
	_ sinks.Deduplicator = (*Sink)(nil)
)
