package config

import (
	"net"
	"strings"
	"time"
)

// CheckNATSClient returns the problems of the shape of c, the client keys
// of a NATS section, as FieldErrors at paths relative to the section
// ("tls.key_file"): creds with nkey_seed_file, half of a client certificate, insecure_skip_verify with ca_file,
// a context name that is neither a name nor a .json file, a negative or
// sub-100ms ping_interval, a negative max_pings_outstanding. Whether the files
// load, and the context's own keys, are checked by internal/natsconn.
func CheckNATSClient(c NATSClient) []error {
	var errs []error
	add := func(p, format string, args ...any) { errs = append(errs, Field(p, format, args...)) }
	if c.Creds != "" && c.NKeySeedFile != "" {
		add("nkey_seed_file", "set creds or nkey_seed_file, not both: a .creds file holds its own nkey seed")
	}
	t := c.TLS
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		add("tls.key_file", "must be set with cert_file: the private key of the client certificate")
	case t.KeyFile != "" && t.CertFile == "":
		add("tls.cert_file", "must be set with key_file: the client certificate of the private key")
	}
	if t.InsecureSkipVerify && t.CAFile != "" {
		add("tls.insecure_skip_verify", "turns off the verification tls.ca_file is for: remove one of them")
	}
	if c.PingInterval < 0 || (c.PingInterval > 0 && c.PingInterval < 100*time.Millisecond) {
		add("ping_interval", "must be at least 100ms (0 is the default, %s), got %s", DefaultNATSPingInterval, c.PingInterval)
	}
	if c.MaxPingsOutstanding < 0 {
		add("max_pings_outstanding", "must be at least 1 (0 is the default, %d), got %d", DefaultNATSMaxPingsOutstanding, c.MaxPingsOutstanding)
	}
	if n := c.Context; n != "" && !strings.HasSuffix(n, ".json") && (strings.ContainsAny(n, `/\`) || strings.Contains(n, "..")) {
		add("context", "must be the name of a nats CLI context (as `nats context ls` lists it) or the path of its .json file, got %q", n)
	}
	return errs
}

// RunsEmbedded reports whether the bridge starts its embedded nats-server:
// URL and Context are both empty.
func (n NATS) RunsEmbedded() bool { return n.URL == "" && n.Context == "" }

// validate adds the problems of the nats section.
func (n *NATS) validate(add func(p, format string, args ...any)) {
	for _, err := range CheckNATSClient(n.NATSClient) {
		fe := err.(*FieldError)
		add("nats."+fe.Path, "%s", fe.Msg)
	}
	if p := n.Embedded.Port; p < -1 || p > 65535 {
		add("nats.embedded.port", "must be a port number, or -1 for any free port, got %d", p)
	}
	if n.URL != "" || n.Context != "" {
		return
	}
	// The embedded server: no TLS, and users or a token only.
	if n.TLS.Enabled() {
		add("nats.tls", "applies to nats.url or nats.context, which are empty: the embedded server serves no TLS (it listens on loopback); set nats.url to a NATS server with TLS, or remove nats.tls")
	}
	for _, k := range []struct{ key, val string }{{"creds", n.Creds}, {"nkey_seed_file", n.NKeySeedFile}} {
		if k.val != "" {
			add("nats."+k.key, "applies to nats.url or nats.context, which are empty: the embedded server authenticates with nats.user and password or nats.token; set one of those, or set nats.url")
		}
	}
	host := n.Embedded.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if IsLoopback(net.JoinHostPort(host, "0")) {
		return
	}
	switch {
	case n.User == "" && n.Token == "":
		add("nats.embedded.host", "%q lets other machines reach the embedded NATS server, which holds every change: set nats.user and nats.password (or nats.token), which it then requires of every client, or listen on 127.0.0.1", host)
	case n.User != "" && n.Password == "":
		add("nats.password", "must be set: nats.embedded.host %q lets other machines reach the embedded NATS server, which requires nats.user and this password of every client", host)
	}
}
