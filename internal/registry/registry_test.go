package registry

import (
	"strings"
	"testing"
)

func TestRegistry(t *testing.T) {
	r := New[int]("sink")
	if err := r.Register("b", 2); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("a", 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("a", 3); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("duplicate: got %v", err)
	}
	if err := r.Register("", 3); err == nil {
		t.Fatal("empty name accepted")
	}
	if v, err := r.Lookup("b"); err != nil || v != 2 {
		t.Fatalf("lookup b: %v %v", v, err)
	}
	_, err := r.Lookup("c")
	if err == nil || !strings.Contains(err.Error(), "compiled in: a, b") {
		t.Fatalf("unknown: got %v", err)
	}
	if got := strings.Join(r.Types(), ","); got != "a,b" {
		t.Fatalf("types: %s", got)
	}
}
