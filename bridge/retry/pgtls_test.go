package retry

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPermanentPostgresTLSFiles: a DSN whose certificate file cannot be
// read (a secret unmounted after the start) stops the bridge with the fix
// about the files, not about the DSN's syntax.
func TestPermanentPostgresTLSFiles(t *testing.T) {
	_, err := pgconn.ParseConfig("postgres://u@127.0.0.1/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.crt")
	require.Error(t, err)
	fix, ok := Permanent(fmt.Errorf("opening source: %w", err))
	assert.True(t, ok)
	assert.Contains(t, fix, "sslrootcert, sslcert and sslkey in the source's dsn must name PEM files")

	_, err = pgconn.ParseConfig("postgres://u@127.0.0.1/db?sslmode=bogus")
	require.Error(t, err)
	fix, ok = Permanent(err)
	assert.True(t, ok)
	assert.Contains(t, fix, "correct the dsn")
}
