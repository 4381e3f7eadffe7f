package pgtest

import (
	"context"
	"testing"
)

func TestStartAndQuery(t *testing.T) {
	s := StartT(t, Options{})
	c := s.Conn(t, "")
	var wl string
	if err := c.QueryRow(context.Background(), "show wal_level").Scan(&wl); err != nil {
		t.Fatal(err)
	}
	if wl != "logical" {
		t.Fatalf("wal_level = %q, want logical", wl)
	}
}
