package pgrepl

import (
	"testing"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// TestParseHistory reads a timeline history file as TIMELINE_HISTORY
// returns it: each ancestor timeline with the position its successor
// forked off it.
func TestParseHistory(t *testing.T) {
	got, err := parseHistory([]byte("1\t0/3000158\tno recovery target specified\n\n2\t0/5000000\tat restore point \"x\"\n# comment\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]cdc.LSN{1: 0x3000158, 2: 0x5000000}
	if len(got) != len(want) || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := parseHistory([]byte("x\t0/1\n")); err == nil {
		t.Fatal("a bad timeline must be an error")
	}
}
