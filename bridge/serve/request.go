// A feed request's admission (admit) and what it asks for (parseRequest):
// its filter, bounded and limited to the caller's grant, and its token.

package serve

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/bridge/feeds"
)

// admit counts a feed request in; the returned func counts it out. The
// client is the authenticated caller, else ClientHeader's value, else the
// remote IP (clientKey).
func (s *Server) admit(w http.ResponseWriter, r *http.Request, mode string, who *caller) (func(), bool) {
	client := clientKey(r, who, s.cfg.ClientHeader)
	s.mu.Lock()
	defer s.mu.Unlock()
	retry := strconv.Itoa(1 + rand.IntN(3))
	if s.conns >= s.cfg.MaxConns {
		s.met.request(mode, outcomeOverloaded)
		w.Header().Set("Retry-After", retry)
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "overloaded", Detail: fmt.Sprintf("%d feed requests in progress, the server's limit", s.conns)})
		return nil, false
	}
	if s.perClient[client] >= s.cfg.MaxPerClient {
		s.met.request(mode, outcomeTooMany)
		w.Header().Set("Retry-After", retry)
		writeJSON(w, http.StatusTooManyRequests, apiError{Error: "too-many-requests", Detail: fmt.Sprintf("%d feed requests in progress for this client, the limit", s.perClient[client])})
		return nil, false
	}
	s.conns++
	s.perClient[client]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.conns--
		if s.perClient[client]--; s.perClient[client] <= 0 {
			delete(s.perClient, client)
		}
	}, true
}

// parseRequest reads the filter and position of a feed request. The
// filter is the request's, limited to Tables and the caller's tables, and
// its where ANDed with Where and the caller's. An *authError (403) is a
// table the caller may not read; other errors are the request's (400).
func (s *Server) parseRequest(r *http.Request, who *caller) (feeds.Filter, feeds.Token, error) {
	q := r.URL.Query()
	var f feeds.Filter
	if v := q.Get("tables"); v != "" {
		f.Tables = strings.Split(v, ",")
	}
	for _, t := range f.Tables {
		if schema, table, ok := strings.Cut(t, "."); !ok || schema == "" || table == "" {
			return f, feeds.Token{}, fmt.Errorf("tables: %q is not schema.table (e.g. public.orders)", t)
		}
		// The caller's grant first, and never the list of served tables:
		// a caller learns nothing of tables it may not read.
		if who != nil && who.tables != nil && !contains(who.tables, t) {
			return f, feeds.Token{}, forbidden("tables: the token does not grant %q", t)
		}
		if len(s.cfg.Tables) > 0 && !contains(s.cfg.Tables, t) {
			return f, feeds.Token{}, fmt.Errorf("tables: %q is not served here (serve.tables)", t)
		}
	}
	if len(f.Tables) == 0 {
		f.Tables = s.cfg.Tables
		if who != nil && who.tables != nil {
			f.Tables = who.tables
			if len(s.cfg.Tables) > 0 {
				f.Tables = nil
				for _, t := range who.tables {
					if contains(s.cfg.Tables, t) {
						f.Tables = append(f.Tables, t)
					}
				}
				if len(f.Tables) == 0 {
					return f, feeds.Token{}, forbidden("tables: the token grants none of the tables served here (serve.tables)")
				}
			}
		}
	}
	if v := q.Get("ops"); v != "" {
		for _, op := range strings.Split(v, ",") {
			switch cdc.Op(op) {
			case cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete, cdc.OpRead:
			default:
				return f, feeds.Token{}, fmt.Errorf("ops: %q is not one of insert, update, delete, read", op)
			}
			f.Ops = append(f.Ops, cdc.Op(op))
		}
	}
	if v := q.Get("columns"); v != "" {
		f.Columns = strings.Split(v, ",")
		if n := len(distinct(f.Columns)); n > s.cfg.MaxColumns {
			return f, feeds.Token{}, fmt.Errorf("columns: %d columns, more than the server's limit of %d (serve.max_columns)", n, s.cfg.MaxColumns)
		}
	}
	var conds []feeds.Cond
	if v := q.Get("where"); v != "" {
		c, err := s.parseWhere(v)
		if err != nil {
			return f, feeds.Token{}, err
		}
		conds = append(conds, c)
	}
	if s.cfg.Where != nil {
		conds = append(conds, *s.cfg.Where)
	}
	if who != nil && who.where != nil {
		conds = append(conds, *who.where)
	}
	switch len(conds) {
	case 0:
	case 1:
		f.Where = &conds[0]
	default:
		f.Where = feeds.And(conds...).Ptr()
	}
	tok := q.Get("token")
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		tok = v
	} else if v := q.Get("last_event_id"); v != "" {
		tok = v
	}
	if tok == "now" {
		tok = ""
	}
	t, err := s.parseToken(tok)
	if err != nil {
		return f, feeds.Token{}, fmt.Errorf("token: %w", err)
	}
	return f, t, nil
}

// parseWhere parses a request's where, refusing one nested deeper than
// MaxFilterDepth before the parser recurses into it.
func (s *Server) parseWhere(v string) (feeds.Cond, error) {
	// A condition n deep nests JSON at most 2n+1 deep ({"and":[...]}).
	if jsonDepth(v, 2*s.cfg.MaxFilterDepth+1) > 2*s.cfg.MaxFilterDepth+1 {
		return feeds.Cond{}, fmt.Errorf("where: nested deeper than the server's limit of %d (serve.max_filter_depth)", s.cfg.MaxFilterDepth)
	}
	c, err := feeds.ParseCond([]byte(v))
	if err != nil {
		return feeds.Cond{}, err
	}
	if d := condDepth(&c); d > s.cfg.MaxFilterDepth {
		return feeds.Cond{}, fmt.Errorf("where: nested %d deep, more than the server's limit of %d (serve.max_filter_depth)", d, s.cfg.MaxFilterDepth)
	}
	return c, nil
}

// jsonDepth returns how deeply objects and arrays nest in the JSON text
// v, stopping once past limit.
func jsonDepth(v string, limit int) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > deepest {
				if deepest = depth; deepest > limit {
					return deepest
				}
			}
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// condDepth is the nesting of c: 1 for a comparison, one more for each
// and, or and not around it.
func condDepth(c *feeds.Cond) int {
	d := 0
	for i := range c.Subs {
		d = max(d, condDepth(&c.Subs[i]))
	}
	return d + 1
}

// distinct returns the distinct strings of l.
func distinct(l []string) map[string]struct{} {
	m := make(map[string]struct{}, len(l))
	for _, s := range l {
		m[s] = struct{}{}
	}
	return m
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
