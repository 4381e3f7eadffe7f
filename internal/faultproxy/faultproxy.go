// Package faultproxy is a TCP proxy for fault tests: it forwards
// connections to a target and can cut them (reset) or stall them (stop
// forwarding while keeping the sockets open, as a black-holed link does).
package faultproxy

import (
	"net"
	"sync"
)

// Proxy forwards every connection accepted on Addr to a target. Its methods
// are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	stalled chan struct{} // closed while forwarding; replaced by Stall
	closed  bool
	wg      sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target ("host:port").
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, stalled: make(chan struct{})}
	close(p.stalled)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Cut resets every open connection (both sides see a connection reset);
// new connections are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST rather than FIN
		}
		_ = c.Close()
		delete(p.conns, c)
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

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
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
			if !p.track(in, out) {
				_ = in.Close()
				_ = out.Close()
				return
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.pipe(out, in) }()
			go func() { defer wg.Done(); p.pipe(in, out) }()
			wg.Wait()
		}()
	}
}

// pipe copies src to dst, holding each chunk while the proxy is stalled.
// When either side ends, both connections are closed.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.untrack(dst)
	defer p.untrack(src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a reset: either ends both directions
			return
		}
	}
}
