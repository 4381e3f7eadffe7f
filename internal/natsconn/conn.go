package natsconn

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sinks"
)

// Conn is a resolved NATS client setting: the URL, credentials and TLS of
// a section of bridge.yaml (nats, or a sink's block) with the nats CLI
// context it names applied. Build it with Resolve (and Inherit for a sink
// that uses the bridge's connection); the zero Conn connects anonymously
// in plain text. Every key remembers where it was set, so that errors name
// it.
type Conn struct {
	URL                                        string
	Creds, NKeySeedFile, User, Password, Token string
	// UserJWT and UserSeed come from a context's user_jwt and user_seed.
	UserJWT, UserSeed string
	TLS               config.NATSTLS
	InboxPrefix       string
	// PingInterval and MaxPingsOut are the liveness pings (ping_interval,
	// max_pings_outstanding); zero: config's defaults.
	PingInterval time.Duration
	MaxPingsOut  int

	// from maps each key set ("url", "creds", "tls.ca_file", ...) to
	// where it was set, for messages.
	from map[string]origin
	// path is the YAML path of the section, where Key places unset keys.
	path string
}

// origin is where a key of a Conn was set: at a YAML path, or by a field of
// the nats CLI context at a YAML path.
type origin struct {
	path string // "nats.tls.ca_file", or "nats.context" for a context's
	// field, context and file name the context's field ("ca"), the
	// context and its file; empty for a key of bridge.yaml.
	field, context, file string
}

// name is how messages name the key.
func (o origin) name() string {
	if o.field == "" {
		return o.path
	}
	return fmt.Sprintf("%s of %s %q (%s)", o.field, o.path, o.context, o.file)
}

// credKeys are the keys of the credentials: a section that sets one of
// them replaces all of the others' (a context's, or the bridge's for a sink).
var credKeys = []string{"creds", "nkey_seed_file", "user", "password", "token", "user_jwt", "user_seed"}

