package natscore

import (
	"errors"
	"time"

	"github.com/bridgecdc/bridge/config"
)

// Config is the sink's `config:` block.
type Config struct {
	// URL is a comma-separated list of NATS server URLs. Default: the
	// bridge's nats.url (or the embedded server). When URL is empty, the
	// bridge's nats credentials are used too; when it is set, only the
	// credentials given here are sent to it.
	URL string `koanf:"url"`
	// Creds is the path of a .creds file. Optional.
	Creds string `koanf:"creds"`
	// User and Password for user/password authentication. Optional; never logged.
	User     string `koanf:"user"`
	Password string `koanf:"password"`
	// Token for token authentication. Optional; never logged.
	Token string `koanf:"token"`
	// FlushTimeout bounds the flush that ends every Write (and a write to a
	// server that stopped reading), a duration. Default 5s.
	FlushTimeout time.Duration `koanf:"flush_timeout"`
}

// DefaultConfig returns the defaults. URL and credentials default to the
// bridge's nats section; New fills them in.
func DefaultConfig() Config {
	return Config{FlushTimeout: 5 * time.Second}
}

// Validate reports every invalid field at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	if c.FlushTimeout <= 0 {
		errs = append(errs, config.Field("flush_timeout", "must be > 0, got %s", c.FlushTimeout))
	}
	if c.Password != "" && c.User == "" {
		errs = append(errs, config.Field("user", "must be set when password is"))
	}
	return errors.Join(errs...)
}
