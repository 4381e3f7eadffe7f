// GET /v1/feed: the handler of both modes, the long-poll's answer and the
// refusals of feed errors (409 must-refetch, 503).

package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/bridge/feeds"
)

// feed serves GET /v1/feed: a long-poll, or an SSE stream (sse) when the
// request asks for text/event-stream.
func (s *Server) feed(w http.ResponseWriter, r *http.Request) {
	mode := modeLongPoll
	if r.URL.Query().Get("sse") != "" || strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		mode = modeSSE
	}
	who, ok := s.authenticate(w, r, true, mode)
	if !ok {
		return
	}
	filter, tok, err := s.parseRequest(r, who)
	var denied *authError
	if errors.As(err, &denied) {
		s.met.request(mode, outcomeForbidden)
		challenge(w, denied)
		return
	}
	if err != nil {
		s.met.request(mode, outcomeBadRequest)
		writeJSON(w, http.StatusBadRequest, apiError{Error: "bad-request", Detail: err.Error()})
		return
	}
	done, ok := s.admit(w, r, mode, who)
	if !ok {
		return
	}
	defer done()
	f, err := s.fs.Register(filter, tok)
	if err != nil {
		s.fail(w, mode, err)
		return
	}
	defer f.Close()
	rctx, stop := s.requestContext(r)
	defer stop()
	if mode == modeSSE {
		var until time.Time
		if who != nil {
			until = who.until
		}
		s.sse(rctx, w, r, f, until)
		return
	}
	hold := s.cfg.Hold
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			s.met.request(mode, outcomeBadRequest)
			writeJSON(w, http.StatusBadRequest, apiError{Error: "bad-request", Detail: fmt.Sprintf("timeout: want a duration such as 20s, got %q", v)})
			return
		}
		hold = min(d, hold)
	}
	ctx, cancel := context.WithTimeout(rctx, hold)
	defer cancel()
	b, err := f.Next(ctx)
	switch {
	case err == nil || errors.Is(err, context.DeadlineExceeded):
	case r.Context().Err() != nil:
		s.met.request(mode, outcomeClientGone)
		return
	case errors.Is(err, feeds.ErrClosed):
		// The server is stopping: answer with the position reached, which
		// the client's next poll resumes from wherever it lands.
		b = feeds.Batch{Token: f.Token()}
	case errors.Is(err, context.Canceled) && s.draining.Err() != nil:
		// Drained: b holds the position reached, as at a timeout.
	default:
		s.fail(w, mode, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Bridge-Token", s.tokenText(b.Token))
	if _, err := w.Write(append(s.appendBatch(nil, b), '\n')); err != nil {
		s.met.request(mode, outcomeClientGone)
		return
	}
	s.met.request(mode, outcomeOK)
	s.met.deliver(mode, b, time.Now())
}

// appendBatch writes {"token":..,"up_to_date":..,"changes":[..]}, the
// body of a long-poll's answer and of an SSE changes event, reusing each
// change's shared encoding (compact JSON: feeds never writes a raw line
// break).
func (s *Server) appendBatch(dst []byte, b feeds.Batch) []byte {
	dst = append(dst, `{"token":"`...)
	dst = append(dst, s.tokenText(b.Token)...)
	dst = append(dst, `","up_to_date":`...)
	dst = strconv.AppendBool(dst, b.UpToDate)
	dst = append(dst, `,"changes":[`...)
	for i, c := range b.Changes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, c.JSON...)
	}
	return append(dst, "]}"...)
}

// fail answers a feed error: 409 for must-refetch, 503 otherwise.
func (s *Server) fail(w http.ResponseWriter, mode string, err error) {
	var re *feeds.RefetchError
	if errors.As(err, &re) {
		s.met.request(mode, outcomeRefetch)
		s.met.refetch(re)
		writeJSON(w, http.StatusConflict, s.refetchBody(re))
		return
	}
	s.met.request(mode, outcomeOverloaded)
	w.Header().Set("Retry-After", "1")
	detail := err.Error()
	if errors.Is(err, feeds.ErrTooManyProjections) {
		detail = fmt.Sprintf("columns: %d column sets are in use, the server's limit (serve.max_projections): retry later, or ask for columns another request uses, or for all columns", s.fs.Stats().Projections)
	}
	writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "overloaded", Detail: detail})
}

// refetchBody is the 409 body (and must-refetch event) of re, with the
// position to start again from after refetching.
func (s *Server) refetchBody(re *feeds.RefetchError) apiError {
	return apiError{Error: "must-refetch", Reason: re.Reason, Detail: re.Detail, Position: s.tokenText(s.fs.Position())}
}
