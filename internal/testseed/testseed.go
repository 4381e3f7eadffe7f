// Package testseed gives randomized tests a seed they log, so that a
// failure can be replayed.
package testseed

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Seed returns the seed of a randomized test: the value of the
// environment variable name when set (to replay a failure), else a new
// one. It logs the seed and how to replay it; a malformed value fails the
// test.
func Seed(t testing.TB, name string) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(name); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, name, seed)
	return seed
}
