package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/internal/kvkey"
)

// DefaultLease is the lease of a source when Options.Lease is zero: a
// member that dies has its sources taken over about this long after its
// last renewal.
const DefaultLease = 5 * time.Second

// Key prefixes in the fleet's bucket.
const (
	memberPrefix = "member."
	leasePrefix  = "lease."
)

// Runner starts and stops the pipelines of single sources; app.App
// implements it for a fleet member.
type Runner interface {
	// Start builds source's pipeline from the configuration in effect and
	// starts it; it returns once started, not when the pipeline ends.
	Start(ctx context.Context, source string) error
	// Stop stops source's pipeline and returns when it has ended: with
	// drain, at a transaction boundary with its checkpoint saved (ctx
	// bounds the wait, then it stops at once); without, at once. Stopping
	// a source that does not run does nothing. Stop may be called again,
	// and concurrently, while a stop is under way.
	Stop(ctx context.Context, source string, drain bool)
}

// Options configure a member.
type Options struct {
	// Fleet is the fleet's name; its bucket is Bucket(Fleet).
	Fleet string
	// Member is this process's id (the App's instance id).
	Member string
	// Lease is how long a lease lasts without renewal (DefaultLease when
	// zero).
	Lease time.Duration
	// Replicas of the bucket when this member creates it (1 when zero).
	Replicas int
	// Sources returns the sources of the configuration in effect; it is
	// asked at every round, so a reload that adds or removes sources is
	// followed.
	Sources func() []string
	// Log receives the member's decisions (nothing when nil).
	Log *slog.Logger
}

// Bucket returns the KV bucket of fleet's leases: "bridge_fleet_" and the
// fleet's name, with every byte outside [A-Za-z0-9_-] as '_'.
func Bucket(fleet string) string {
	var b strings.Builder
	b.WriteString("bridge_fleet_")
	for i := 0; i < len(fleet); i++ {
		c := fleet[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Lease is the value of a source's key: who owns it, since which
// acquisition (Epoch grows by one at each), and when it was last renewed
// (the owner's wall clock: for people; expiry is judged by revisions).
type Lease struct {
	Owner   string    `json:"owner"` // "" when released
	Epoch   uint64    `json:"epoch"`
	Renewed time.Time `json:"renewed"`
	LeaseMS int64     `json:"lease_ms"`
}

// MemberInfo is the value of a member's key.
type MemberInfo struct {
	Member  string    `json:"member"`
	Started time.Time `json:"started"`
	Renewed time.Time `json:"renewed"`
	LeaseMS int64     `json:"lease_ms"`
	Sources []string  `json:"sources"` // the sources it holds
}

// entry is a key as this member's watch last saw it.
type entry struct {
	rev     uint64
	value   []byte
	deleted bool
	seen    time.Time // local clock (monotonic) when rev was first seen
}

// lease states of the sources this member holds.
const (
	stStarting  = "starting"
	stRunning   = "running"
	stReleasing = "releasing"
	stLost      = "lost"
)

// held is a lease this member holds.
type held struct {
	rev   uint64
	epoch uint64
	valid time.Time // local clock: stop the source before this
	state string
}

// Member is one process of a fleet. Run it with Run.
type Member struct {
	opts    Options
	r       Runner
	kv      jetstream.KeyValue
	log     *slog.Logger
	started time.Time
	renew   time.Duration // renew every Lease/5
	call    time.Duration // each round of renewals within Lease/10
	hold    time.Duration // an owner stops a source this long (Lease/2) after sending its last successful renewal
	expiry  time.Duration // others take a lease over this long (3·Lease/4) after they saw its last renewal

	mu    sync.Mutex
	view  map[string]*entry // key → what the watch saw
	held  map[string]*held  // source → lease held
	wg    sync.WaitGroup    // the start and stop goroutines
	since time.Time         // joined: acquisitions wait a little so members starting together see each other
}

// Open creates or opens the fleet's bucket and returns the member, not yet
// running.
func Open(ctx context.Context, js jetstream.JetStream, opts Options, r Runner) (*Member, error) {
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	bucket := Bucket(opts.Fleet)
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: opts.Replicas,
			Description: "bridge fleet " + opts.Fleet + ": members and source leases"})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fleet %s: opening bucket %s: %w", opts.Fleet, bucket, err)
	}
	return &Member{opts: opts, r: r, kv: kv, log: opts.Log.With("fleet", opts.Fleet, "member", opts.Member),
		renew: opts.Lease / 5, call: opts.Lease / 10, hold: opts.Lease / 2, expiry: 3 * opts.Lease / 4, view: map[string]*entry{}, held: map[string]*held{}}, nil
}

