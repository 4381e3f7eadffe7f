package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWrites: writers and a reader at once (run with -race);
// every write is kept whole.
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("line\n"))
			}
		}()
	}
	for range 50 {
		_ = b.String()
	}
	wg.Wait()
	if n := strings.Count(b.String(), "line\n"); n != 400 {
		t.Fatalf("got %d lines, want 400", n)
	}
}
