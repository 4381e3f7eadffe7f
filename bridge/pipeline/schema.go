package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/schema"
)

// schemaStep runs c, a change of t in commit order, past the run's schema
// tracker (nil: schemas off): c gets the header naming its table's
// version, and when c is the first change under a new version, the
// schema change events to publish before it are returned, routed (one
// per route that carries the table's events, each with its sinks). The
// new version is in the registry when it returns.
func (p *Pipeline) schemaStep(ctx context.Context, trk *schema.Tracker, rr *routerRev, c *cdc.Change) (evs []cdc.Change, dests [][]int, err error) {
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
	body, err := json.Marshal(schema.NewEvent(ev, prev, c))
	if err != nil {
		return nil, nil, fatal{fmt.Errorf("encoding the schema change event of %s: %w", ev.Ref(), err)}
	}
	for _, d := range ds {
		if len(d.Sinks) == 0 {
			continue
		}
		evs = append(evs, cdc.Change{
			Producer: c.Producer, Source: c.Source, Database: c.Database,
			// No TxSize (no Bridge-Tx-Size header): an event never ends its
			// transaction for a consumer assembling it (bridge/feeds), nor
			// counts in an atomic batch; the change after it does.
			CommitLSN: c.CommitLSN, LSN: c.LSN, Seq: c.Seq, Xid: c.Xid, CommitTime: c.CommitTime,
			Schema: c.Schema, Table: c.Table, Op: cdc.OpSchema,
			Content: body, Payload: body, Subject: d.Subject, Dest: d.Dest, Headers: v.Headers(),
		})
		dests = append(dests, d.Sinks)
	}
	return evs, dests, nil
}
