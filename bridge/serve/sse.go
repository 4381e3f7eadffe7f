// Server-sent events: the stream of one feed request.

package serve

import (
	"bytes"
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
		_ = write(appendEvent(buf, s.tokenText(f.Token()), "error", body))
	}
	if err := write([]byte(": feed\nretry: 1000\n\n")); err != nil {
		lost(err)
		return
	}
	upToDateSent := false
	var buf, data []byte // the stream's events, a batch's body
	for {
		wait := s.cfg.KeepAlive
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				s.met.disconnect(disconnectExpired)
				body, _ := json.Marshal(apiError{Error: "unauthorized", Reason: "expired", Detail: "the token has expired: reconnect with a new one and Last-Event-ID"})
				_ = write(appendEvent(nil, "", "error", body))
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
			body, _ := json.Marshal(s.refetchBody(re))
			_ = write(appendEvent(nil, "", "must-refetch", body))
			return
		case errors.Is(err, feeds.ErrClosed):
			shutdown(nil)
			return
		case errors.Is(err, context.Canceled) && s.draining.Err() != nil:
			// Drained: b holds what was read, written below.
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			s.met.disconnect(disconnectError)
			body, _ := json.Marshal(apiError{Error: "overloaded", Detail: err.Error()})
			_ = write(appendEvent(nil, "", "error", body))
			return
		}
		buf = buf[:0]
		if len(b.Changes) > 0 {
			data = s.appendBatch(data[:0], b)
			buf = appendEvent(buf, s.tokenText(b.Token), "changes", data)
			upToDateSent = false
		}
		if b.UpToDate && !upToDateSent {
			id := s.tokenText(b.Token)
			buf = appendEvent(buf, id, "up-to-date", fmt.Appendf(data[:0], "{\"token\":%q}", id))
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
			buf = appendID(buf, s.tokenText(b.Token))
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
			_ = write(appendEvent(nil, "", "error", body))
			s.log.Info("feeds: SSE client disconnected: too far behind", "remote", r.RemoteAddr, "behind", pos.Seq-b.Token.Seq)
			return
		}
	}
}

// appendID appends the id line of the token id; nothing for "".
func appendID(dst []byte, id string) []byte {
	if id == "" {
		return dst
	}
	dst = append(dst, "id: "...)
	dst = append(dst, id...)
	return append(dst, '\n')
}

// appendEvent appends one event: the id line (none for ""), the event
// line, data and the blank line that ends the event. data is written one
// "data:" line per line of it, as the HTML standard reads them back: a
// line ends at "\r\n", "\r" or "\n", and a client joins the data lines of
// an event with "\n". So no byte of data can end the event, or one of its
// lines, early: a value with raw line breaks (a json column keeps its text
// as written) arrives whole, its line breaks as "\n", and the id never
// names a position whose event was cut short. id and event are the
// server's own (tokens, event names) and hold no line break.
func appendEvent(dst []byte, id, event string, data []byte) []byte {
	dst = appendID(dst, id)
	dst = append(dst, "event: "...)
	dst = append(dst, event...)
	dst = append(dst, '\n')
	for {
		i := bytes.IndexAny(data, "\r\n")
		line := data
		if i >= 0 {
			line = data[:i]
		}
		dst = append(dst, "data: "...)
		dst = append(dst, line...)
		dst = append(dst, '\n')
		if i < 0 {
			break
		}
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	return append(dst, '\n')
}
