// Server-sent events: the stream of one feed request.

package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/bridgecdc/bridge/bridge/feeds"
)

// sse streams batches as server-sent events: "changes" events whose id is
// the token after them, "up-to-date" once caught up (at once, without
// waiting for a new transaction), "must-refetch" and "error" (reason
// "slow", "expired" once until passes when it is set, or "shutdown")
// before closing, and keep-alives.
//
// Every keep-alive carries an id, the feed's token: the transactions up
// to it were scanned and none matched. An event stream block with an id
// and no data dispatches no event but sets the EventSource's last event
// ID, so a client that only waits still reconnects (after a restart, a
// load balancer's drain) from a recent position instead of its last match.
// When the server drains or closes, the stream ends with an error event
// (reason "shutdown") carrying the position reached, for the same reason.
func (s *Server) sse(ctx context.Context, w http.ResponseWriter, r *http.Request, f *feeds.Feed, until time.Time) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s.met.request(modeSSE, outcomeOK)
	write := func(b []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	// lost ends the stream after a failed write.
	lost := func(err error) {
		reason := writeFailure(err)
		s.met.disconnect(reason)
		if reason == disconnectWriteTimeout {
			s.log.Info("feeds: SSE client disconnected: too slow to take an event", "remote", r.RemoteAddr, "timeout", s.cfg.WriteTimeout)
		}
	}
	// shutdown ends the stream as the server stops, buf (maybe empty)
	// first.
	shutdown := func(buf []byte) {
		s.met.disconnect(disconnectError)
		body, _ := json.Marshal(apiError{Error: "unavailable", Reason: "shutdown", Detail: "the server is shutting down: reconnect with Last-Event-ID"})
		buf = appendID(buf, f.Token())
		_ = write(fmt.Appendf(buf, "event: error\ndata: %s\n\n", body))
	}
	if err := write([]byte(": feed\nretry: 1000\n\n")); err != nil {
		lost(err)
		return
	}
	upToDateSent := false
	var buf []byte
	for {
		wait := s.cfg.KeepAlive
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				s.met.disconnect(disconnectExpired)
				body, _ := json.Marshal(apiError{Error: "unauthorized", Reason: "expired", Detail: "the token has expired: reconnect with a new one and Last-Event-ID"})
				_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", body))
				return
			}
			wait = min(wait, left)
		}
		nctx, cancel := context.WithTimeout(ctx, wait)
		var b feeds.Batch
		var err error
		if upToDateSent {
			b, err = f.Next(nctx)
		} else {
			b, err = f.Poll(nctx) // up-to-date as soon as caught up
		}
		cancel()
		if r.Context().Err() != nil {
			s.met.disconnect(disconnectClientGone)
			return
		}
		var re *feeds.RefetchError
		switch {
		case errors.As(err, &re):
			s.met.refetch(re)
			s.met.disconnect(disconnectRefetch)
			body, _ := json.Marshal(refetchBody(re, s.fs.Position()))
			_ = write(fmt.Appendf(nil, "event: must-refetch\ndata: %s\n\n", body))
			return
		case errors.Is(err, feeds.ErrClosed):
			shutdown(nil)
			return
		case errors.Is(err, context.Canceled) && s.draining.Err() != nil:
			// Drained: b holds what was read, written below.
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			s.met.disconnect(disconnectError)
			body, _ := json.Marshal(apiError{Error: "overloaded", Detail: err.Error()})
			_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", body))
			return
		}
		buf = buf[:0]
		if len(b.Changes) > 0 {
			buf = appendID(buf, b.Token)
			buf = append(buf, "event: changes\ndata: "...)
			buf = appendBatch(buf, b) // ends with a newline
			buf = append(buf, '\n')
			upToDateSent = false
		}
		if b.UpToDate && !upToDateSent {
			buf = fmt.Appendf(buf, "id: %s\nevent: up-to-date\ndata: {\"token\":%q}\n\n", b.Token, b.Token)
			upToDateSent = true
		}
		if s.draining.Err() != nil {
			shutdown(buf)
			s.met.deliver(modeSSE, b, time.Now())
			return
		}
		if len(buf) == 0 {
			// A keep-alive: the comment keeps proxies from closing the
			// stream, the id moves the client's position.
			buf = append(buf, ": keep-alive\n"...)
			buf = appendID(buf, b.Token)
			buf = append(buf, '\n')
		}
		if err := write(buf); err != nil {
			lost(err)
			return
		}
		s.met.deliver(modeSSE, b, time.Now())
		if pos := s.fs.Position(); len(b.Changes) > 0 && pos.Seq > b.Token.Seq+s.cfg.MaxLag {
			s.met.disconnect(disconnectSlow)
			body, _ := json.Marshal(apiError{Error: "slow", Reason: "slow",
				Detail: fmt.Sprintf("%d messages behind the stream; reconnect with Last-Event-ID", pos.Seq-b.Token.Seq)})
			_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", body))
			s.log.Info("feeds: SSE client disconnected: too far behind", "remote", r.RemoteAddr, "behind", pos.Seq-b.Token.Seq)
			return
		}
	}
}

// appendID appends the id line of t; nothing for the zero token.
func appendID(dst []byte, t feeds.Token) []byte {
	if t.IsZero() {
		return dst
	}
	dst = append(dst, "id: "...)
	dst = append(dst, t.String()...)
	return append(dst, '\n')
}
