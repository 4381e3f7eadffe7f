package natskv

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
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
	// Bucket is the JetStream KV bucket that mirrors the rows. Required.
	// The bridge must be its only writer (docs/kv-mirror.md).
	Bucket string `koanf:"bucket"`
	// KeyPrefix, when set, starts every key: "<key_prefix>.<schema>.<table>.<key>".
	// Dot-separated tokens of [A-Za-z0-9_-]. Default "" (keys start with
	// the schema). Give each source its own prefix or bucket.
	KeyPrefix string `koanf:"key_prefix"`
	// Delete is how a deleted row leaves the bucket: "delete" (a KV delete
	// marker; older revisions stay as history allows) or "purge" (a KV
	// purge marker that also removes the row's older revisions). Either
	// marker carries the delete's payload and headers. Default "delete".
	Delete string `koanf:"delete"`
	// CreateBucket makes Connect create the bucket (file storage) or update
	// it to History and Replicas (and to allow the direct gets, rollups and
	// purges the sink uses). Default true. With false the bucket must exist
	// already.
	CreateBucket bool `koanf:"create_bucket"`
	// History is how many values the bucket keeps per key (1-64), when the
	// bridge creates or updates it. Default 1.
	History int `koanf:"history"`
	// Replicas of the bucket when the bridge creates or updates it (1-5).
	// Default 1; use 3 on a cluster.
	Replicas int `koanf:"replicas"`
	// AckTimeout is how long a write waits for the server's ack (and a
	// read of the keys' current values for its answer) before it fails and
	// is retried, a duration. Default 10s.
	AckTimeout time.Duration `koanf:"ack_timeout"`
}

// DefaultConfig returns the defaults. URL and credentials default to the
// bridge's nats section; New fills them in.
func DefaultConfig() Config {
	return Config{
		Delete:       DeleteMarker,
		CreateBucket: true,
		History:      1,
		Replicas:     1,
		AckTimeout:   10 * time.Second,
	}
}

// The values of Config.Delete.
const (
	DeleteMarker = "delete"
	DeletePurge  = "purge"
)

var (
	bucketName  = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	prefixToken = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
)

// Validate reports every invalid field at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	switch {
	case c.Bucket == "":
		errs = append(errs, config.Field("bucket", "must be set"))
	case !bucketName.MatchString(c.Bucket):
		errs = append(errs, config.Field("bucket", "%q is not a valid bucket name: only letters, digits, '_' and '-'", c.Bucket))
	}
	if c.KeyPrefix != "" {
		for t := range strings.SplitSeq(c.KeyPrefix, ".") {
			if !prefixToken.MatchString(t) {
				errs = append(errs, config.Field("key_prefix", "%q is not a valid key prefix: dot-separated tokens of letters, digits, '_' and '-'", c.KeyPrefix))
				break
			}
		}
	}
	if c.Delete != DeleteMarker && c.Delete != DeletePurge {
		errs = append(errs, config.Field("delete", "must be %q or %q, got %q", DeleteMarker, DeletePurge, c.Delete))
	}
	if c.History < 1 || c.History > 64 {
		errs = append(errs, config.Field("history", "must be between 1 and 64, got %d", c.History))
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, config.Field("replicas", "must be between 1 and 5, got %d", c.Replicas))
	}
	if c.AckTimeout <= 0 {
		errs = append(errs, config.Field("ack_timeout", "must be > 0, got %s", c.AckTimeout))
	}
	if c.Password != "" && c.User == "" {
		errs = append(errs, config.Field("user", "must be set when password is"))
	}
	errs = append(errs, config.CheckNATSClient(c.NATSClient)...)
	errs = append(errs, natsconn.Check("", c.URL, c.NATSClient, time.Now())...)
	return errors.Join(errs...)
}

// stream is the name of the bucket's stream.
func (c *Config) stream() string { return "KV_" + c.Bucket }

// subject is the stream subject of key.
func (c *Config) subject(key string) string { return fmt.Sprintf("$KV.%s.%s", c.Bucket, key) }