// Run takes part in the fleet until ctx ends: it watches the bucket,
// heartbeats, renews its leases, takes the sources the plan gives it and
// hands over those it gives others. When ctx ends it stops its sources
// (Runner.Stop without drain: the App's own shutdown has already ended
// them at a boundary), releases their leases and deletes its member key,
// each write bounded by the lease, and returns nil.
func (m *Member) Run(ctx context.Context) error {
	m.started = time.Now()
	m.since = m.started
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go m.watch(wctx)
	// Leases expire on their own clock: the loop below may spend seconds
	// in calls that time out (NATS unreachable: renewals, the heartbeat,
	// takes of sources that look free), and a source must stop when its
	// lease runs out, before another member may take it over, not when
	// the loop comes round again.
	expiring := make(chan struct{})
	go func() {
		defer close(expiring)
		t := time.NewTicker(m.opts.Lease / 20)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				m.expire(ctx)
			}
		}
	}()
	m.heartbeat(ctx)
	tick := time.NewTicker(m.opts.Lease / 20)
	defer tick.Stop()
	lastRenew := time.Now()
	for {
		select {
		case <-ctx.Done():
			wcancel()
			<-expiring
			m.leave()
			return nil
		case <-tick.C:
		}
		m.expire(ctx)
		if time.Since(lastRenew) >= m.renew {
			lastRenew = time.Now()
			m.renewAll(ctx)
			m.expire(ctx) // a renewal that failed slowly
			m.heartbeat(ctx)
			m.prune(ctx)
		}
		m.balance(ctx)
	}
}

// watch keeps m.view up to date until ctx ends, restarting a watch that
// fails.
func (m *Member) watch(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := m.kv.WatchAll(ctx)
		if err != nil {
			m.log.Warn("cannot watch the fleet bucket; retrying", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.renew):
			}
			continue
		}
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			m.mu.Lock()
			old := m.view[e.Key()]
			if old == nil || old.rev != e.Revision() {
				m.view[e.Key()] = &entry{rev: e.Revision(), value: e.Value(), deleted: e.Operation() != jetstream.KeyValuePut, seen: time.Now()}
			}
			m.mu.Unlock()
		}
		_ = w.Stop()
	}
}

// prune deletes the keys of members silent for 20 leases: members that
// died (a clean leave deletes its own), kept that long for `bridge fleet
// status`. The delete is at the revision seen, so a member that came back
// keeps its key.
func (m *Member) prune(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	stale := map[string]uint64{}
	for k, e := range m.view {
		if strings.HasPrefix(k, memberPrefix) && !e.deleted && now.Sub(e.seen) > 20*m.opts.Lease {
			stale[k] = e.rev
		}
	}
	m.mu.Unlock()
	for k, rev := range stale {
		cctx, cancel := context.WithTimeout(ctx, m.call)
		_ = m.kv.Delete(cctx, k, jetstream.LastRevision(rev))
		cancel()
	}
}

// heartbeat writes this member's key.
func (m *Member) heartbeat(ctx context.Context) {
	m.mu.Lock()
	var srcs []string
	for s, h := range m.held {
		if h.state != stLost {
			srcs = append(srcs, s)
		}
	}
	m.mu.Unlock()
	sort.Strings(srcs)
	b, _ := json.Marshal(MemberInfo{Member: m.opts.Member, Started: m.started.UTC(), Renewed: time.Now().UTC(), LeaseMS: m.opts.Lease.Milliseconds(), Sources: srcs})
	cctx, cancel := context.WithTimeout(ctx, m.renew)
	defer cancel()
	if _, err := m.kv.Put(cctx, memberPrefix+kvkey.Escape(m.opts.Member), b); err != nil && ctx.Err() == nil {
		m.log.Warn("fleet heartbeat failed", "err", err)
	}
}

func (m *Member) leaseValue(epoch uint64, owner string) []byte {
	b, _ := json.Marshal(Lease{Owner: owner, Epoch: epoch, Renewed: time.Now().UTC(), LeaseMS: m.opts.Lease.Milliseconds()})
	return b
}

// expire stops, at once, every source whose lease this member could not
// renew in time.
func (m *Member) expire(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	var lost []string
	for s, h := range m.held {
		if h.state != stLost && now.After(h.valid) {
			h.state = stLost
			lost = append(lost, s)
		}
	}
	m.mu.Unlock()
	for _, s := range lost {
		m.lose(ctx, s, "its lease could not be renewed in time (NATS unreachable?)")
	}
}

// lose stops source at once: its lease is no longer this member's.
func (m *Member) lose(ctx context.Context, source, why string) {
	m.log.Error("fleet: lease lost; stopping the source at once (its next owner resumes from the checkpoint)", "source", source, "why", why)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.r.Stop(context.WithoutCancel(ctx), source, false)
		m.mu.Lock()
		if h := m.held[source]; h != nil && h.state == stLost {
			delete(m.held, source)
		}
		m.mu.Unlock()
	}()
}