// Resolve returns the setting of the section at YAML path (e.g. "nats",
// "sinks.main.config") with url and c: c's keys, then, where they set
// nothing, those of the nats CLI context c.Context (its url when url is
// empty; its credentials when c sets none; its ca, cert and key, tls_first
// and inbox_prefix when c's tls sets none of them). An error is a
// *config.FieldError at path.context: the context cannot be read, or uses
// what the bridge cannot honour (a JetStream domain, a SOCKS proxy,
// credentials from nsc or 1Password).
func Resolve(path, url string, c config.NATSClient) (Conn, error) {
	r := Conn{URL: url, Creds: c.Creds, NKeySeedFile: c.NKeySeedFile, User: c.User, Password: c.Password, Token: c.Token, TLS: c.TLS,
		PingInterval: c.PingInterval, MaxPingsOut: c.MaxPingsOutstanding, from: map[string]origin{}, path: path}
	for k, set := range map[string]bool{"url": url != "", "creds": c.Creds != "", "nkey_seed_file": c.NKeySeedFile != "", "user": c.User != "",
		"password": c.Password != "", "token": c.Token != "", "tls.ca_file": c.TLS.CAFile != "", "tls.cert_file": c.TLS.CertFile != "",
		"tls.key_file": c.TLS.KeyFile != "", "tls.server_name": c.TLS.ServerName != "", "tls.handshake_first": c.TLS.HandshakeFirst,
		"tls.insecure_skip_verify": c.TLS.InsecureSkipVerify} {
		if set {
			r.from[k] = origin{path: join(path, k)}
		}
	}
	if c.Context == "" {
		return r, nil
	}
	fail := func(err error) (Conn, error) {
		return Conn{}, &config.FieldError{Path: join(path, "context"), Msg: err.Error()}
	}
	x, file, err := readContext(c.Context)
	if err != nil {
		return fail(err)
	}
	where := func(field string) origin {
		return origin{path: join(path, "context"), field: field, context: c.Context, file: file}
	}
	refuse := func(field, why string) (Conn, error) {
		return fail(fmt.Errorf("nats CLI context %q (%s) sets %s, which the bridge does not support: %s", c.Context, file, field, why))
	}
	switch {
	case x.JSDomain != "" || x.JSAPIPrefix != "":
		return refuse("jetstream_domain or jetstream_api_prefix", "the bridge uses the JetStream API of the account it connects to; use a context without them (or set the bridge's keys instead of nats.context)")
	case x.SocksProxy != "":
		return refuse("socks_proxy", "connect without a proxy")
	case x.NSCLookup != "":
		return refuse("nsc", "export the user's credentials (`nsc generate creds`) and set creds in the context, or the bridge's creds key")
	case x.WinCertStoreType != "" || len(x.WinCertStoreCA) > 0:
		return refuse("windows_cert_store", "put the certificate and key in PEM files (cert, key, ca)")
	}
	if r.URL == "" {
		r.URL = x.URL
		if r.URL == "" {
			r.URL = nats.DefaultURL // as the nats CLI
		}
		r.from["url"] = where("url")
	}
	hasCreds := false
	for _, k := range credKeys {
		_, set := r.from[k]
		hasCreds = hasCreds || set
	}
	if !hasCreds {
		set := func(key, field, v string) {
			if v != "" {
				r.from[key] = where(field)
			}
		}
		if r.Creds, err = orPath("creds", x.Creds); err != nil {
			return fail(err)
		}
		set("creds", "creds", r.Creds)
		if r.NKeySeedFile, err = orPath("nkey", x.NKey); err != nil {
			return fail(err)
		}
		set("nkey_seed_file", "nkey", r.NKeySeedFile)
		r.User = x.User
		set("user", "user", r.User)
		for _, l := range []struct {
			key, field string
			dst        *string
			ref        string
		}{{"password", "password", &r.Password, x.Password}, {"token", "token", &r.Token, x.Token},
			{"user_jwt", "user_jwt", &r.UserJWT, x.UserJWT}, {"user_seed", "user_seed", &r.UserSeed, x.UserSeed}} {
			if *l.dst, err = contextLiteral(l.field, l.ref); err != nil {
				return fail(fmt.Errorf("nats CLI context %q (%s): %w", c.Context, file, err))
			}
			set(l.key, l.field, *l.dst)
		}
		if r.UserSeed != "" && r.UserJWT == "" {
			return fail(fmt.Errorf("nats CLI context %q (%s) sets user_seed without user_jwt", c.Context, file))
		}
	}
	if r.TLS.CAFile == "" && !r.TLS.InsecureSkipVerify && x.CA != "" {
		if r.TLS.CAFile, err = contextPath("ca", x.CA); err != nil {
			return fail(fmt.Errorf("nats CLI context %q (%s): %w", c.Context, file, err))
		}
		r.from["tls.ca_file"] = where("ca")
	}
	if r.TLS.CertFile == "" && x.Cert != "" && x.Key != "" {
		if r.TLS.CertFile, err = contextPath("cert", x.Cert); err == nil {
			r.TLS.KeyFile, err = contextPath("key", x.Key)
		}
		if err != nil {
			return fail(fmt.Errorf("nats CLI context %q (%s): %w", c.Context, file, err))
		}
		r.from["tls.cert_file"], r.from["tls.key_file"] = where("cert"), where("key")
	}
	if !r.TLS.HandshakeFirst && x.TLSFirst {
		r.TLS.HandshakeFirst = true
		r.from["tls.handshake_first"] = where("tls_first")
	}
	r.InboxPrefix = x.InboxPrefix
	return r, nil
}

// orPath is contextPath for a value that may be empty.
func orPath(field, ref string) (string, error) {
	if ref == "" {
		return "", nil
	}
	return contextPath(field, ref)
}

