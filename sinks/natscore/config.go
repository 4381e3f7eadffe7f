package natscore

import (
	"errors"
	"time"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsconn"
)

// Config is the sink's `config:` block.
type Config struct {
	// URL is a comma-separated list of NATS server URLs. Default: the
	// bridge's nats.url (or the embedded server, or nats.context's). With
	// url and context empty, the bridge's credentials and tls apply too,
	// each unless this block sets its own; with url or context set, only
	// the keys given here are used.
	URL string `koanf:"url"`
	// NATSClient holds context, creds, nkey_seed_file, user, password,
	// token and tls, as in the nats section.
	config.NATSClient `koanf:",squash"`
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
	errs = append(errs, config.CheckNATSClient(c.NATSClient)...)
	errs = append(errs, natsconn.Check("", c.URL, c.NATSClient, time.Now())...)
	return errors.Join(errs...)
}