// renewAll renews every lease held, all within Lease/5.
func (m *Member) renewAll(ctx context.Context) {
	m.mu.Lock()
	type job struct {
		source     string
		rev, epoch uint64
	}
	var jobs []job
	for s, h := range m.held {
		if h.state != stLost {
			jobs = append(jobs, job{s, h.rev, h.epoch})
		}
	}
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, m.call)
	defer cancel()
	for _, j := range jobs {
		sent := time.Now()
		key := leasePrefix + kvkey.Escape(j.source)
		rev, err := m.kv.Update(cctx, key, m.leaseValue(j.epoch, m.opts.Member), j.rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// A renewal whose reply was lost may have landed: still ours?
			if e, gerr := m.kv.Get(cctx, key); gerr == nil {
				var l Lease
				if json.Unmarshal(e.Value(), &l) == nil && l.Owner == m.opts.Member && l.Epoch == j.epoch {
					rev, err = e.Revision(), nil
				}
			}
		}
		m.mu.Lock()
		h := m.held[j.source]
		switch {
		case h == nil || h.state == stLost:
		case err == nil:
			h.rev, h.valid = rev, sent.Add(m.hold)
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			h.state = stLost
			m.mu.Unlock()
			m.lose(ctx, j.source, "another member holds its lease now")
			continue
		default:
			if ctx.Err() == nil {
				m.log.Warn("fleet: renewing a lease failed; retrying", "source", j.source, "err", err, "valid_for", time.Until(h.valid).Round(time.Millisecond).String())
			}
		}
		m.mu.Unlock()
	}
}

// snapshot of the view for balancing.
type viewState struct {
	members []string          // live members, this one included
	owners  map[string]string // source → live owner
	free    map[string]uint64 // source → revision to take it at (0: create)
	epochs  map[string]uint64 // source → epoch of its latest lease value
}

func (m *Member) state(sources []string) viewState {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	vs := viewState{owners: map[string]string{}, free: map[string]uint64{}, epochs: map[string]uint64{}}
	live := map[string]bool{m.opts.Member: true}
	for k, e := range m.view {
		if !strings.HasPrefix(k, memberPrefix) || e.deleted || now.Sub(e.seen) > m.expiry {
			continue
		}
		if id, err := kvkey.Unescape(strings.TrimPrefix(k, memberPrefix)); err == nil {
			live[id] = true
		}
	}
	for id := range live {
		vs.members = append(vs.members, id)
	}
	sort.Strings(vs.members)
	for _, s := range sources {
		if h := m.held[s]; h != nil && h.state != stLost {
			vs.owners[s] = m.opts.Member
			continue
		}
		e := m.view[leasePrefix+kvkey.Escape(s)]
		if e == nil || e.deleted {
			var rev uint64
			if e != nil {
				rev = e.rev
			}
			vs.free[s] = rev
			continue
		}
		var l Lease
		if err := json.Unmarshal(e.value, &l); err != nil {
			vs.free[s] = e.rev // not ours to read: take it over
			continue
		}
		vs.epochs[s] = l.Epoch
		switch {
		case l.Owner == "" || now.Sub(e.seen) > m.expiry:
			vs.free[s] = e.rev
		case l.Owner == m.opts.Member:
			// Ours in the bucket but not held here (a release under
			// way, a start that failed): wait for it to expire.
		default:
			vs.owners[s] = l.Owner
		}
	}
	return vs
}

// balance takes the free sources the plan gives this member and hands
// over the ones it gives others.
func (m *Member) balance(ctx context.Context) {
	sources := m.opts.Sources()
	vs := m.state(sources)
	plan := Plan(sources, vs.members, vs.owners)
	inConfig := make(map[string]bool, len(sources))
	for _, s := range sources {
		inConfig[s] = true
	}
	settled := time.Since(m.since) >= m.renew
	m.mu.Lock()
	var release, acquire []string
	for s, h := range m.held {
		if h.state == stRunning && (!inConfig[s] || plan[s] != m.opts.Member) {
			release = append(release, s)
		}
	}
	if settled {
		for _, s := range sources {
			if _, free := vs.free[s]; free && plan[s] == m.opts.Member && m.held[s] == nil {
				acquire = append(acquire, s)
			}
		}
	}
	m.mu.Unlock()
	sort.Strings(release)
	for _, s := range release {
		m.release(ctx, s, plan[s], inConfig[s])
	}
	for _, s := range acquire {
		m.acquire(ctx, s, vs.free[s], vs.epochs[s]+1)
	}
}

