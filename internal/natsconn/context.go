package natsconn

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// natsContext is the file of a nats CLI context
// ($XDG_CONFIG_HOME/nats/context/<name>.json), as natscli v0.5.0
// (github.com/nats-io/jsm.go/natscontext) writes it. The fields the bridge
// has no use for (description, color_scheme, the JetStream event prefix)
// are ignored; those it cannot honour are refused by contextConn.
type natsContext struct {
	URL      string `json:"url"`
	Token    string `json:"token"`
	User     string `json:"user"`
	Password string `json:"password"`
	Creds    string `json:"creds"`
	NKey     string `json:"nkey"`
	Cert     string `json:"cert"`
	Key      string `json:"key"`
	CA       string `json:"ca"`
	TLSFirst bool   `json:"tls_first"`
	// UserJWT and UserSeed are credentials in the file itself (or env://).
	UserJWT     string `json:"user_jwt"`
	UserSeed    string `json:"user_seed"`
	InboxPrefix string `json:"inbox_prefix"`

	// Refused: the bridge cannot honour them, and ignoring them would
	// connect otherwise than the context says.
	NSCLookup        string   `json:"nsc"`
	SocksProxy       string   `json:"socks_proxy"`
	JSDomain         string   `json:"jetstream_domain"`
	JSAPIPrefix      string   `json:"jetstream_api_prefix"`
	WinCertStoreType string   `json:"windows_cert_store"`
	WinCertStoreCA   []string `json:"windows_ca_certs_match"`
}

// contextFile returns the file of the nats CLI context name: name itself
// when it ends in .json, else <name>.json in the nats CLI's context
// directory ($XDG_CONFIG_HOME/nats/context, by default
// ~/.config/nats/context).
func contextFile(name string) (string, error) {
	if strings.HasSuffix(name, ".json") {
		return expandHome(name), nil
	}
	root := os.Getenv("XDG_CONFIG_HOME")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the nats CLI's context directory: %w (set XDG_CONFIG_HOME, or give the path of the context's .json file)", err)
		}
		root = filepath.Join(home, ".config")
	}
	return filepath.Join(root, "nats", "context", name+".json"), nil
}

// readContext reads the nats CLI context name and returns it with its file.
func readContext(name string) (*natsContext, string, error) {
	file, err := contextFile(name)
	if err != nil {
		return nil, "", err
	}
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(name, ".json") {
		return nil, file, fmt.Errorf("%s does not exist (want a nats CLI context file, as `nats context save` writes them in ~/.config/nats/context)", file)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, file, fmt.Errorf("no nats CLI context %q: %s does not exist (`nats context ls` lists the contexts; `nats context save %s --server ...` creates one)", name, file, name)
	}
	if err != nil {
		return nil, file, fmt.Errorf("reading nats CLI context %q: %w", name, err)
	}
	var c natsContext
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&c); err != nil {
		return nil, file, fmt.Errorf("reading nats CLI context %q: %s is not a context's JSON: %v", name, file, err)
	}
	// As the nats CLI does: ~ and $VAR in the paths.
	c.Creds, c.NKey = expandHome(c.Creds), expandHome(c.NKey)
	c.Cert, c.Key, c.CA = expandHome(c.Cert), expandHome(c.Key), expandHome(c.CA)
	return &c, file, nil
}

// expandHome expands $VAR and a leading ~ in a path, as the nats CLI does.
func expandHome(p string) string {
	p = os.ExpandEnv(p)
	if p == "~" || strings.HasPrefix(p, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			p = home + p[1:]
		}
	}
	return p
}

// scheme returns the URI scheme of a context value ("file", "env", "op",
// "nsc", "data"), or "" for a bare path or literal (a Windows drive letter
// is no scheme).
func scheme(ref string) string {
	u, err := url.Parse(ref)
	if err != nil || len(u.Scheme) < 2 {
		return ""
	}
	return strings.ToLower(u.Scheme)
}

// contextPath returns the file a context's creds, nkey, cert, key or ca
// value names: a bare path or a file:// URI. Other schemes (op://, nsc://,
// data:, env://) need tools the bridge does not run.
func contextPath(field, ref string) (string, error) {
	switch scheme(ref) {
	case "":
		return ref, nil
	case "file":
		return expandHome(ref[len("file://"):]), nil
	}
	return "", fmt.Errorf("%s %q uses the %s: scheme, which the bridge does not resolve: use a file path in the context (or set the bridge's own key instead)", field, redactRef(ref), scheme(ref))
}

// contextLiteral returns a context's password, token, user_jwt or
// user_seed: the value itself, or the variable an env:// URI names.
func contextLiteral(field, ref string) (string, error) {
	switch scheme(ref) {
	case "env":
		name := ref[len("env://"):]
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			return "", fmt.Errorf("%s names environment variable %s (env://), which is not set", field, name)
		}
		return v, nil
	case "file":
		p := expandHome(ref[len("file://"):])
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", field, err)
		}
		return strings.TrimSpace(string(b)), nil
	case "op", "nsc", "data":
		return "", fmt.Errorf("%s uses the %s: scheme, which the bridge does not resolve: put the value in a file (file://) or a variable (env://)", field, scheme(ref))
	}
	return ref, nil
}

// redactRef keeps a reference's scheme and hides the rest, which may be a
// secret's location.
func redactRef(ref string) string {
	if s := scheme(ref); s != "" {
		return s + "://…"
	}
	return ref
}
