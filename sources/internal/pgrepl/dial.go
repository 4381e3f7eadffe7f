package pgrepl

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/bridgecdc/bridge/internal/pgnet"
)

// connConfig parses the source's DSN for a regular connection named
// appName (application_name), with libpq's TCP parameters applied by the
// bridge (internal/pgnet: keepalives and TCP_USER_TIMEOUT, the bridge's
// defaults where the DSN sets none), as for every connection of the
// source.
func (s *Source) connConfig(appName string) (*pgx.ConnConfig, error) {
	c, err := pgx.ParseConfig(s.cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("parsing dsn of source %q: %w", s.name, err)
	}
	if err := pgnet.Apply(&c.Config); err != nil {
		return nil, fmt.Errorf("dsn of source %q: %w", s.name, err)
	}
	c.RuntimeParams["application_name"] = appName
	return c, nil
}

// replConfig is connConfig for a replication connection (replication =
// database).
func (s *Source) replConfig(appName string) (*pgconn.Config, error) {
	c, err := pgconn.ParseConfig(s.cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("parsing dsn of source %q: %w", s.name, err)
	}
	if err := pgnet.Apply(c); err != nil {
		return nil, fmt.Errorf("dsn of source %q: %w", s.name, err)
	}
	c.RuntimeParams["replication"] = "database"
	c.RuntimeParams["application_name"] = appName
	return c, nil
}
