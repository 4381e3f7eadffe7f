package e2e_test

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// The package's parallel tests run through a gate of its own instead of
// go test's -parallel alone. go test starts parallel tests in the order
// they pause: every top-level test first, then the subtests, whose
// parents start only when a slot is free. The longest tests of the
// package are subtests (the kill loops' cases), so they started last and
// the run ended with one or two of them alone on an idle machine for
// minutes. The gate admits -parallel tests at once, as before, but the
// long ones first (parallelLong), then the others in the order they came.
//
// TestMain reads -parallel for the gate and raises go test's own limit
// out of the way, so that every parallel test reaches the gate at once.

// gate admits at most width tests at once, long ones first.
type gate struct {
	mu      sync.Mutex
	width   int
	running int
	opened  time.Time // when a test last arrived at an idle gate
	waiting []*waiter
}

type waiter struct {
	long  bool
	admit chan struct{}
}

var testGate = &gate{width: runtime.GOMAXPROCS(0)}

// gateSettle is how long after a test arrives at an idle gate the gate
// admits none: the tests released together arrive within it, so the long
// ones among them are admitted first.
const gateSettle = 300 * time.Millisecond

// parallel marks t parallel (t.Parallel) and waits until the gate admits
// it; the func it returns gives the slot back. A test of this package
// starts with
//
//	defer parallel(t)()
//
// instead of calling t.Parallel itself (TestEveryTestParallelOrSerial
// holds it to that).
func parallel(t *testing.T) func() { return testGate.enter(t, false) }

// parallelLong is parallel for a test that runs a minute or more on a
// loaded machine (a kill loop, a failover): it is admitted before the
// others that wait.
func parallelLong(t *testing.T) func() { return testGate.enter(t, true) }

func (g *gate) enter(t *testing.T, long bool) func() {
	t.Helper()
	t.Parallel()
	return g.wait(long)
}

// wait blocks until g admits a test (long: before the others waiting) and
// returns the func that gives its slot back.
func (g *gate) wait(long bool) func() {
	w := &waiter{long: long, admit: make(chan struct{})}
	g.mu.Lock()
	if g.running == 0 && len(g.waiting) == 0 {
		// Idle: the tests arriving now arrive together.
		g.opened = time.Now()
		time.AfterFunc(gateSettle, func() { g.mu.Lock(); g.next(); g.mu.Unlock() })
	}
	g.waiting = append(g.waiting, w)
	g.next()
	g.mu.Unlock()
	<-w.admit
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.running--
			g.next()
			g.mu.Unlock()
		})
	}
}

// next admits waiting tests while there is room, long ones first; g.mu
// held.
func (g *gate) next() {
	if time.Since(g.opened) < gateSettle {
		return
	}
	for g.running < g.width && len(g.waiting) > 0 {
		i := 0
		for j, w := range g.waiting {
			if w.long {
				i = j
				break
			}
		}
		w := g.waiting[i]
		g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
		g.running++
		close(w.admit)
	}
}

// takeParallelFlag gives -parallel (go test's, or GOMAXPROCS) to the gate
// and raises go test's own limit above any number of tests this package
// has, so that go test never holds a parallel test back from the gate.
// It runs in TestMain, after flag.Parse.
func takeParallelFlag() {
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	var n int
	if _, err := fmt.Sscan(f.Value.String(), &n); err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "e2e: -parallel %q: want a positive number\n", f.Value.String())
		os.Exit(2)
	}
	testGate.width = n
	if err := flag.Set("test.parallel", "100000"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: raising go test's -parallel: %v\n", err)
		os.Exit(2)
	}
}

// TestGateAdmitsLongFirst: of the tests waiting together, the gate admits
// at most its width at once, the long ones before the others, and the
// others in the order they came.
func TestGateAdmitsLongFirst(t *testing.T) {
	defer parallel(t)()
	run := func(width int) (order []string, most int) {
		g := &gate{width: width}
		var mu sync.Mutex
		running := 0
		var wg sync.WaitGroup
		for i, name := range []string{"a", "b", "LONG1", "c", "LONG2"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				release := g.wait(name[0] == 'L')
				mu.Lock()
				order = append(order, name)
				running++
				most = max(most, running)
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				running--
				mu.Unlock()
				release()
			}()
			time.Sleep(time.Duration(i+1) * 10 * time.Millisecond) // arrive in this order, within the settle time
		}
		wg.Wait()
		return order, most
	}
	if order, _ := run(1); fmt.Sprint(order) != "[LONG1 LONG2 a b c]" {
		t.Errorf("admitted in the order %v, want [LONG1 LONG2 a b c]", order)
	}
	if _, most := run(2); most != 2 {
		t.Errorf("%d tests ran at once through a gate of width 2", most)
	}
}
