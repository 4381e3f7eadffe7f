// Package faultproxy is a TCP proxy for fault tests: it forwards
// connections to a target and can cut them (reset), stall them (stop
// forwarding while keeping the sockets open, as a frozen link does), or
// black-hole the open ones for good while new connections work (as a lost
// NAT or load-balancer entry does).
//
// The proxy is a userspace program: its kernel acknowledges every TCP
// segment the peers send, whatever the proxy then does with the bytes. A
// stalled or black-holed link is therefore silent at the application level
// only; kernel mechanisms that wait for TCP acknowledgements
// (TCP_USER_TIMEOUT, keepalive probes) never fire through it. Only
// application-level checks (pings, receive timeouts) notice.
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection accepted on Addr to a target. Its methods
// are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	links   map[*link]struct{}
	n       uint64        // connections accepted
	stalled chan struct{} // closed while forwarding; replaced by Stall
	closed  bool
	wg      sync.WaitGroup
}

// link is one proxied connection: in from the client, out to the target.
type link struct {
	in, out net.Conn
	n       uint64 // accept order
	// holed is set by BlackHole: bytes read from either side are dropped,
	// and one side ending is not passed on to the other.
	holed atomic.Bool
}

// Start listens on a free loopback port and forwards to target ("host:port").
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}, stalled: make(chan struct{})}
	close(p.stalled)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Cut resets every open connection, black-holed ones included (both sides
// see a connection reset); new connections are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		for _, c := range []net.Conn{l.in, l.out} {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST rather than FIN
			}
			_ = c.Close()
		}
		delete(p.links, l)
	}
}

// Stall stops forwarding bytes in both directions, on open and new
// connections, without closing anything: the peers see a silent link.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
		p.stalled = make(chan struct{})
	default: // already stalled
	}
}

// Resume forwards again after Stall; held bytes are delivered.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
	default:
		close(p.stalled)
	}
}

// BlackHole makes every connection open now silent for good, in both
// directions, while connections accepted later are forwarded as before:
// what a lost NAT or load-balancer entry does to the connections it
// carried. Bytes either side sends are read and dropped (the proxy's kernel
// still acknowledges them), and neither side is closed: when one side
// closes or resets its socket, the other is not told, as the close would
// not cross the broken path either. A black-holed connection ends only
// when its own peer closes it, or at Cut or Close. It returns how many
// connections it black-holed.
func (p *Proxy) BlackHole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if !l.holed.Swap(true) {
			n++
		}
	}
	return n
}

// BlackHoleLatest is BlackHole for the most recently accepted connection
// that is still open only (for a client that opened several, the last
// one). It reports whether there was one to black-hole.
func (p *Proxy) BlackHoleLatest() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last *link
	for l := range p.links {
		if !l.holed.Load() && (last == nil || l.n > last.n) {
			last = l
		}
	}
	if last == nil {
		return false
	}
	last.holed.Store(true)
	return true
}

// Close stops listening, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Resume()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled
}

func (p *Proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.n++
	l.n = p.n
	p.links[l] = struct{}{}
	return true
}

// untrack forgets l once neither of its sides is open.
func (p *Proxy) untrack(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			<-p.gate() // a stalled link does not even answer the handshake
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = in.Close()
				return
			}
			l := &link{in: in, out: out}
			if !p.track(l) {
				_ = in.Close()
				_ = out.Close()
				return
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.pipe(l, out, in) }()
			go func() { defer wg.Done(); p.pipe(l, in, out) }()
			wg.Wait()
			_ = in.Close()
			_ = out.Close()
			p.untrack(l)
		}()
	}
}

// pipe copies src to dst, holding each chunk while the proxy is stalled
// and dropping it once l is black-holed. When src ends, both connections
// are closed, unless l is black-holed: then only src is, and dst stays
// open until its own peer or the proxy closes it.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.await(l) {
			if _, werr := dst.Write(buf[:n]); werr != nil && !l.holed.Load() {
				_ = dst.Close()
				_ = src.Close()
				return
			}
		}
		if err != nil { // io.EOF or a reset
			if !l.holed.Load() {
				_ = dst.Close()
			}
			_ = src.Close()
			return
		}
	}
}

// await waits while the proxy is stalled and reports whether l's bytes are
// to be forwarded: false once l is black-holed (checked now and then, as
// a stall may outlast the black hole's start).
func (p *Proxy) await(l *link) bool {
	for !l.holed.Load() {
		gate := p.gate()
		select {
		case <-gate:
			return !l.holed.Load()
		default:
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-gate:
		case <-t.C:
		}
		t.Stop()
	}
	return false
}
