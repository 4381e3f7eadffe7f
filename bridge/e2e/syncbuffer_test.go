package e2e_test

import (
	"bytes"
	"sync"
)

// syncBuffer is a bytes.Buffer safe to read while other goroutines (a
// child process's output copier, a logger) write to it. Every buffer a
// test reads while something may still write to it must be one: the race
// detector fails every test running at that moment, not only the culprit.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
