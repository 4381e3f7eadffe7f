package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// Schemas: the schema change events before the changes they announce, and
// the policies for breaking changes (on_schema_change: pause holds the
// source, dead_letter a table's changes).

// HeldTable is a table whose breaking schema change a route holds.
type HeldTable struct {
	Table       string // schema.table
	Version     int
	RegistryKey string
	// Policy is "pause" (the source is paused before the change) or
	// "dead_letter" (the table's changes go to dead-letter subjects).
	Policy string
	// Since is when the version was first held.
	Since  time.Time
	Reason string
	// DeadLettered counts the table's changes this process marked for the
	// dead-letter subjects.
	DeadLettered uint64
}

// schemaHolds is what status and metrics read of the holds.
type schemaHolds struct {
	mu           sync.Mutex
	tables       map[string]*HeldTable // dead_letter holds not accepted yet, by table
	deadLettered atomic.Uint64         // changes marked for dead-letter subjects
	versions     atomic.Uint64         // versions registered by this process
}

// tableHold is a table's state for the routes with on_schema_change:
// dead_letter during one run (the reader's).
type tableHold struct {
	ver    *schema.Version
	rr     *routerRev
	none   bool // no route carrying the table's events dead-letters
	held   bool // ver is held: its changes go to dead-letter subjects until accept
	heldAt time.Time
	accept *schema.Acceptance // from where ver is accepted; nil: not yet
	reason string
}

type holdKey struct{ schema, table string }

// newTracker returns a run's schema tracker.
func (p *Pipeline) newTracker() *schema.Tracker {
	trk := schema.NewTracker(p.schemas, p.source)
	trk.Log = p.log
	trk.Registered = func(v *schema.Version) {
		p.holds.versions.Add(1)
		p.log.Debug("schema version registered", "version", v.Ref(), "previous", v.Previous,
			"since", v.Since.CommitLSN, "seq", v.Since.Seq, "fingerprint", v.Fingerprint)
	}
	return trk
}

// schemaStep runs c, a change of t in commit order, past the run's schema
// tracker (nil: schemas off): c gets the header naming its table's
// version, and when c is the first change under a new version, the
// schema change events to publish before it are returned, routed (one
// per route that carries the table's events, each with its sinks). The
// new version is in the registry when it returns. A table held by a
// dead_letter route marks c (cdc.Change.DeadLetter), and its events go to
// those routes' dead-letter subjects.
func (p *Pipeline) schemaStep(ctx context.Context, trk *schema.Tracker, rr *routerRev, c *cdc.Change) (evs []cdc.Change, dests [][]int, err error) {
	if route.IsDDLMessage(c) {
		return p.ddlStep(rr, c) // ddl.go
	}
	if trk == nil || !schema.Tracks(c) {
		return nil, nil, nil
	}
	v, ev, prev, err := trk.Observe(ctx, c)
	if err != nil {
		err = fmt.Errorf("source %q: %w", p.source, err)
		if errors.Is(err, schema.ErrConflict) {
			return nil, nil, fatal{err} // a retry would find the same
		}
		return nil, nil, err // NATS unreachable: the next run retries
	}
	if c.Headers == nil {
		c.Headers = v.Headers()
	} else {
		h := make(map[string]string, len(c.Headers)+1)
		maps.Copy(h, c.Headers)
		maps.Copy(h, v.Headers())
		c.Headers = h
	}
	h, err := p.holdOf(ctx, trk, rr, c, v, ev, prev)
	if err != nil {
		return nil, nil, err
	}
	ann, annPrev, annKind := ev, prev, ""
	deadLetter := ""
	if h != nil && h.held {
		if h.accept == nil {
			if err := p.tryAccept(ctx, trk, h, c); err != nil {
				return nil, nil, err
			}
		}
		switch {
		case h.accept == nil || !h.accept.Covers(c):
			deadLetter = h.reason
			c.DeadLetter = deadLetter
			p.holds.deadLettered.Add(1)
			p.holds.mu.Lock()
			if ht := p.holds.tables[c.Schema+"."+c.Table]; ht != nil {
				ht.DeadLettered++
			}
			p.holds.mu.Unlock()
		case ev == nil && h.accept.At(c):
			// The first change on the routes' subjects again: the version
			// is announced there first.
			ann, annKind = v, "accepted"
			if annPrev, err = trk.Previous(ctx, v); err != nil {
				return nil, nil, err
			}
		}
	}
	if ann == nil {
		return nil, nil, nil
	}
	ds, err := rr.r.SchemaDests(c.Source, c.Schema, c.Table, schema.Dest)
	if err != nil {
		return nil, nil, fatal{err}
	}
	if len(ds) == 0 {
		return nil, nil, nil
	}
	e := schema.NewEvent(ann, annPrev, c)
	e.Announce = annKind
	if annKind == "" && e.Diff.Breaking {
		for _, d := range ds {
			if d.Hold {
				if err := p.schemaHold(ctx, trk, ann, e, d.Route); err != nil {
					return nil, nil, err
				}
				break
			}
		}
	}
	body, err := json.Marshal(e)
	if err != nil {
		return nil, nil, fatal{fmt.Errorf("encoding the schema change event of %s: %w", ann.Ref(), err)}
	}
	msgID := ""
	if annKind == "" {
		msgID = ann.EventMsgID() // a version first seen by a snapshot: the snapshot's id space
	}
	for _, d := range ds {
		if len(d.Sinks) == 0 || annKind == "accepted" && !d.DeadLetter {
			continue // the routes that never held the table had the event
		}
		subj, hdr := d.Subject, ann.Headers()
		if deadLetter != "" && d.DeadLetter {
			subj, hdr = d.DeadLetterSubject, route.DeadLetterHeaders(hdr, deadLetter, d.Subject)
		}
		payload, hdr := eventPayload(d, body, hdr, c.Database, func(schemasEnable bool) []byte {
			return schema.AppendDebeziumSchemaEvent(nil, c, ann, annPrev, schemasEnable)
		})
		evs = append(evs, cdc.Change{
			Producer: c.Producer, Source: c.Source, Database: c.Database,
			// No TxSize (no Bridge-Tx-Size header): an event never ends its
			// transaction for a consumer assembling it (bridge/feeds), nor
			// counts in an atomic batch; the change after it does.
			CommitLSN: c.CommitLSN, LSN: c.LSN, Seq: c.Seq, Xid: c.Xid, CommitTime: c.CommitTime,
			Schema: c.Schema, Table: c.Table, Op: cdc.OpSchema, MsgID: msgID,
			Content: body, Payload: payload, Subject: subj, Dest: d.Dest, Headers: hdr,
		})
		dests = append(dests, d.Sinks)
	}
	return evs, dests, nil
}

