// Package bench measures the bridge against the limits of the systems on
// either side of it: Postgres' own logical decoding rate (pg_recvlogical) and
// JetStream's own ingest rate (nats bench), on the same machine and workload.
// cmd/benchrun is the driver; scripts/bench.sh runs it.
package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

var (
	tickOnce sync.Once
	tick     = 100 // clock ticks per second (USER_HZ)
)

func clkTck() int {
	tickOnce.Do(func() {
		if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
			if v, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && v > 0 {
				tick = v
			}
		}
	})
	return tick
}

// CPU is the CPU time of a process from /proc/<pid>/stat.
type CPU struct {
	Self     time.Duration // utime + stime
	Children time.Duration // cutime + cstime: children it has waited for
	// Faults counts the process's page faults (minflt + majflt): mostly
	// first touches of memory the kernel had not backed yet, each costing
	// what Machine.FirstTouch measures.
	Faults int64
}

// ReadCPU reads the CPU times of pid.
func ReadCPU(pid int) (CPU, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return CPU{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // comm may hold spaces and parentheses
	if i < 0 {
		return CPU{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return CPU{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
	var v [4]int64
	for j := range v {
		if v[j], err = strconv.ParseInt(f[11+j], 10, 64); err != nil {
			return CPU{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	// Field 10 is minflt, 12 majflt.
	minflt, err1 := strconv.ParseInt(f[7], 10, 64)
	majflt, err2 := strconv.ParseInt(f[9], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return CPU{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	t := time.Second / time.Duration(clkTck())
	return CPU{Self: time.Duration(v[0]+v[1]) * t, Children: time.Duration(v[2]+v[3]) * t, Faults: minflt + majflt}, nil
}

// PeakRSS returns VmHWM of pid in bytes.
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// Sampler polls the CPU time of a process that may exit at any moment and
// keeps the last reading.
type Sampler struct {
	mu   sync.Mutex
	last CPU
	pid  int
	stop chan struct{}
	done chan struct{}
}

// Sample starts polling pid every interval.
func Sample(pid int, interval time.Duration) *Sampler {
	s := &Sampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	s.read()
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				if !s.read() {
					return
				}
			}
		}
	}()
	return s
}

func (s *Sampler) read() bool {
	c, err := ReadCPU(s.pid)
	if err != nil {
		return false
	}
	s.mu.Lock()
	s.last = c
	s.mu.Unlock()
	return true
}

// Stop ends polling (reading once more if the process still exists) and
// returns the last reading.
func (s *Sampler) Stop() CPU {
	close(s.stop)
	<-s.done
	s.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Machine describes the host for the report.
type Machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	MemTotal string `json:"mem_total"`
	Kernel   string `json:"kernel"`
	// FirstTouch is what the first write to a fresh anonymous page costs
	// (the page fault that backs it), in ns: well under 1,000 on bare
	// metal, ~11,000 in the Firecracker VM the figures in
	// docs/performance.md come from. A process stalls that long per page whenever it
	// grows into new memory.
	FirstTouchNs float64 `json:"first_touch_ns_per_page"`
}

// ReadMachine reads /proc for the report.
func ReadMachine() Machine {
	var m Machine
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			k = strings.TrimSpace(k)
			if k == "processor" {
				m.CPUs++
			}
			if k == "model name" && m.CPUModel == "" {
				m.CPUModel = strings.TrimSpace(v)
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(rest)
				if len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					m.MemTotal = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	m.FirstTouchNs = FirstTouch()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// SystemCPU returns the machine's busy CPU time (all cores; user, nice,
// system, irq, softirq, steal) from /proc/stat.
func SystemCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * (time.Second / time.Duration(clkTck()))
}

// Window measures what the whole machine did while a phase ran, to tell a
// clean measurement from one that shared the cores with something else.
type Window struct {
	start time.Time
	busy  time.Duration
}

// StartWindow starts a window.
func StartWindow() Window { return Window{start: time.Now(), busy: SystemCPU()} }

// Other returns, in cores, the CPU the machine spent during the window
// beyond measured (the CPU of the processes the phase accounts for).
func (w Window) Other(measured time.Duration) float64 {
	el := time.Since(w.start)
	if el <= 0 {
		return 0
	}
	return float64(SystemCPU()-w.busy-measured) / float64(el)
}

// LoadAvg returns the 1-minute load average.
func LoadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// WaitQuiet waits up to within until the machine's busy CPU over one second
// is below threshold cores; it returns the last reading.
func WaitQuiet(within time.Duration, threshold float64) float64 {
	end := time.Now().Add(within)
	for {
		w := StartWindow()
		time.Sleep(time.Second)
		busy := w.Other(0)
		if busy < threshold || time.Now().After(end) {
			return busy
		}
	}
}

// FirstTouch measures the cost of faulting in a fresh page: it maps 16 MiB
// of anonymous memory, writes one byte per page and returns the time per
// page in ns (0 if the mapping fails).
func FirstTouch() float64 {
	const size = 16 << 20
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0
	}
	defer func() { _ = syscall.Munmap(b) }()
	page := os.Getpagesize()
	start := time.Now()
	for i := 0; i < size; i += page {
		b[i] = 1
	}
	return float64(time.Since(start).Nanoseconds()) / float64(size/page)
}
