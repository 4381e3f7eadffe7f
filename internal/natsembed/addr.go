package natsembed

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// AddrFile is the file, in the bridge's data_dir, where `bridge run` writes
// the address of its embedded server while it runs, so that the helper
// commands (status, serve, snapshot) find it whatever port it bound.
const AddrFile = "embedded-nats.json"

// addr is AddrFile's content.
type addr struct {
	URL      string `json:"url"`
	PID      int    `json:"pid"`
	StoreDir string `json:"store_dir"`
}

// WriteAddr records in dir/AddrFile that s serves, for Running to find.
// It returns a function that removes the file.
func WriteAddr(dir string, s *Server) (func(), error) {
	b, err := json.Marshal(addr{URL: s.URL(), PID: os.Getpid(), StoreDir: s.opts.StoreDir})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("recording the embedded server's address in %s: %w", dir, err)
	}
	p := filepath.Join(dir, AddrFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, fmt.Errorf("recording the embedded server's address: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return nil, fmt.Errorf("recording the embedded server's address: %w", err)
	}
	return func() { _ = os.Remove(p) }, nil
}

// ErrNotRunning is returned by Running when no embedded server answers.
var ErrNotRunning = errors.New("no embedded NATS server is running")

// Running returns the URL of the embedded server a bridge with data_dir dir
// runs: the address in dir/AddrFile, else fallback (the configured host and
// port), when something accepts connections there. It never starts a
// server.
func Running(dir, fallback string) (string, error) {
	var candidates []string
	if b, err := os.ReadFile(filepath.Join(dir, AddrFile)); err == nil {
		var a addr
		if json.Unmarshal(b, &a) == nil && a.URL != "" {
			candidates = append(candidates, a.URL)
		}
	}
	if fallback != "" {
		candidates = append(candidates, fallback)
	}
	for _, c := range candidates {
		u, err := url.Parse(c)
		if err != nil || u.Host == "" {
			continue
		}
		if conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second); err == nil {
			_ = conn.Close()
			return c, nil
		}
	}
	return "", ErrNotRunning
}
