// Package ssetest is a client of server-sent event streams for the tests
// and benchmarks of `bridge serve`. It reads a stream as a browser's
// EventSource does (the HTML standard, "Interpreting an event stream"):
// an id field sets the stream's last event ID when its block ends, whether
// or not the block carries data, and only a block with data is an event.
// Unlike EventSource it also returns the blocks without data, so a test
// can watch keep-alives advance the last event ID.
//
// One Stream is one TCP connection (HTTP/1.1, no TLS) with one goroutine
// reading it: light enough to hold ten thousand in a benchmark.
package ssetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Block is what one blank line ends: an event when Dispatched, else only
// the id (and comments) it carried.
type Block struct {
	// Dispatched reports whether the block is an event (it had data).
	Dispatched bool
	// Type is the event's type: its event field, or "message".
	Type string
	// Data is the event's data, lines joined with "\n".
	Data string
	// LastEventID is the stream's last event ID once the block ended.
	LastEventID string
	// Comment is the block's last comment line, without the colon and one
	// space; "" when it had none.
	Comment string
}

// StatusError is a response other than 200 with an event stream.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("ssetest: HTTP %d: %s", e.Code, strings.TrimSpace(e.Body))
}

// Stream is one open event stream. Next is not safe for concurrent use;
// Close may be called from another goroutine.
type Stream struct {
	conn   net.Conn
	body   io.ReadCloser
	r      *bufio.Reader
	lastID string
	retry  time.Duration
	p      *Parser
	buf    [4096]byte
}

// Open connects to addr (host:port) and requests target (a path and
// query) with Accept: text/event-stream and, when lastEventID is not "",
// Last-Event-ID, plus hdr. ctx bounds the connection and the response's
// headers only. A status other than 200 is a *StatusError.
func Open(ctx context.Context, addr, target, lastEventID string, hdr http.Header) (*Stream, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	s, err := open(conn, addr, target, lastEventID, hdr)
	if !stop() || err != nil {
		conn.Close()
		if err == nil || ctx.Err() != nil {
			err = errors.Join(ctx.Err(), err)
		}
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return s, nil
}

func open(conn net.Conn, addr, target, lastEventID string, hdr http.Header) (*Stream, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+target, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, &StatusError{Code: resp.StatusCode, Body: string(b)}
	}
	return &Stream{conn: conn, body: resp.Body, r: bufio.NewReaderSize(resp.Body, 4096), lastID: lastEventID}, nil
}

// LastEventID is the stream's last event ID: what a reconnecting
// EventSource sends as Last-Event-ID.
func (s *Stream) LastEventID() string { return s.lastID }

// Retry is the reconnection time the server last set (the retry field);
// 0 when it set none.
func (s *Stream) Retry() time.Duration { return s.retry }

// SetDeadline bounds the reads of Next.
func (s *Stream) SetDeadline(t time.Time) error { return s.conn.SetReadDeadline(t) }

// Close closes the connection.
func (s *Stream) Close() error { return s.conn.Close() }

// Next reads up to the next blank line and returns the block it ends; at
// the end of the stream it returns io.EOF (a block cut off by the end is
// dropped, as the standard says).
func (s *Stream) Next() (Block, error) {
	if s.p == nil {
		s.p = &Parser{LastEventID: s.lastID}
	}
	for {
		if b, ok := s.p.Next(); ok {
			s.lastID, s.retry = s.p.LastEventID, s.p.Retry
			return b, nil
		}
		n, err := s.r.Read(s.buf[:])
		s.p.Write(s.buf[:n])
		if err != nil && n == 0 {
			if b, ok := s.p.Next(); ok {
				s.lastID, s.retry = s.p.LastEventID, s.p.Retry
				return b, nil
			}
			if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
				return Block{}, io.EOF
			}
			return Block{}, err
		}
	}
}

// Parser interprets an event stream as the HTML standard says
// ("Interpreting an event stream"): lines end at "\r\n", "\r" or "\n"; a
// blank line ends a block; a line starting with ":" is a comment; a field
// is its name up to the first ":" and its value after it, less one leading
// space; "data" lines join with "\n"; an "id" without NUL sets the last
// event ID when the block ends, whether or not it dispatches; only a block
// with data dispatches an event, of type "message" unless "event" names
// one. Write feeds it bytes in any pieces; Next returns the blocks ended.
type Parser struct {
	// LastEventID is the stream's last event ID after the blocks returned.
	LastEventID string
	// Retry is the last valid retry field, 0 before any.
	Retry time.Duration

	line    []byte // the line being read
	afterCR bool   // the last byte was a CR: a LF right after it ends nothing
	blocks  []Block

	// The block being read.
	id                string
	idSet             bool
	typ, comment      string
	data              strings.Builder
	hasData, hasLines bool
}

// Write feeds p to the parser.
func (p *Parser) Write(b []byte) {
	for _, c := range b {
		if p.afterCR {
			p.afterCR = false
			if c == '\n' {
				continue
			}
		}
		switch c {
		case '\r':
			p.afterCR = true
			p.endLine()
		case '\n':
			p.endLine()
		default:
			p.line = append(p.line, c)
		}
	}
}

// Next returns the next block ended by what Write was given.
func (p *Parser) Next() (Block, bool) {
	if len(p.blocks) == 0 {
		return Block{}, false
	}
	b := p.blocks[0]
	p.blocks = p.blocks[1:]
	return b, true
}

func (p *Parser) endLine() {
	line := string(p.line)
	p.line = p.line[:0]
	if line == "" {
		p.endBlock()
		return
	}
	p.hasLines = true
	if c, ok := strings.CutPrefix(line, ":"); ok {
		p.comment = strings.TrimPrefix(c, " ")
		return
	}
	field, value, _ := strings.Cut(line, ":")
	value = strings.TrimPrefix(value, " ")
	switch field {
	case "event":
		p.typ = value
	case "data":
		p.hasData = true
		p.data.WriteString(value)
		p.data.WriteByte('\n')
	case "id":
		if !strings.ContainsRune(value, 0) {
			p.id, p.idSet = value, true
		}
	case "retry":
		if n, err := strconv.Atoi(value); err == nil && n >= 0 && strings.Trim(value, "0123456789") == "" {
			p.Retry = time.Duration(n) * time.Millisecond
		}
	}
}

func (p *Parser) endBlock() {
	if !p.hasLines {
		return // blank lines between blocks
	}
	if p.idSet {
		p.LastEventID = p.id
	}
	b := Block{LastEventID: p.LastEventID, Comment: p.comment}
	if p.hasData {
		b.Dispatched = true
		b.Data = strings.TrimSuffix(p.data.String(), "\n")
		b.Type = p.typ
		if b.Type == "" {
			b.Type = "message"
		}
	}
	p.blocks = append(p.blocks, b)
	p.id, p.idSet, p.typ, p.comment = "", false, "", ""
	p.data.Reset()
	p.hasData, p.hasLines = false, false
}