// join returns the YAML path of key in the section at path ("" for a
// plugin block's own, relative paths).
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Inherit returns c, a sink's own setting, completed by base, the bridge's:
// base's URL, and base's credentials, TLS and inbox prefix where c sets
// none of them. For a sink whose url and context are empty.
func (c Conn) Inherit(base Conn) Conn {
	out := c
	out.from = map[string]origin{}
	for k, v := range c.from {
		out.from[k] = v
	}
	copyFrom := func(keys ...string) {
		for _, k := range keys {
			delete(out.from, k)
			if v, ok := base.from[k]; ok {
				out.from[k] = v
			}
		}
	}
	out.URL = base.URL
	copyFrom("url")
	if !c.hasCreds() {
		out.Creds, out.NKeySeedFile, out.User, out.Password, out.Token = base.Creds, base.NKeySeedFile, base.User, base.Password, base.Token
		out.UserJWT, out.UserSeed = base.UserJWT, base.UserSeed
		copyFrom(credKeys...)
	}
	if !c.TLS.Enabled() {
		out.TLS = base.TLS
		copyFrom("tls.ca_file", "tls.cert_file", "tls.key_file", "tls.server_name", "tls.handshake_first", "tls.insecure_skip_verify")
	}
	if c.InboxPrefix == "" {
		out.InboxPrefix = base.InboxPrefix
	}
	return out
}

func (c Conn) hasCreds() bool {
	return c.Creds != "" || c.NKeySeedFile != "" || c.User != "" || c.Password != "" || c.Token != "" || c.UserJWT != ""
}

// Key returns where key ("tls.ca_file") was set, for messages: its YAML
// path, or the context field that gave it; when unset, its path in c's
// section ("nats.<key>" for a Conn built in code).
func (c Conn) Key(key string) string {
	if o, ok := c.from[key]; ok {
		return o.name()
	}
	if c.path == "" {
		return "nats." + key
	}
	return join(c.path, key)
}

// Env returns ne, the bridge's NATS setting a sink receives, resolved.
// Its problems are reported by the runtime at the nats section's paths;
// here they leave the setting as bridge.yaml gives it.
func Env(ne sinks.NATSEnv) Conn {
	c, err := Resolve("nats", ne.URL, ne.NATSClient)
	if err != nil {
		c, _ = Resolve("nats", ne.URL, config.NATSClient{Creds: ne.Creds, NKeySeedFile: ne.NKeySeedFile, User: ne.User, Password: ne.Password, Token: ne.Token, TLS: ne.TLS,
			PingInterval: ne.PingInterval, MaxPingsOutstanding: ne.MaxPingsOutstanding})
	}
	return c
}

// ForSink returns the connection of a NATS sink: its own url and keys
// (the block at path, e.g. "sinks.main.config"), completed by the bridge's
// env (Inherit) when its url and context are empty; url defaults to
// nats.DefaultURL. Its ping keys, when it sets none, are the bridge's
// whatever its url.
func ForSink(path, url string, own config.NATSClient, env sinks.NATSEnv) (Conn, error) {
	c, err := Resolve(path, url, own)
	if err != nil {
		return Conn{}, err
	}
	if url == "" && own.Context == "" {
		c = c.Inherit(Env(env))
	}
	if c.PingInterval == 0 {
		c.PingInterval = env.PingInterval
	}
	if c.MaxPingsOut == 0 {
		c.MaxPingsOut = env.MaxPingsOutstanding
	}
	if c.URL == "" {
		c.URL = nats.DefaultURL
	}
	return c, nil
}

