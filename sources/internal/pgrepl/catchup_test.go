package pgrepl

import (
	"strings"
	"testing"
	"time"
)

func TestCatchUpWait(t *testing.T) {
	const d = 200 * time.Microsecond
	for _, c := range []struct {
		name     string
		delay    time.Duration
		lag      time.Duration
		buffered int
		want     time.Duration
	}{
		{"backlog, buffer empty: waits", d, 5 * time.Second, 0, d},
		{"backlog, bytes still buffered: reads them", d, 5 * time.Second, 120, 0},
		{"live: reads at once", d, 300 * time.Microsecond, 0, 0},
		{"just at the age: live", d, catchUpAge, 0, 0},
		{"just past the age: catching up", d, catchUpAge + time.Millisecond, 0, d},
		{"nothing decoded yet", d, 0, 0, 0},
		{"handed over before its commit time was known", d, time.Since(time.Time{}), 0, d},
		{"clock of the database ahead: live", d, -time.Second, 0, 0},
		{"off", 0, 5 * time.Second, 0, 0},
	} {
		if got := catchUpWait(c.delay, c.lag, c.buffered); got != c.want {
			t.Errorf("%s: catchUpWait = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestCatchUpReadDelayValidated(t *testing.T) {
	for _, c := range []struct {
		delay time.Duration
		err   string
	}{
		{0, ""},
		{DefaultCatchUpReadDelay, ""},
		{10 * time.Millisecond, ""},
		{11 * time.Millisecond, "catch_up_read_delay: must be between 0 (off) and 10ms, got 11ms"},
		{-time.Microsecond, "catch_up_read_delay: must be between 0 (off) and 10ms, got -1µs"},
	} {
		cfg := DefaultConfig("x")
		cfg.DSN = "postgres://localhost/db"
		cfg.CatchUpReadDelay = c.delay
		err := cfg.Validate()
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: unexpected error %v", c.delay, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one containing %q", c.delay, err, c.err)
		}
	}
}
