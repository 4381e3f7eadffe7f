package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/route"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// schemaStep runs c, a change of t in commit order, past the run's schema
// tracker (nil: schemas off): c gets the header naming its table's
// version, and when c is the first change under a new version, the
// schema change events to publish before it are returned, routed (one
// per route that carries the table's events, each with its sinks). The
// new version is in the registry when it returns.
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
	if ev == nil {
		return nil, nil, nil
	}
	ds, err := rr.r.SchemaDests(c.Source, c.Schema, c.Table, schema.Dest)
	if err != nil {
		return nil, nil, fatal{err}
	}
	if len(ds) == 0 {
		return nil, nil, nil
	}
	e := schema.NewEvent(ev, prev, c)
	if e.Diff.Breaking {
		for _, d := range ds {
			if d.Hold {
				if err := p.schemaHold(ctx, trk, ev, e, d.Route); err != nil {
					return nil, nil, err
				}
				break
			}
		}
	}
	body, err := json.Marshal(e)
	if err != nil {
		return nil, nil, fatal{fmt.Errorf("encoding the schema change event of %s: %w", ev.Ref(), err)}
	}
	for _, d := range ds {
		if len(d.Sinks) == 0 {
			continue
		}
		payload, hdr := eventPayload(d, body, v.Headers(), c.Database, func(schemasEnable bool) []byte {
			return schema.AppendDebeziumSchemaEvent(nil, c, ev, prev, schemasEnable)
		})
		evs = append(evs, cdc.Change{
			Producer: c.Producer, Source: c.Source, Database: c.Database,
			// No TxSize (no Bridge-Tx-Size header): an event never ends its
			// transaction for a consumer assembling it (bridge/feeds), nor
			// counts in an atomic batch; the change after it does.
			CommitLSN: c.CommitLSN, LSN: c.LSN, Seq: c.Seq, Xid: c.Xid, CommitTime: c.CommitTime,
			Schema: c.Schema, Table: c.Table, Op: cdc.OpSchema,
			Content: body, Payload: payload, Subject: d.Subject, Dest: d.Dest, Headers: hdr,
		})
		dests = append(dests, d.Sinks)
	}
	return evs, dests, nil
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
	var what []string
	for _, c := range e.Diff.Dropped {
		what = append(what, "dropped "+c.Name)
	}
	for _, r := range e.Diff.Retyped {
		what = append(what, fmt.Sprintf("retyped %s %s→%s", r.Name, r.From, r.To))
	}
	if e.Diff.KeyChanged {
		what = append(what, fmt.Sprintf("key (%s)→(%s)", strings.Join(e.Diff.KeyBefore, ","), strings.Join(e.Diff.KeyAfter, ",")))
	}
	reason := fmt.Sprintf("%s.on_schema_change: pause: %s changed at %s (%s), a breaking change: %s; look (bridge schema diff %s.%s --source %s), then resume the source",
		route, ev.Ref(), e.CommitLSN, e.RegistryKey, strings.Join(what, ", "), ev.Schema, ev.Table, p.source)
	c := checkpoint.Control{Paused: true, Reason: reason, By: "bridge " + p.run, At: time.Now().UTC()}
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