// Options returns the nats.go options of c's credentials, TLS, inbox
// prefix and pings (config's defaults where c sets none). Files are
// named, not read: nats.go reads the creds file, the CA and the client
// certificate at each (re)connect, so renewed files apply without a
// restart; the nkey seed file is read when the server asks for a
// signature. An error means a file Check would refuse.
func (c Conn) Options() ([]nats.Option, error) {
	ping, pings := c.Pings()
	o := []nats.Option{nats.PingInterval(ping), nats.MaxPingsOutstanding(pings)}
	switch {
	case c.Creds != "":
		o = append(o, nats.UserCredentials(c.Creds))
	case c.UserJWT != "":
		o = append(o, nats.UserJWTAndSeed(c.UserJWT, c.UserSeed))
	case c.NKeySeedFile != "":
		kp, err := readSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", c.Key("nkey_seed_file"), c.NKeySeedFile, err)
		}
		pub, err := kp.PublicKey()
		kp.Wipe()
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", c.Key("nkey_seed_file"), c.NKeySeedFile, err)
		}
		file := c.NKeySeedFile
		o = append(o, nats.Nkey(pub, func(nonce []byte) ([]byte, error) {
			kp, err := readSeed(file)
			if err != nil {
				return nil, err
			}
			defer kp.Wipe()
			return kp.Sign(nonce)
		}))
	}
	if c.User != "" {
		o = append(o, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		o = append(o, nats.Token(c.Token))
	}
	if t := c.TLS; t.Enabled() {
		// Secure first: RootCAs and ClientCert fill the config it sets.
		o = append(o, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify})) //nolint:gosec // insecure_skip_verify is the user's explicit choice, warned about at start
		if t.CAFile != "" {
			o = append(o, nats.RootCAs(t.CAFile))
		}
		if t.CertFile != "" {
			o = append(o, nats.ClientCert(t.CertFile, t.KeyFile))
		}
		if t.HandshakeFirst {
			o = append(o, nats.TLSHandshakeFirst())
		}
	}
	if c.InboxPrefix != "" {
		o = append(o, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	return o, nil
}

// Pings returns c's ping interval and how many pings may be unanswered
// before the connection is taken as dead, with config's defaults applied.
func (c Conn) Pings() (time.Duration, int) {
	ping, pings := c.PingInterval, c.MaxPingsOut
	if ping <= 0 {
		ping = config.DefaultNATSPingInterval
	}
	if pings <= 0 {
		pings = config.DefaultNATSMaxPingsOutstanding
	}
	return ping, pings
}

// PingWindow is how long a healthy server has to answer a ping before
// the connection is taken as dead: ping interval × pings outstanding.
func (c Conn) PingWindow() time.Duration {
	ping, pings := c.Pings()
	return ping * time.Duration(pings)
}

// Warn logs, at WARN, what weakens c: insecure_skip_verify. Call it at
// every start.
func (c Conn) Warn(log *slog.Logger) {
	if c.TLS.InsecureSkipVerify {
		log.Warn("NATS TLS certificates are NOT verified: anyone between the bridge and NATS can read and change every change and checkpoint; set "+
			c.Key("tls.ca_file")+" to the servers' CA and remove "+c.Key("tls.insecure_skip_verify"),
			"key", c.Key("tls.insecure_skip_verify"), "url", config.Redact(c.URL))
	}
}

// readSeed reads an nkey seed from a file: the seed alone, or decorated
// as nsc writes it.
func readSeed(file string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, errors.New("no nkey seed in the file (want a seed such as SUAM..., from `nk -gen user` or nsc)")
	}
	return kp, nil
}

// Same reports whether c and o connect the same way (same URL,
// credentials, TLS and inbox prefix), so that one connection serves both.
func (c Conn) Same(o Conn) bool {
	return c.URL == o.URL && c.Creds == o.Creds && c.NKeySeedFile == o.NKeySeedFile && c.User == o.User && c.Password == o.Password &&
		c.Token == o.Token && c.UserJWT == o.UserJWT && c.UserSeed == o.UserSeed && c.TLS == o.TLS && c.InboxPrefix == o.InboxPrefix
}

// sinkKeys are the keys of a NATS sink's block that say how it connects.
var sinkKeys = []string{"url", "context", "creds", "nkey_seed_file", "user", "password", "token", "tls", "ping_interval", "max_pings_outstanding"}

// SinkOf returns the connection of sink name of cfg, a NATS sink
// (nats_jetstream, nats_core), from the connection keys of its block
// alone, for the helper commands, which do not build sinks: its own url
// and keys, or the bridge's (ne) when its url and context are empty, as
// ForSink.
func SinkOf(cfg *config.Config, name string, ne sinks.NATSEnv) (Conn, error) {
	path := "sinks." + name + ".config"
	raw := map[string]any{}
	for _, k := range sinkKeys {
		if v, ok := cfg.Sinks[name].Config[k]; ok {
			raw[k] = v
		}
	}
	var keys struct {
		URL               string `koanf:"url"`
		config.NATSClient `koanf:",squash"`
	}
	if err := cfg.Decoder(path, raw)(&keys); err != nil {
		return Conn{}, err
	}
	return ForSink(path, keys.URL, keys.NATSClient, ne)
}
