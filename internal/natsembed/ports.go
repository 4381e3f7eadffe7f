package natsembed

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Restart starts a server again with o, a stopped server's Options (same
// port, same store), retrying for up to wait while it cannot: right after
// Shutdown the port may still be held for a moment. The error of the last
// try names what holds the port, when Linux's /proc shows it.
func Restart(o Options, wait time.Duration) (*Server, error) {
	deadline := time.Now().Add(wait)
	for {
		s, err := Start(o)
		if err == nil || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tcpStates names the states of Linux's /proc/net/tcp.
var tcpStates = map[string]string{
	"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
	"05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
	"09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}

// portHolders describes the sockets whose local port is port, from Linux's
// /proc/net/tcp and tcp6: state, remote end and, where /proc shows it, the
// owning process. It returns "" when it finds none or cannot read /proc.
func portHolders(port int) string {
	want := fmt.Sprintf(":%04X", port)
	var found []string
	inodes := map[string]int{} // socket inode -> index in found
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !strings.HasSuffix(fs[1], want) {
				continue
			}
			st := tcpStates[fs[3]]
			if st == "" {
				st = "state " + fs[3]
			}
			desc := st
			if st != "LISTEN" {
				desc += " to " + hexAddr(fs[2])
			}
			if fs[9] != "0" {
				inodes["socket:["+fs[9]+"]"] = len(found)
			}
			found = append(found, desc)
		}
		_ = fh.Close()
	}
	if len(found) == 0 {
		return ""
	}
	if len(inodes) > 0 { // which processes hold those sockets
		procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
		for _, fd := range procs {
			link, err := os.Readlink(fd)
			if err != nil {
				continue
			}
			if i, ok := inodes[link]; ok {
				pid := strings.Split(fd, "/")[2]
				comm, _ := os.ReadFile("/proc/" + pid + "/comm")
				found[i] += fmt.Sprintf(" (pid %s %s)", pid, strings.TrimSpace(string(comm)))
				delete(inodes, link)
			}
		}
	}
	return strings.Join(found, "; ")
}

// hexAddr turns /proc/net/tcp's "0100007F:1068" into "127.0.0.1:4200";
// IPv6 addresses are left in hex with the decoded port.
func hexAddr(s string) string {
	host, p, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return s
	}
	if len(host) == 8 {
		if v, err := strconv.ParseUint(host, 16, 32); err == nil { // little-endian
			host = fmt.Sprintf("%d.%d.%d.%d", v&0xff, v>>8&0xff, v>>16&0xff, v>>24)
		}
	}
	return host + ":" + strconv.FormatUint(port, 10)
}
