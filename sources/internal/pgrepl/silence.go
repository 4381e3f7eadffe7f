package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A replication connection is silent when nothing, not even the answer to
// the status updates that ask for one, has come for receive_timeout. That
// is a dead link (a lost NAT or firewall entry, a frozen host), or a
// walsender too busy to answer: while it replays a large transaction at
// its commit, a walsender reads no replies, and when the transaction's
// changes are not published it sends nothing either. PostgreSQL 15's
// pgoutput then sends a keepalive every wal_sender_timeout/2 (the longest
// silence measured: 29 s with the default 60 s); wal2json sends nothing
// until the replay ends (49 s for 8 million filtered rows). So before it
// gives a silent connection up, the receive loop asks the server over the
// catalog connection what the walsender does (probeWalsender):
//
//   - busy (on CPU, reading its spill files, waiting for a lock) with its
//     sent position standing still: alive; the loop asks again every
//     status_interval (at most 2 s) while the silence lasts;
//   - idle (waiting for WAL or for the client, Activity and Client wait
//     events): it would have answered; the link is dead;
//   - its sent position moved while nothing arrived: what it sends is
//     lost on the way; dead;
//   - gone, or no answer within a few seconds from the catalog connection
//     (or from a new one, when the server had closed the catalog one):
//     dead.
//
// A walsender that waits, or whose sent position moved, has been through
// its main loop since the silence began, and there it answers every
// status update that asked for a reply (one did: the loop asks with every
// update once the silence passes receive_timeout/2). Its answer may still
// be on the way when the probe looks, so a dead verdict stands only when
// nothing arrives for lostGrace after it.

// lostGrace is how long the receive loop waits for a message after a
// probe found the connection dead, before it gives the connection up.
const lostGrace = time.Second

// silenceWatch is the receive loop's state of one silence.
type silenceWatch struct {
	next      time.Time // do not probe (or give up) before
	busySince time.Time // first probe that found the walsender busy; zero: none
	sent      string    // the walsender's sent_lsn at that probe
	wait      string    // what it waited on then ("" on CPU)
	lost      error     // a probe's dead verdict, final once lostGrace passes without a message
	probed    bool      // the catalog connection answered that probe
}

// active reports whether a silence is being watched.
func (w *silenceWatch) active() bool { return !w.busySince.IsZero() || w.lost != nil }

// due returns when the silence that began at lastRecv is to be checked.
func (w *silenceWatch) due(lastRecv time.Time, timeout time.Duration) time.Time {
	at := lastRecv.Add(timeout)
	if w.next.After(at) {
		return w.next
	}
	return at
}

// walsenderState is what pg_stat_activity and pg_stat_replication say of
// a walsender.
type walsenderState struct {
	found              bool
	waitType, waitName string // pg_stat_activity.wait_event_type and wait_event; "" on CPU
	sent               string // pg_stat_replication.sent_lsn; "" when not streaming
}

func (w walsenderState) wait() string {
	if w.waitType == "" {
		return "on CPU"
	}
	return w.waitType + "/" + w.waitName
}

// idle reports whether the walsender waits for WAL or for its client: it
// would answer a status update at once.
func (w walsenderState) idle() bool { return w.waitType == "Activity" || w.waitType == "Client" }

// probeWalsender asks, over the catalog connection (used only from the
// receive loop's goroutine), what the walsender of process pid does;
// within timeout. When the catalog connection fails otherwise than by
// timing out (the server closed it, as idle_session_timeout does), it asks
// over a new connection.
func (s *Source) probeWalsender(pid uint32, timeout time.Duration) (walsenderState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w, err := queryWalsender(ctx, s.cat, pid)
	if err == nil || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return w, err
	}
	cfg, cerr := s.connConfig("bridge:" + s.name)
	if cerr != nil {
		return w, err
	}
	conn, cerr := pgx.ConnectConfig(ctx, cfg)
	if cerr != nil {
		return w, fmt.Errorf("%w; and connecting anew: %w", err, cerr)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		ccancel()
	}()
	return queryWalsender(ctx, conn, pid)
}

