package cli

import "testing"

// TestProcsFor: `bridge run` takes one P only on a machine of two CPUs,
// not when the environment sets GOMAXPROCS, nor with NATS in the process,
// nor with more CPUs to use.
func TestProcsFor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		envSet   bool
		cpus     int
		embedded bool
		want     int
	}{
		{"two CPUs", false, 2, false, 1},
		{"GOMAXPROCS set", true, 2, false, 0},
		{"embedded NATS", false, 2, true, 0},
		{"four CPUs", false, 4, false, 0},
		{"one CPU already", false, 1, false, 0},
	} {
		if got := procsFor(tc.envSet, tc.cpus, tc.embedded); got != tc.want {
			t.Errorf("%s: procsFor(%v, %d, %v) = %d, want %d", tc.name, tc.envSet, tc.cpus, tc.embedded, got, tc.want)
		}
	}
}
