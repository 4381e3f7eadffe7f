package pipeline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfirmerDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &confirmer{delay: 10 * time.Second}
	c.add(100, t0)
	c.add(200, t0.Add(5*time.Second))
	_, ok := c.due(t0.Add(9 * time.Second))
	require.False(t, ok, "nothing is 10s old yet")
	lsn, ok := c.due(t0.Add(12 * time.Second))
	require.True(t, ok)
	require.EqualValues(t, 100, lsn)
	lsn, ok = c.due(t0.Add(time.Minute))
	require.True(t, ok)
	require.EqualValues(t, 200, lsn)
	_, ok = c.due(t0.Add(time.Hour))
	require.False(t, ok)

	now := &confirmer{} // no delay: due at once
	now.add(300, t0)
	lsn, ok = now.due(t0)
	require.True(t, ok)
	require.EqualValues(t, 300, lsn)
}
