package pgrepl

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
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

// TestLineageCheck: validate judges a failover as Open does, for each
// way the server's lineage can stand to the checkpoint's.
func TestLineageCheck(t *testing.T) {
	tl1 := sources.Lineage{SystemID: "7000", Timeline: 1}
	tl2 := sources.Lineage{SystemID: "7000", Timeline: 2}
	history := func() (map[uint32]cdc.LSN, error) { return map[uint32]cdc.LSN{1: 0x5000000}, nil }
	noHistory := func() (map[uint32]cdc.LSN, error) {
		t.Fatal("the history is read only when the timeline changed")
		return nil, nil
	}
	slot := SlotInfo{Exists: true, ConfirmedFlush: 0x4000000}
	s := &Source{name: "app", cfg: Config{Slot: "s"}}
	recreate := &Source{name: "app", cfg: Config{Slot: "s", OnSlotLost: SlotLostRecreate}}
	for _, tc := range []struct {
		name   string
		src    *Source
		req    sources.CheckRequest
		cur    sources.Lineage
		si     SlotInfo
		forks  func() (map[uint32]cdc.LSN, error)
		status config.CheckStatus // "" for no line
		want   []string
	}{
		{"no checkpoint", s, sources.CheckRequest{}, tl2, slot, noHistory, "", nil},
		{"checkpoint of an older version", s, sources.CheckRequest{From: 0x6000000}, tl2, slot, noHistory, "", nil},
		{"same timeline", s, sources.CheckRequest{From: 0x6000000, Lineage: tl1}, tl1, slot, noHistory, config.CheckOK,
			[]string{"the server is on timeline 1, the one the checkpoint was recorded on"}},
		{"failover before the checkpoint's end", s, sources.CheckRequest{From: 0x4800000, Lineage: tl1}, tl2, slot, history, config.CheckWarn,
			[]string{"a failover (or a point-in-time recovery) happened: the server is on timeline 2, the checkpoint was recorded on timeline 1, which its history left at 0/5000000",
				"the checkpoint (0/4800000) is at or before that point", "streams on if the sinks hold nothing past it"}},
		{"failover past the checkpoint", s, sources.CheckRequest{From: 0x6000000, Lineage: tl1}, tl2, slot, history, config.CheckFail,
			[]string{"which its history left at 0/5000000", "the stream holds changes up to 0/6000000, past that point", "`bridge run` stops here (on_slot_lost: fail)",
				"set on_slot_lost: recreate on source \"app\""}},
		{"failover past the checkpoint, recreate", recreate, sources.CheckRequest{From: 0x6000000, Lineage: tl1}, tl2, slot, history, config.CheckWarn,
			[]string{"past that point", "publishes a resync message"}},
		{"failover, slot missing", s, sources.CheckRequest{From: 0x6000000, Lineage: tl1}, tl2, SlotInfo{}, history, "", nil},
		{"promoted standby with its own slot", s, sources.CheckRequest{From: 0x6000000, Lineage: sources.Lineage{SystemID: "7000", Timeline: 1, Standby: true}}, tl2, slot, history, config.CheckOK,
			[]string{"the standby this source reads was promoted"}},
		{"another system", s, sources.CheckRequest{From: 0x6000000, Lineage: tl1}, sources.Lineage{SystemID: "9000", Timeline: 1}, slot, noHistory, config.CheckFail,
			[]string{"the server is another database system (system_identifier 9000; the checkpoint at 0/6000000 was recorded on 7000)", "if the DSN is wrong"}},
		{"another system, recreate", recreate, sources.CheckRequest{From: 0x6000000, Lineage: tl1}, sources.Lineage{SystemID: "9000", Timeline: 1}, slot, noHistory, config.CheckWarn,
			[]string{"another database system", "publishes a resync message", "if this cluster replaces the one the checkpoint was recorded on"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.src.lineageCheck(tc.req, tc.cur, tc.si, tc.forks)
			if tc.status == "" {
				require.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			require.Equal(t, tc.status, got[0].Status, got[0].What)
			for _, w := range tc.want {
				require.Contains(t, got[0].What+" | "+got[0].Fix, w)
			}
		})
	}
	fail := func() (map[uint32]cdc.LSN, error) { return nil, errors.New("boom") }
	got := s.lineageCheck(sources.CheckRequest{From: 1, Lineage: tl1}, tl2, slot, fail)
	require.Len(t, got, 1)
	require.Equal(t, config.CheckFail, got[0].Status)
	require.Contains(t, got[0].What, "reading the server's timeline history: boom")
}
