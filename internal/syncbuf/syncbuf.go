// Package syncbuf is a bytes.Buffer that goroutines may write while a
// test reads it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe to read while other goroutines (a child
// process's output copier, a logger) write to it. Every buffer a test
// reads while something may still write to it must be one: the race
// detector fails every test running at that moment, not only the
// culprit. The zero value is empty and ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
