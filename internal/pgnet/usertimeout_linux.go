package pgnet

import "golang.org/x/sys/unix"

// setUserTimeout sets TCP_USER_TIMEOUT on the socket fd, in milliseconds.
func setUserTimeout(fd uintptr, ms int) error {
	return unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
}
