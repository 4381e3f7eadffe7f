// Package testport hands out loopback ports to test servers that are
// stopped and started again on the same port (NATS and Postgres restarts).
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// from is the lowest port Claim hands out below the ephemeral range.
const from = 10000

// Claim returns a free loopback port that stays free while its server is
// down, until release is called:
//
//   - The port lies below the kernel's ephemeral range, so it never becomes
//     the local port of an outgoing connection. Such a connection blocks a
//     restart for as long as it lives: TestConformance/break_during_write
//     in sinks/natscore once waited 200 s on it.
//   - It is claimed with a lock file in the temp dir, so two test processes
//     (go test runs packages in parallel) never pick the same one while
//     both hold it: TestConformance/partial_failure lost its port that way.
//
// When the ephemeral range leaves no room below it, Claim falls back to a
// port the kernel picks, which only the bind check protects.
func Claim() (port int, release func(), err error) {
	if low := ephemeralLow(); low > from+1000 {
		for range 1000 {
			p := from + rand.IntN(low-from)
			release, ok := reserve(p)
			if !ok {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				release()
				continue
			}
			_ = l.Close()
			return p, release, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, fmt.Errorf("no free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, func() {}, nil
}

// ephemeralLow is the start of Linux's net.ipv4.ip_local_port_range.
func ephemeralLow() int {
	low := 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	return low
}
