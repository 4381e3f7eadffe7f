package testport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClaimHoldsThePortAgainstOtherClaims(t *testing.T) {
	p, release, err := Claim()
	require.NoError(t, err)
	if ephemeralLow() > from+1000 {
		require.GreaterOrEqual(t, p, from)
		require.Less(t, p, ephemeralLow(), "below the ephemeral range")
		// A second claim, as another test process would make, is refused
		// while the first holds it (flock conflicts between open files).
		_, ok := reserve(p)
		require.False(t, ok, "port %d claimed twice", p)
	}
	// The port is free to bind: Claim closed its probe.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	require.NoError(t, err)
	require.NoError(t, l.Close())

	release()
	again, ok := reserve(p)
	require.True(t, ok, "released claims can be made again")
	again()
}

func TestClaimsDiffer(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		p, release, err := Claim()
		require.NoError(t, err)
		defer release()
		require.False(t, seen[p], "port %d handed out twice while claimed", p)
		seen[p] = true
	}
}
