package pluginsink

import (
	"encoding/hex"
	"errors"
	"time"

	"github.com/bridgecdc/bridge/config"
)

// Config is the `config:` block of a sink of type plugin.
type Config struct {
	// Command is the plugin's executable: a path. Required.
	Command string `koanf:"command"`
	// SHA256 is the executable's sha256, 64 hex digits (`sha256sum`).
	// Required: the bridge refuses to start a plugin whose file differs.
	SHA256 string `koanf:"sha256"`
	// Args are the executable's arguments. Optional.
	Args []string `koanf:"args"`
	// Env is the plugin's environment beyond the few variables it gets
	// from the bridge's (PATH, HOME, USER, LOGNAME, LANG, LC_ALL, LC_CTYPE,
	// TZ, TMPDIR): nothing else of the bridge's environment, which holds its
	// secrets, is handed to the plugin; pass what it needs here, e.g.
	// TOKEN: "${TOKEN}". (The plugin runs as the bridge's OS user, so it can
	// still read what that user can: it is trusted code.) Optional; values
	// are never logged.
	Env map[string]string `koanf:"env"`
	// Config is the plugin's own block, handed to it as JSON (Configure);
	// the plugin checks it. Optional.
	Config map[string]any `koanf:"config"`
	// StartTimeout bounds the start of the process up to its handshake, a
	// duration. Default 10s.
	StartTimeout time.Duration `koanf:"start_timeout"`
	// WriteTimeout bounds each Write, with the Delivered question before
	// it: a plugin that has not answered by then is taken for hung,
	// stopped and started again (it counts as a crash), and the batch is
	// written again once it runs, after asking what it holds. Default 1m.
	WriteTimeout time.Duration `koanf:"write_timeout"`
	// RestartInitial and RestartMax shape the backoff between restarts
	// after a crash: the first restart waits RestartInitial (default
	// 250ms), each next one twice as long up to RestartMax (default 10s),
	// with jitter.
	RestartInitial time.Duration `koanf:"restart_initial"`
	RestartMax     time.Duration `koanf:"restart_max"`
	// MaxCrashes is how many times in a row the plugin may crash (exit,
	// or stop answering) without one successful Write between, before the
	// sink fails permanently and the bridge stops naming it. Default 5.
	MaxCrashes int `koanf:"max_crashes"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{StartTimeout: 10 * time.Second, WriteTimeout: time.Minute, RestartInitial: 250 * time.Millisecond, RestartMax: 10 * time.Second, MaxCrashes: 5}
}

// Validate reports every invalid field, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	if c.Command == "" {
		errs = append(errs, config.Field("command", "must be set: the path of the plugin's executable"))
	}
	if b, err := hex.DecodeString(c.SHA256); err != nil || len(b) != 32 {
		errs = append(errs, config.Field("sha256", "must be the executable's sha256 in 64 hex digits (sha256sum %s)", c.Command))
	}
	if c.StartTimeout <= 0 {
		errs = append(errs, config.Field("start_timeout", "must be > 0, got %s", c.StartTimeout))
	}
	if c.WriteTimeout <= 0 {
		errs = append(errs, config.Field("write_timeout", "must be > 0, got %s", c.WriteTimeout))
	}
	if c.RestartInitial <= 0 {
		errs = append(errs, config.Field("restart_initial", "must be > 0, got %s", c.RestartInitial))
	}
	if c.RestartMax < c.RestartInitial {
		errs = append(errs, config.Field("restart_max", "must be ≥ restart_initial (%s), got %s", c.RestartInitial, c.RestartMax))
	}
	if c.MaxCrashes < 1 {
		errs = append(errs, config.Field("max_crashes", "must be ≥ 1, got %d", c.MaxCrashes))
	}
	return errors.Join(errs...)
}
