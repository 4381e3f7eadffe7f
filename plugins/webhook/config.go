package webhook

import (
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/bridgecdc/bridge/config"
)

// Config is the sink's `config:` block.
type Config struct {
	// URL receives the requests: an http or https URL. Required.
	URL string `koanf:"url"`
	// Batch sends each batch as one request with a JSON array body (true)
	// or each change as its own request (false). Default true.
	Batch bool `koanf:"batch"`
	// Timeout bounds each request, response included, a duration. Default 10s.
	Timeout time.Duration `koanf:"timeout"`
	// Headers are added to every request, e.g. Authorization. Optional;
	// values are never logged. Content-Type, Idempotency-Key and the
	// headers Go's HTTP client sets itself cannot be overridden.
	Headers map[string]string `koanf:"headers"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Batch: true, Timeout: 10 * time.Second}
}

// reserved are the headers the sink, or Go's HTTP client, sets itself
// (canonical form).
var reserved = map[string]bool{
	"Content-Type": true, "Idempotency-Key": true, "Content-Length": true, "Host": true,
	"Transfer-Encoding": true, "Connection": true, "Trailer": true, "Te": true, "Upgrade": true,
}

// Validate reports every invalid field at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, config.Field("url", "must be set"))
	} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, config.Field("url", "must be an http:// or https:// URL with a host, got %q", redact(c.URL)))
	}
	if c.Timeout <= 0 {
		errs = append(errs, config.Field("timeout", "must be > 0, got %s", c.Timeout))
	}
	for k, v := range c.Headers {
		switch {
		case !validHeaderName(k):
			errs = append(errs, config.Field("headers."+k, "is not a valid header name"))
		case reserved[canonical(k)]:
			errs = append(errs, config.Field("headers."+k, "is set by the sink and cannot be configured"))
		case !validHeaderValue(v):
			errs = append(errs, config.Field("headers."+k, "the value must not contain line breaks or NUL"))
		}
	}
	return errors.Join(errs...)
}

// redact returns u without user info, query or fragment, which may hold
// secrets; an unparsable u becomes a placeholder.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "<invalid URL>"
	}
	p.User, p.RawQuery, p.ForceQuery, p.Fragment, p.RawFragment = nil, "", false, "", ""
	return p.String()
}

// validHeaderName reports whether k is an HTTP token (RFC 9110 §5.1).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", r):
		default:
			return false
		}
	}
	return true
}

func validHeaderValue(v string) bool { return !strings.ContainsAny(v, "\r\n\x00") }