// holdOf returns c's table's state for the dead_letter routes under
// version v (nil: no route carrying the table's events has that policy).
// Whether v is held is decided once, when v is announced (ev): a breaking
// change holds it; so does a version following a held one not accepted
// before it (with that one's time: a resume after it accepts both). The
// decision is in the registry (HoldKey) before any change under v is
// routed, and a run replaying what an earlier one may have published
// reads it there, as it reads the acceptances (tryAccept).
func (p *Pipeline) holdOf(ctx context.Context, trk *schema.Tracker, rr *routerRev, c *cdc.Change, v, ev, prev *schema.Version) (*tableHold, error) {
	k := holdKey{c.Schema, c.Table}
	if h := p.holdsRun[k]; h != nil && h.ver == v && h.rr == rr {
		if h.none {
			return nil, nil
		}
		return h, nil
	}
	ds, err := rr.r.SchemaDests(c.Source, c.Schema, c.Table, schema.Dest)
	if err != nil {
		return nil, fatal{err}
	}
	var dl []string
	for _, d := range ds {
		if d.DeadLetter {
			dl = append(dl, d.Route)
		}
	}
	h := &tableHold{ver: v, rr: rr, none: len(dl) == 0}
	if p.holdsRun == nil {
		p.holdsRun = map[holdKey]*tableHold{}
	}
	p.holdsRun[k] = h
	if h.none {
		p.noteHold(c.Schema+"."+c.Table, nil)
		return nil, nil
	}
	reg := trk.Registry()
	heldAt, acc, err := reg.HoldState(ctx, v)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w", p.source, err)
	}
	d := schema.Compare(prev, v)
	if heldAt.IsZero() && ev != nil && !trk.Replays(c) {
		var from time.Time
		switch {
		case prev != nil && d.Breaking:
			from = time.Now()
		case prev != nil:
			ph, pacc, err := reg.HoldState(ctx, prev)
			if err != nil {
				return nil, fmt.Errorf("source %q: %w", p.source, err)
			}
			if !ph.IsZero() && (pacc == nil || !pacc.Since.NotAfter(&v.Since)) {
				from = ph // still held: so is the version after it
			}
		}
		if !from.IsZero() {
			if heldAt, err = reg.Hold(ctx, v, from); err != nil {
				return nil, fmt.Errorf("source %q: %w", p.source, err)
			}
		}
	}
	h.held, h.heldAt, h.accept = !heldAt.IsZero(), heldAt, acc
	if h.held {
		what := "it follows a breaking change not accepted yet"
		if d.Breaking {
			what = "a breaking change: " + breakingWhat(d)
		}
		h.reason = fmt.Sprintf("%s.on_schema_change: dead_letter: %s (%s) held since %s, %s; look (bridge schema diff %s.%s --source %s), then resume the source to accept it",
			strings.Join(dl, ", "), v.Ref(), schema.VersionKey(v.Source, v.Schema, v.Table, v.Version), heldAt.UTC().Format(time.RFC3339),
			what, v.Schema, v.Table, p.source)
		if acc == nil {
			p.log.Warn("a breaking schema change is held: the table's changes go to the dead-letter subjects", "reason", h.reason)
		}
	}
	p.noteHold(c.Schema+"."+c.Table, h)
	return h, nil
}

