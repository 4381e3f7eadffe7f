//go:build !linux

package pgnet

// setUserTimeout does nothing: TCP_USER_TIMEOUT is Linux's.
func setUserTimeout(uintptr, int) error { return nil }
