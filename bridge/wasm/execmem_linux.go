package wasm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// execMemoryAllowed reports, as an error, whether this process may not
// make memory executable after writing it, which wazero's compiler does
// with the code it makes: it maps a page writable and makes it
// executable, as the compiler does. systemd's MemoryDenyWriteExecute and
// prctl(PR_SET_MDWE) refuse that (EPERM, or EACCES under some seccomp
// setups).
func execMemoryAllowed() error {
	b, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mapping a page: %w", err)
	}
	defer func() { _ = unix.Munmap(b) }()
	if err := unix.Mprotect(b, unix.PROT_READ|unix.PROT_EXEC); err != nil {
		return fmt.Errorf("making a written page executable: %w", err)
	}
	return nil
}