// tryAccept accepts h's version at c when the operator resumed the source
// after it was first held: recorded in the registry (AcceptKey) with c's
// position, from which the table's changes go to the routes' subjects
// again; a replay finds it there.
func (p *Pipeline) tryAccept(ctx context.Context, trk *schema.Tracker, h *tableHold, c *cdc.Change) error {
	if trk.Replays(c) {
		return nil // an earlier run published c: the registry says whether it was accepted
	}
	p.ops.mu.Lock()
	want := p.ops.want
	p.ops.mu.Unlock()
	if want.Paused || !want.At.After(h.heldAt) {
		return nil
	}
	acc, err := trk.Registry().Accept(ctx, h.ver, schema.Acceptance{Since: schema.SinceOf(c), AcceptedAt: time.Now(), By: want.By})
	if err != nil {
		return fmt.Errorf("source %q: %w", p.source, err)
	}
	h.accept = &acc
	p.log.Info("a held schema version is accepted: the table's changes go to the routes' subjects again",
		"version", h.ver.Ref(), "from", acc.CommitLSN, "seq", acc.Seq, "by", want.By)
	p.noteHold(c.Schema+"."+c.Table, h)
	return nil
}

// loadHolds shows, from the registry, the tables held by a dead_letter
// route when the run starts (their next change finds the hold itself):
// status and metrics do not forget a hold across a restart.
func (p *Pipeline) loadHolds(ctx context.Context) {
	rr := p.cur.Load()
	if p.schemas == nil || rr == nil {
		return
	}
	held, err := p.schemas.Held(ctx, p.source)
	if err != nil {
		p.log.Warn("cannot list the schema versions held", "error", err)
		return
	}
	for _, hv := range held {
		v := hv.Version
		ds, err := rr.r.SchemaDests(p.source, v.Schema, v.Table, schema.Dest)
		if err != nil {
			continue
		}
		var dl []string
		for _, d := range ds {
			if d.DeadLetter {
				dl = append(dl, d.Route)
			}
		}
		if len(dl) == 0 {
			continue
		}
		reason := fmt.Sprintf("%s.on_schema_change: dead_letter: %s (%s) held since %s; look (bridge schema diff %s.%s --source %s), then resume the source to accept it",
			strings.Join(dl, ", "), v.Ref(), schema.VersionKey(v.Source, v.Schema, v.Table, v.Version), hv.HeldAt.UTC().Format(time.RFC3339),
			v.Schema, v.Table, p.source)
		p.noteHold(v.Schema+"."+v.Table, &tableHold{ver: v, held: true, heldAt: hv.HeldAt, reason: reason})
	}
}

// noteHold records table's hold for status and metrics (h nil or not held
// any more: none).
func (p *Pipeline) noteHold(table string, h *tableHold) {
	p.holds.mu.Lock()
	defer p.holds.mu.Unlock()
	if h == nil || !h.held || h.accept != nil {
		delete(p.holds.tables, table)
		return
	}
	old := p.holds.tables[table]
	if old != nil && old.Version == h.ver.Version {
		return
	}
	if p.holds.tables == nil {
		p.holds.tables = map[string]*HeldTable{}
	}
	ht := &HeldTable{Table: table, Version: h.ver.Version,
		RegistryKey: schema.VersionKey(h.ver.Source, h.ver.Schema, h.ver.Table, h.ver.Version),
		Policy:      "dead_letter", Since: h.heldAt, Reason: h.reason}
	if old != nil {
		ht.DeadLettered = old.DeadLettered // the same hold, a later version
	}
	p.holds.tables[table] = ht
}