// queryWalsender reads pg_stat_activity and pg_stat_replication for pid.
func queryWalsender(ctx context.Context, conn *pgx.Conn, pid uint32) (walsenderState, error) {
	var w walsenderState
	err := conn.QueryRow(ctx, `SELECT coalesce(a.wait_event_type, ''), coalesce(a.wait_event, ''), coalesce(r.sent_lsn::text, '')
		FROM pg_stat_activity a LEFT JOIN pg_stat_replication r ON r.pid = a.pid WHERE a.pid = $1`, int64(pid)).Scan(&w.waitType, &w.waitName, &w.sent)
	if errors.Is(err, pgx.ErrNoRows) {
		return w, nil
	}
	if err != nil {
		return w, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	w.found = true
	return w, nil
}

// probeTimeout bounds a probe of the catalog connection.
func (s *Source) probeTimeout() time.Duration {
	return min(5*time.Second, max(s.cfg.StatusInterval, time.Second))
}

// checkSilence decides, for a connection silent for silent (at least
// timeout), whether the walsender is alive but busy (nil; w says when to
// check again) or the connection is lost (the error, wrapping cause, the
// read's timeout). probed reports whether the catalog connection answered.
func (s *Source) checkSilence(w *silenceWatch, silent, timeout time.Duration, cause error) (probed bool, lost error) {
	pid := s.repl.PID()
	what := fmt.Sprintf("replication connection on slot %q of database %q silent for %s (receive_timeout %s)",
		s.cfg.Slot, s.database, silent.Round(time.Millisecond), timeout)
	st, err := s.probeWalsender(pid, s.probeTimeout())
	switch {
	case err != nil:
		return false, fmt.Errorf("%s, and the catalog connection could not say what its walsender (PID %d) does (%v): taking it as lost: %w",
			what, pid, err, cause)
	case !st.found:
		return true, fmt.Errorf("%s; its walsender (PID %d) is gone: taking it as lost: %w", what, pid, cause)
	case st.idle():
		return true, fmt.Errorf("%s while its walsender (PID %d) waits (%s) instead of answering: the link is dead; taking it as lost: %w",
			what, pid, st.wait(), cause)
	case !w.busySince.IsZero() && st.sent != w.sent:
		return true, fmt.Errorf("%s while its walsender (PID %d) sent WAL from %s to %s that never arrived: the link is dead; taking it as lost: %w",
			what, pid, w.sent, st.sent, cause)
	}
	now := time.Now()
	if w.busySince.IsZero() {
		w.busySince, w.sent, w.wait = now, st.sent, st.wait()
		s.log.Info("replication connection silent, but its walsender is busy (a large transaction being decoded): waiting",
			"slot", s.cfg.Slot, "walsender", pid, "silent", silent.Round(time.Millisecond).String(), "receive_timeout", timeout.String(),
			"wait", st.wait(), "sent_lsn", st.sent)
	}
	w.next = now.Add(min(s.cfg.StatusInterval, 2*time.Second))
	return true, nil
}

// endWalsender ends the walsender of the replication connection the
// source gives up (process pid), so that the slot is free for the next
// run at once, not after the server's wal_sender_timeout: over a link that
// went silent the server does not learn that the connection is closed.
// That walsender can only be the source's own (pid is its connection's
// server process), and only a walsender of this source's
// application_name is ended. It uses the catalog connection when that
// answered (catalogOK) and is open, else a new connection; both bounded
// by a few seconds. Failing is logged, not returned.
func (s *Source) endWalsender(pid uint32, catalogOK bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.probeTimeout())
	defer cancel()
	conn := s.cat
	if !catalogOK || conn.IsClosed() {
		cfg, err := s.connConfig("bridge:" + s.name)
		if err == nil {
			conn, err = pgx.ConnectConfig(ctx, cfg)
		}
		if err != nil {
			s.log.Warn("could not end the walsender of the lost replication connection; Postgres frees the slot after wal_sender_timeout",
				"slot", s.cfg.Slot, "walsender", pid, "err", err)
			return
		}
		defer func() {
			cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			ccancel()
		}()
	}
	var ended bool
	err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
		WHERE pid = $1 AND backend_type = 'walsender' AND application_name = $2`, int64(pid), "bridge:"+s.name).Scan(&ended)
	switch {
	case err != nil:
		s.log.Warn("could not end the walsender of the lost replication connection; Postgres frees the slot after wal_sender_timeout",
			"slot", s.cfg.Slot, "walsender", pid, "err", err)
	case ended:
		s.log.Info("ended the walsender of the lost replication connection, so that the slot is free at once", "slot", s.cfg.Slot, "walsender", pid)
	}
}
