package config

import (
	"regexp"
	"strings"
)

// redacted replaces every secret Redact removes.
const redacted = "xxxxx"

var (
	// urlRE recognises a string that is a URL, or a list of them.
	urlRE = regexp.MustCompile(`^\s*[A-Za-z][A-Za-z0-9+.-]*://`)
	// nextURLRE finds where the next URL of a comma-separated list starts
	// (submatch 1), so that a password holding "://" does not split a URL.
	nextURLRE = regexp.MustCompile(`,\s*([A-Za-z][A-Za-z0-9+.-]*://)`)
	// queryPasswordRE finds password parameters in a URL query.
	queryPasswordRE = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)[^&#]*`)
	// kvPasswordRE finds password settings in a key=value DSN; a value is
	// single-quoted (with \' and \\ escapes) or runs to the next space.
	kvPasswordRE = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s]*)`)
)

// tokenSchemes are URL schemes whose user part alone is a secret (a NATS
// token: nats://TOKEN@host).
var tokenSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// Redact returns s with the secrets of a connection string replaced by
// "xxxxx", for logging:
//
//   - URLs, alone or a comma-separated list: the password of user:pass@
//     (postgres://user:secret@host/db → postgres://user:xxxxx@host/db), the
//     whole user part of nats, tls, ws and wss URLs without a password (a
//     token), and password= query parameters;
//   - key=value DSNs: the value of password= (quoted or not).
//
// Anything else is returned unchanged. When unsure where a password ends,
// Redact removes too much rather than too little.
func Redact(s string) string {
	if !urlRE.MatchString(s) {
		return kvPasswordRE.ReplaceAllString(s, "${1}"+redacted)
	}
	starts := []int{0}
	for _, m := range nextURLRE.FindAllStringSubmatchIndex(s, -1) {
		starts = append(starts, m[2])
	}
	var b strings.Builder
	for i, start := range starts {
		end := len(s)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		u := s[start:end]
		sep := strings.Index(u, "://")
		scheme := strings.ToLower(strings.TrimSpace(u[:sep]))
		b.WriteString(u[:sep+3])
		b.WriteString(redactURLRest(scheme, u[sep+3:]))
	}
	return b.String()
}

// redactURLRest redacts the part of a URL after "scheme://".
func redactURLRest(scheme, rest string) string {
	// The user part ends at the last @ before the query; if the password
	// holds a ? or #, at the last @ at all.
	beforeQuery := rest
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		beforeQuery = rest[:i]
	}
	at := strings.LastIndex(beforeQuery, "@")
	if at < 0 {
		at = strings.LastIndex(rest, "@")
	}
	if at >= 0 {
		user := rest[:at]
		if colon := strings.Index(user, ":"); colon >= 0 {
			rest = user[:colon+1] + redacted + rest[at:]
		} else if tokenSchemes[scheme] && user != "" {
			rest = redacted + rest[at:]
		}
	}
	return queryPasswordRE.ReplaceAllString(rest, "${1}"+redacted)
}
