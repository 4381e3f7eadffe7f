package retry

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/internal/natsconn"
	"github.com/bridgecdc/bridge/sinks"
	"github.com/bridgecdc/bridge/sources"
)

// Permanent returns, for an error that retrying cannot cure, the fix to
// print with it ("" when the error carries its own, as a
// sources.SetupError does), and ok true. For an error that may go away by
// itself (a connection refused or lost, a timeout, a server shutting down
// or electing a leader) ok is false and the bridge retries with Backoff.
//
// This is the one place where the bridge decides; docs/operations.md
// ("Errors: which stop the bridge") is its table for users:
//
//   - marked by who knows: sources.SetupError (the database's setup),
//     sinks.Permanent (a sink's refusal), checkpoint.ErrFenced (another
//     instance owns the slot);
//   - a DSN that does not parse, or names certificate files that cannot be
//     read (Postgres TLS problems found when connecting are SetupErrors);
//   - Postgres refusing the role (28P01 wrong password, 28000 no pg_hba.conf
//     entry, 42501 no privilege), a database, table or object that does not
//     exist (3D000, 42P01, 42704), a server that cannot do logical decoding
//     (55000 wal_level, 0A000), an invalid name (42602);
//   - NATS refusing the credentials or a permission (authorization
//     violation, expired or revoked credentials, permissions violation),
//     and TLS failures (a server certificate that does not verify, a
//     client certificate refused): internal/natsconn explains them as a
//     *natsconn.Error with the key, the file and the fix;
//   - JetStream refusing the configuration: replicas on a server that is
//     not clustered, JetStream not enabled, a stream name or subjects
//     already used with another configuration, an invalid stream
//     configuration, account limits.
func Permanent(err error) (fix string, ok bool) {
	if err == nil {
		return "", false
	}
	var se *sources.SetupError
	if errors.As(err, &se) {
		return "", true
	}
	if sinks.IsPermanent(err) {
		return "", true
	}
	if errors.Is(err, checkpoint.ErrFenced) {
		return "another bridge instance has taken over the source (it saved the checkpoint since this one loaded it); this instance stops so that only one writes", true
	}
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		// Postgres TLS: the DSN names a certificate file that cannot be read.
		if msg := pce.Error(); strings.Contains(msg, "failed to configure TLS") && !strings.Contains(msg, "sslmode is invalid") {
			return "sslrootcert, sslcert and sslkey in the source's dsn must name PEM files the bridge can read (sslcert and sslkey together)", true
		}
		return "correct the dsn: a URL (postgres://user:pass@host:5432/db?sslmode=require) or key=value pairs (host=db port=5432 dbname=app)", true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if fix, ok := pgFixes[pgErr.Code]; ok {
			return fix, true
		}
		return "", false
	}
	var nce *natsconn.Error
	if errors.As(err, &nce) {
		return "", true // a NATS TLS, credentials or permission problem; it says the fix
	}
	var (
		unknownCA x509.UnknownAuthorityError
		badHost   x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return "check the NATS credentials (nats.creds, nats.nkey_seed_file, nats.user/password, nats.token, nats.context, or the sink's own)", true
	case errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return "renew the NATS credentials (nats.creds)", true
	case errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation"):
		return "grant the bridge's NATS user the permission named above (docs/security.md lists them: publish on the stream's subjects, its $JS.API subjects and $KV.<bucket>.>, subscribe to _INBOX.>)", true
	case errors.As(err, &unknownCA), errors.As(err, &badHost), errors.As(err, &invalid):
		// TLS problems the connection code did not explain: a certificate
		// that stays wrong until a file or a setting changes.
		return "the server's certificate cannot be verified: check the CA and server name the connection uses (nats.tls.ca_file and server_name, or the sink's own tls keys) and the certificate's validity", true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if fix, ok := jsFixes[apiErr.ErrorCode]; ok {
			return fix, true
		}
	}
	return "", false
}

// pgFixes are the SQLSTATEs retrying cannot cure, with their fix.
var pgFixes = map[string]string{
	"28P01": "password authentication failed: check the user and password in the source's dsn (or the variable it reads)",
	"28000": "the server refuses this user from this host: add a pg_hba.conf line for it (for the replication connection too), e.g. `host all,replication <user> <address>/32 scram-sha-256`, then SELECT pg_reload_conf()",
	"3D000": "the database does not exist: create it, or correct dbname in the source's dsn",
	"42501": "the role lacks a privilege: ALTER ROLE <user> WITH REPLICATION, and grant SELECT on the published tables (or use a role that owns them)",
	"42P01": "a table does not exist: create it, or remove it from the source's tables",
	"42704": "an object named in the configuration does not exist (publication, slot, type): create it, or correct the name",
	"42602": "a name is not valid (slot and publication names: lower-case letters, digits and underscores)",
	"55000": "the server cannot do logical decoding as configured (wal_level must be logical): ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL",
	"0A000": "the server does not support what the source asks (check the PostgreSQL version and the plugin, e.g. wal2json installed)",
}

// jsFixes are the JetStream API errors retrying cannot cure, with their fix.
var jsFixes = map[jetstream.ErrorCode]string{
	10074: "the NATS server is not clustered, so it cannot keep more than one replica: set replicas to 1 (checkpoint.replicas, the sink's replicas) or point nats.url at a cluster",
	10039: "JetStream is not enabled for this NATS account: enable it for the account",
	10076: "JetStream is not enabled on the NATS server: start nats-server with -js (or jetstream {} in its config)",
	10058: "a stream of that name exists with a different configuration: align the sink's settings with it, or use another stream name",
	10065: "the stream's subjects overlap another stream's: change the sink's subjects, or remove the other stream",
	10052: "the stream configuration is not valid (see the message): correct the sink's settings",
	10061: "a stream's replicas cannot be changed this way: set the sink's replicas to the stream's",
	10027: "the NATS account reached its maximum number of streams: raise the limit, or reuse a stream",
	10113: "the NATS account requires streams to have max_bytes: set the sink's max_bytes",
	10122: "the stream's max_bytes exceeds the account's limit: lower the sink's max_bytes or raise the limit",
	10010: "JetStream clustering is required for this setting: point nats.url at a cluster, or use replicas 1",
}

// Explain returns err with its fix appended when Permanent knows one, for
// the log line and the exit message of a bridge that stops.
func Explain(err error) error {
	fix, ok := Permanent(err)
	if !ok || fix == "" || strings.Contains(err.Error(), fix) {
		return err
	}
	return fmt.Errorf("%w; fix: %s", err, fix)
}
