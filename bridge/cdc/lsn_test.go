package cdc

import (
	"fmt"
	"testing"
)

func TestLSNString(t *testing.T) {
	for _, v := range []uint64{0, 1, 0xF, 0x10, 0x16_B374D848, 0xFFFFFFFF, 0x1_00000000, 0xABCDEF01_00000000, ^uint64(0)} {
		want := fmt.Sprintf("%X/%X", v>>32, uint32(v))
		if got := LSN(v).String(); got != want {
			t.Errorf("LSN(%#x).String() = %q, want %q", v, got, want)
		}
		if back, err := ParseLSN(want); err != nil || uint64(back) != v {
			t.Errorf("ParseLSN(%q) = %#x, %v", want, uint64(back), err)
		}
	}
}

func BenchmarkLSNString(b *testing.B) {
	b.ReportAllocs()
	for i := range b.N {
		_ = LSN(0x16_B374D848 + uint64(i)).String()
	}
}
