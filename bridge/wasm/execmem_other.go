//go:build !linux

package wasm

// execMemoryAllowed: only Linux's MemoryDenyWriteExecute is checked for.
func execMemoryAllowed() error { return nil }
