package pipeline

import (
	"context"
	"time"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/sources"
)

// confirmer holds checkpointed positions back from the source's Ack for
// delay (checkpoint.confirm_delay): the slot's confirmed_flush_lsn then
// trails the KV checkpoint by the JetStream fsync horizon, so a NATS crash
// that loses unsynced writes (messages and checkpoint alike) resumes from
// an older checkpoint that Postgres can still serve. Not safe for
// concurrent use: the checkpointer owns it.
type confirmer struct {
	delay   time.Duration
	pending []pendingAck // checkpointed, not yet confirmed, oldest first
	acked   cdc.LSN
}

type pendingAck struct {
	lsn cdc.LSN
	at  time.Time // when it was checkpointed
}

// add records that lsn was checkpointed at now.
func (c *confirmer) add(lsn cdc.LSN, now time.Time) {
	c.pending = append(c.pending, pendingAck{lsn, now})
}

// due returns the newest recorded position at least delay old, and
// whether there is one not confirmed yet; it forgets the older ones.
func (c *confirmer) due(now time.Time) (cdc.LSN, bool) {
	n := 0
	for n < len(c.pending) && now.Sub(c.pending[n].at) >= c.delay {
		n++
	}
	if n == 0 {
		return 0, false
	}
	lsn := c.pending[n-1].lsn
	c.pending = append(c.pending[:0], c.pending[n:]...)
	if lsn <= c.acked {
		return 0, false
	}
	return lsn, true
}

// ack confirms to src the position due at now, if any. A failed Ack is
// retried at the next call.
func (c *confirmer) ack(ctx context.Context, src sources.Source, now time.Time) error {
	lsn, ok := c.due(now)
	if !ok {
		return nil
	}
	if err := src.Ack(ctx, lsn); err != nil {
		c.pending = append([]pendingAck{{lsn, now.Add(-c.delay)}}, c.pending...)
		return err
	}
	c.acked = lsn
	return nil
}
