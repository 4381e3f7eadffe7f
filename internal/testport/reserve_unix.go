//go:build unix

package testport

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// reserve claims port among the test processes of this machine with an
// exclusive lock on a file of the temp dir. It returns false when another
// process holds the claim. release gives it up; a process that exits
// gives up its claims with it.
func reserve(port int) (release func(), ok bool) {
	dir := filepath.Join(os.TempDir(), "bridge-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return func() {}, true // no claims possible: fall back to the bind check alone
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return func() {}, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false
		}
		return func() {}, true
	}
	return func() { _ = f.Close() }, true
}
