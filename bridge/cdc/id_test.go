package cdc

import "testing"

// TestIDDest checks that a destination makes a distinct id that ParseID
// reads back, and that an id without one keeps today's form.
func TestIDDest(t *testing.T) {
	for _, c := range []Change{
		{Producer: "b.src.e1", CommitLSN: 0x16_B374D848, Seq: 3},
		{Producer: "b.src.e1", CommitLSN: 0x16_B374D848, Seq: 3, Dest: "masked"},
		{Producer: "b.src.e1", CommitLSN: 0x16_B374D848, Seq: 3, Dest: "kv-mirror_2"},
		{Producer: "b.src.e1.snap-7", MsgID: "b.src.e1.snap-7:00000000DEADBEEF:42", Dest: "full"},
	} {
		id := c.ID()
		prod, pos, err := ParseID(id)
		if err != nil {
			t.Fatalf("ParseID(%q): %v", id, err)
		}
		want := c.Pos()
		if c.MsgID != "" {
			want = Pos{LSN: 0xDEADBEEF, Seq: 42, Dest: c.Dest}
		}
		if prod != c.Producer || pos != want {
			t.Errorf("ParseID(%q) = %q, %+v; want %q, %+v", id, prod, pos, c.Producer, want)
		}
	}
	a := Change{Producer: "p", CommitLSN: 1, Seq: 0}
	b := a
	b.Dest = "masked"
	if a.ID() == b.ID() || a.Pos() == b.Pos() {
		t.Errorf("one change for two destinations has one identity: %q, %q", a.ID(), b.ID())
	}
	if want := "p:0000000000000001:0"; a.ID() != want {
		t.Errorf("ID without a destination = %q, want %q (unchanged form)", a.ID(), want)
	}
	if a.Pos().Less(b.Pos()) || b.Pos().Less(a.Pos()) {
		t.Errorf("positions of one change for two destinations are ordered")
	}
	if _, _, err := ParseID("p:0000000000000001:0@"); err == nil {
		t.Errorf("ParseID accepted an empty destination")
	}
}