// held returns the tables held now: the dead_letter holds not accepted
// (a resume after a hold accepts it: its table shows no more, though the
// acceptance is recorded at the table's next change), and the pause's.
func (p *Pipeline) held(want checkpoint.Control) []HeldTable {
	var out []HeldTable
	p.holds.mu.Lock()
	for _, h := range p.holds.tables {
		if !want.Paused && want.At.After(h.Since) {
			continue
		}
		out = append(out, *h)
	}
	p.holds.mu.Unlock()
	if want.Paused && want.Schema != nil {
		out = append(out, HeldTable{Table: want.Schema.Table, Version: want.Schema.Version, RegistryKey: want.Schema.RegistryKey,
			Policy: "pause", Since: want.At, Reason: want.Reason})
	}
	slices.SortFunc(out, func(a, b HeldTable) int { return strings.Compare(a.Table+a.Policy, b.Table+b.Policy) })
	return out
}

// SchemaStats returns, for /metrics, the tables held by a breaking schema
// change by policy, the changes marked for dead-letter subjects and the
// schema versions registered by this process.
func (p *Pipeline) SchemaStats() (heldPause, heldDeadLetter int, deadLettered, versions uint64) {
	p.ops.mu.Lock()
	want := p.ops.want
	p.ops.mu.Unlock()
	for _, h := range p.held(want) {
		if h.Policy == "pause" {
			heldPause++
		} else {
			heldDeadLetter++
		}
	}
	return heldPause, heldDeadLetter, p.holds.deadLettered.Load(), p.holds.versions.Load()
}

func breakingWhat(d schema.Diff) string {
	var what []string
	for _, c := range d.Dropped {
		what = append(what, "dropped "+c.Name)
	}
	for _, r := range d.Retyped {
		what = append(what, fmt.Sprintf("retyped %s %s→%s", r.Name, r.From, r.To))
	}
	for _, c := range d.Changed {
		if c.Breaking {
			what = append(what, fmt.Sprintf("%s %s %s→%s", c.What, c.Name, orNone(c.From), orNone(c.To)))
		}
	}
	if d.KeyChanged {
		what = append(what, fmt.Sprintf("key (%s)→(%s)", strings.Join(d.KeyBefore, ","), strings.Join(d.KeyAfter, ",")))
	}
	return strings.Join(what, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// errHeld ends a run before the transaction of a breaking schema change
// that a route holds (on_schema_change: pause): the source is paused.
var errHeld = errors.New("held for a breaking schema change")

// schemaHold decides whether the breaking change to ev may go on: yes
// when the operator resumed the source after it was first held; else it
// pauses the source, with the change as the reason, and returns errHeld.
func (p *Pipeline) schemaHold(ctx context.Context, trk *schema.Tracker, ev *schema.Version, e schema.Event, route string) error {
	heldAt, err := trk.Registry().Hold(ctx, ev, time.Now())
	if err != nil {
		return fmt.Errorf("source %q: %w", p.source, err)
	}
	p.ops.mu.Lock()
	want := p.ops.want
	p.ops.mu.Unlock()
	if !want.Paused && want.At.After(heldAt) {
		return nil // resumed since: let it through
	}
	reason := fmt.Sprintf("%s.on_schema_change: pause: %s changed at %s (%s), a breaking change: %s; look (bridge schema diff %s.%s --source %s), then resume the source",
		route, ev.Ref(), e.CommitLSN, e.RegistryKey, breakingWhat(e.Diff), ev.Schema, ev.Table, p.source)
	c := checkpoint.Control{Paused: true, Reason: reason, By: "bridge " + p.run, At: time.Now().UTC(),
		Schema: &checkpoint.HeldSchema{Table: ev.Schema + "." + ev.Table, Version: ev.Version, RegistryKey: e.RegistryKey}}
	if err := p.store.SetControl(ctx, p.ctlKey, c); err != nil {
		return fmt.Errorf("source %q: pausing for a breaking schema change: %w", p.source, err)
	}
	if c, err = p.store.LoadControl(ctx, p.ctlKey); err != nil {
		return fmt.Errorf("source %q: pausing for a breaking schema change: %w", p.source, err)
	}
	p.setWant(c)
	p.log.Warn("paused for a breaking schema change", "reason", reason)
	return errHeld
}