// acquire takes source's lease at rev (create when 0) and starts it.
func (m *Member) acquire(ctx context.Context, source string, rev, epoch uint64) {
	key := leasePrefix + kvkey.Escape(source)
	cctx, cancel := context.WithTimeout(ctx, m.renew)
	defer cancel()
	sent := time.Now()
	var err error
	var nrev uint64
	if rev == 0 {
		nrev, err = m.kv.Create(cctx, key, m.leaseValue(epoch, m.opts.Member))
	} else {
		nrev, err = m.kv.Update(cctx, key, m.leaseValue(epoch, m.opts.Member), rev)
	}
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && ctx.Err() == nil {
			m.log.Warn("fleet: taking a lease failed", "source", source, "err", err)
		}
		return // another member was faster, or NATS is away: the next round sees
	}
	m.mu.Lock()
	m.held[source] = &held{rev: nrev, epoch: epoch, valid: sent.Add(m.hold), state: stStarting}
	m.mu.Unlock()
	m.log.Info("fleet: source taken", "source", source, "epoch", epoch)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		err := m.r.Start(ctx, source)
		m.mu.Lock()
		h := m.held[source]
		ok := h != nil && h.state == stStarting
		if ok && err == nil {
			h.state = stRunning
		}
		m.mu.Unlock()
		if err != nil && ok && ctx.Err() == nil {
			m.log.Error("fleet: starting the source failed; releasing its lease", "source", source, "err", err)
			m.mu.Lock()
			h.state = stReleasing
			m.mu.Unlock()
			m.wg.Add(1)
			go m.handOver(ctx, source, false)
		}
	}()
}

// release drains source and then releases its lease for to (the plan's
// next owner, for the log).
func (m *Member) release(ctx context.Context, source, to string, inConfig bool) {
	m.mu.Lock()
	h := m.held[source]
	if h == nil || h.state != stRunning {
		m.mu.Unlock()
		return
	}
	h.state = stReleasing
	m.mu.Unlock()
	if inConfig {
		m.log.Info("fleet: handing a source over at a transaction boundary", "source", source, "to", to)
	} else {
		m.log.Info("fleet: source removed from the configuration; releasing its lease", "source", source)
	}
	m.wg.Add(1)
	go m.handOver(ctx, source, true)
}

// handOver stops source (draining it when drain) while its lease is still
// renewed, then writes the lease as released. wg is already counted.
func (m *Member) handOver(ctx context.Context, source string, drain bool) {
	defer m.wg.Done()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	m.r.Stop(dctx, source, drain)
	cancel()
	m.mu.Lock()
	h := m.held[source]
	if h == nil || h.state != stReleasing {
		m.mu.Unlock()
		return // lost meanwhile: nothing to release
	}
	rev, epoch := h.rev, h.epoch
	m.mu.Unlock()
	m.writeRelease(ctx, source, rev, epoch)
	m.mu.Lock()
	if m.held[source] == h {
		delete(m.held, source)
	}
	m.mu.Unlock()
}

// writeRelease marks source's lease released at rev.
func (m *Member) writeRelease(ctx context.Context, source string, rev, epoch uint64) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.renew)
	defer cancel()
	if _, err := m.kv.Update(cctx, leasePrefix+kvkey.Escape(source), m.leaseValue(epoch, ""), rev); err != nil {
		m.log.Warn("fleet: releasing a lease failed; it expires on its own", "source", source, "err", err)
		return
	}
	m.log.Info("fleet: lease released", "source", source)
}

// leave stops every source, releases the leases and deletes the member key.
func (m *Member) leave() {
	ctx := context.Background()
	m.mu.Lock()
	srcs := make([]string, 0, len(m.held))
	for s := range m.held {
		srcs = append(srcs, s)
	}
	m.mu.Unlock()
	for _, s := range srcs {
		m.r.Stop(ctx, s, false)
	}
	m.wg.Wait()
	m.mu.Lock()
	rel := map[string]*held{}
	for s, h := range m.held {
		if h.state != stLost {
			rel[s] = h
		}
	}
	m.held = map[string]*held{}
	m.mu.Unlock()
	for s, h := range rel {
		m.writeRelease(ctx, s, h.rev, h.epoch)
	}
	cctx, cancel := context.WithTimeout(ctx, m.renew)
	defer cancel()
	_ = m.kv.Delete(cctx, memberPrefix+kvkey.Escape(m.opts.Member))
	m.log.Info("fleet: left", "released", len(rel))
}

// Held returns the sources this member holds a lease on, sorted.
func (m *Member) Held() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.held))
	for s, h := range m.held {
		if h.state != stLost {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// Holding reports whether this member holds source's lease now, taken or
// renewed in time (the source starting or running), so that no other
// member may take it yet, and the lease's epoch. The lease is the
// authority on who owns a source within the fleet: its holder may end the
// reader of the source's slot that a former holder (an earlier epoch of
// this fleet) left behind (pipeline.Config.Lease).
func (m *Member) Holding(source string) (epoch uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.held[source]
	if h == nil || (h.state != stStarting && h.state != stRunning) || !time.Now().Before(h.valid) {
		return 0, false
	}
	return h.epoch, true
}
