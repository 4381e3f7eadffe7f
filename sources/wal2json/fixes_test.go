package wal2json

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/sources"
)

// TestByteaFixWorks: the fix printed for a database whose bytea_output is
// escape is SQL that, run as printed, lets the source start.
func TestByteaFixWorks(t *testing.T) {
	pg := server(t)
	pg.ExecT(t, `CREATE DATABASE escdb`, `ALTER DATABASE escdb SET bytea_output = 'escape'`)
	block := map[string]any{"dsn": pg.DSN("escdb"), "slot": "s_escdb"}
	err := openErr(t, newSource(t, "x", block))
	var se *sources.SetupError
	require.True(t, errors.As(err, &se), "%v", err)
	require.Equal(t, `bytea_output is "escape"; the wal2json source needs 'hex'`, se.What)
	require.Contains(t, se.Fix, `ALTER DATABASE "escdb" SET bytea_output = 'hex';`)
	pg.ExecT(t, `ALTER DATABASE "escdb" SET bytea_output = 'hex';`)
	require.NoError(t, openErr(t, newSource(t, "x", block)))
}
