package ssetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Client is one EventSource-like client of /v1/feed in a Crowd: it
// reconnects with its last event ID whenever its stream ends, as a
// browser does, and records what it receives.
type Client struct {
	// Target is the request's path and query, e.g.
	// "/v1/feed?sse=1&where=...&token=now".
	Target string

	mu        sync.Mutex
	changes   []Change
	lastID    string
	upToDate  time.Time // when the last up-to-date event arrived
	opens     []Opened
	refetches int
	errEvents []string
	lastErr   error
}

// Change is a change as a client received it in a "changes" event.
type Change struct {
	Seq uint64 `json:"seq"`
	ID  string `json:"id"`
	Op  string `json:"op"`
}

// State is a copy of a client's record.
type State struct {
	Changes []Change
	// LastEventID is what the client would send on reconnecting.
	LastEventID string
	// UpToDate is when the last up-to-date event arrived; zero if none.
	UpToDate time.Time
	// Opens are the streams opened (200 responses), oldest first.
	Opens []Opened
	// Refetches counts must-refetch events; ErrorEvents holds the data of
	// error events.
	Refetches   int
	ErrorEvents []string
	// LastErr is the last failure to open or read a stream.
	LastErr error
}

// State returns a copy of the client's record.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return State{Changes: append([]Change(nil), c.changes...), LastEventID: c.lastID, UpToDate: c.upToDate,
		Opens: append([]Opened(nil), c.opens...), Refetches: c.refetches, ErrorEvents: append([]string(nil), c.errEvents...), LastErr: c.lastErr}
}

// Opened is one stream a client opened.
type Opened struct {
	// At is when the response's headers arrived.
	At time.Time
	// LastEventID is what the client sent.
	LastEventID string
	// UpToDate is when the stream's first up-to-date event arrived; zero
	// if none has.
	UpToDate time.Time
}

// Crowd runs many Clients against one server.
type Crowd struct {
	// Addr is the server's host:port.
	Addr string
	// Header is sent with every request (e.g. Authorization).
	Header http.Header
	// Retry is the wait before reconnecting when the server set no retry
	// field; default 1s. A random 0-10% is added, as connections do not
	// all fail at the same instant either.
	Retry time.Duration
	// Dials bounds the connections being opened at once (the listen
	// backlog of the server is finite); default 256.
	Dials int
	// Clients are the crowd's clients.
	Clients []*Client
}

// Run runs every client until ctx ends.
func (cr *Crowd) Run(ctx context.Context) {
	if cr.Retry <= 0 {
		cr.Retry = time.Second
	}
	if cr.Dials <= 0 {
		cr.Dials = 256
	}
	sem := make(chan struct{}, cr.Dials)
	var wg sync.WaitGroup
	for i, c := range cr.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cr.run(ctx, c, sem, rand.New(rand.NewPCG(uint64(i), 7)))
		}()
	}
	wg.Wait()
}

func (cr *Crowd) run(ctx context.Context, c *Client, sem chan struct{}, r *rand.Rand) {
	for ctx.Err() == nil {
		retry := cr.stream(ctx, c, sem)
		if retry <= 0 {
			retry = cr.Retry
		}
		retry += time.Duration(r.Int64N(int64(retry)/10 + 1))
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// stream opens one stream and reads it to its end; it returns the
// server's retry time, if it set one.
func (cr *Crowd) stream(ctx context.Context, c *Client, sem chan struct{}) time.Duration {
	c.mu.Lock()
	last := c.lastID
	c.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := Open(octx, cr.Addr, c.Target, last, cr.Header)
	cancel()
	<-sem
	if err != nil {
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
		return 0
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	c.mu.Lock()
	c.opens = append(c.opens, Opened{At: time.Now(), LastEventID: last})
	this := len(c.opens) - 1
	c.mu.Unlock()
	for {
		b, err := s.Next()
		if err != nil {
			c.mu.Lock()
			if !errors.Is(err, context.Canceled) {
				c.lastErr = err
			}
			c.mu.Unlock()
			return s.Retry()
		}
		c.mu.Lock()
		c.lastID = b.LastEventID
		switch b.Type {
		case "changes":
			var body struct {
				Changes []Change `json:"changes"`
			}
			if err := json.Unmarshal([]byte(b.Data), &body); err != nil {
				c.lastErr = fmt.Errorf("decoding a changes event: %w", err)
			}
			c.changes = append(c.changes, body.Changes...)
		case "up-to-date":
			c.upToDate = time.Now()
			if o := &c.opens[this]; o.UpToDate.IsZero() {
				o.UpToDate = c.upToDate
			}
		case "must-refetch":
			c.refetches++
		case "error":
			c.errEvents = append(c.errEvents, b.Data)
		}
		c.mu.Unlock()
	}
}

// UpToDateSince returns, for each client, when the first stream it
// opened after since received its first up-to-date event; zero for a
// client that has not yet.
func (cr *Crowd) UpToDateSince(since time.Time) []time.Time {
	out := make([]time.Time, len(cr.Clients))
	for i, c := range cr.Clients {
		c.mu.Lock()
		for _, o := range c.opens {
			if o.At.After(since) {
				out[i] = o.UpToDate
				break
			}
		}
		c.mu.Unlock()
	}
	return out
}
