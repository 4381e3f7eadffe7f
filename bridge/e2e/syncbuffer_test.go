package e2e_test

import "github.com/bridgecdc/bridge/internal/syncbuf"

// syncBuffer is a bytes.Buffer safe to read while other goroutines (a
// child process's output copier, a logger) write to it (syncbuf.Buffer).
type syncBuffer = syncbuf.Buffer
