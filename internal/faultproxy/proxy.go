// Package faultproxy is an in-process TCP proxy between a client and a server
// (Redis, in this project's tests) that injects network faults on demand:
// latency, a black hole, lost replies, held replies and requests, resets.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what a Proxy does to the traffic between a client and Redis.
type Fault int

// Faults.
const (
	Pass        Fault = iota // forward both ways
	Latency                  // forward both ways after a delay (SetLatency)
	BlackHole                // accept and read, forward nothing either way: a partition
	DropReplies              // forward requests, swallow replies: commands run, the client never hears
	Reset                    // reset every connection, now and on accept
)

func (f Fault) String() string {
	return [...]string{"pass", "latency", "black-hole", "drop-replies", "reset"}[f]
}

// Proxy is an in-process TCP proxy between a client and a Redis server that
// injects faults on demand. Close stops it and every connection it carries.
type Proxy struct {
	target string
	ln     net.Listener

	fault     atomic.Int32
	latency   atomic.Int64 // nanoseconds, for Latency
	dropNext  atomic.Int64 // replies still to swallow in Pass mode (DropNext)
	holdNext  atomic.Bool  // hold the next reply until Release (HoldNext)
	holdUp    atomic.Bool  // hold the next request until Release (HoldNextRequest)
	accepted  atomic.Int64
	dropped   atomic.Int64 // reply chunks swallowed
	forwarded atomic.Int64 // request chunks forwarded
	swallowed atomic.Int64 // request chunks a black hole read and dropped
	wg        sync.WaitGroup
	mu        sync.Mutex // guards conns, closed, holding, release
	conns     map[net.Conn]struct{}
	closed    bool
	holding   chan struct{} // closed when a reply or a request is being held (HoldNext, HoldNextRequest)
	release   chan struct{} // closed by Release
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set switches the fault; it applies at once to connections already open.
// Reset also resets every open connection.
func (p *Proxy) Set(f Fault) {
	p.fault.Store(int32(f))
	if f == Reset {
		p.resetAll()
	}
}

// SetLatency sets the delay added to every chunk in Latency mode.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// DropNext swallows the next n replies (chunks from the server), then passes
// traffic again: the commands ran, their callers never heard.
func (p *Proxy) DropNext(n int) { p.dropNext.Store(int64(n)) }

// HoldNext holds the next reply (chunk from the server) until Release: the
// command ran, its caller is still waiting for the answer. It returns a
// channel closed once a reply is being held.
func (p *Proxy) HoldNext() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding, p.release = make(chan struct{}), make(chan struct{})
	p.holdNext.Store(true)
	return p.holding
}

// HoldNextRequest holds the next request (chunk from a client) until
// Release: its client wrote it, the server has not read it — a request on
// the wire. It goes on at Release even if its client has gone meanwhile (a
// process killed after its write), as a packet already sent would. It
// returns a channel closed once a request is being held.
func (p *Proxy) HoldNextRequest() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding, p.release = make(chan struct{}), make(chan struct{})
	p.holdUp.Store(true)
	return p.holding
}

// Release lets the held reply or request go on.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.release != nil {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
	}
}

// Accepted is the number of client connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Dropped is the number of reply chunks swallowed so far.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Forwarded is the number of request chunks forwarded to the server so far.
func (p *Proxy) Forwarded() int64 { return p.forwarded.Load() }

// Swallowed is the number of request chunks a black hole read and dropped so
// far: a request counted here never reaches the server.
func (p *Proxy) Swallowed() int64 { return p.swallowed.Load() }

// Open is the number of client connections currently open.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// Close stops accepting, closes every connection and waits for its goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	err := p.ln.Close()
	for c := range conns {
		c.Close()
	}
	p.Release()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		if Fault(p.fault.Load()) == Reset {
			rst(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		rst(client)
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pump(server, client, true); done <- struct{}{} }()
	go func() { p.pump(client, server, false); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
	p.untrack(client, server)
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

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *Proxy) resetAll() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		rst(c)
	}
}

// pump copies src to dst chunk by chunk, applying the current fault to each.
func (p *Proxy) pump(dst, src net.Conn, up bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && (up && p.holdUp.CompareAndSwap(true, false) || !up && p.holdNext.CompareAndSwap(true, false)) {
			p.mu.Lock()
			holding, release := p.holding, p.release
			p.mu.Unlock()
			close(holding)
			<-release // a fault: this chunk waits for Release (or Close)
		}
		if n > 0 && p.forward(up) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				rst(dst)
			}
			return
		}
	}
}

// forward applies the fault to one chunk and reports whether to send it on.
func (p *Proxy) forward(up bool) bool {
	switch Fault(p.fault.Load()) {
	case Latency:
		time.Sleep(time.Duration(p.latency.Load())) // the fault itself, not synchronisation
	case BlackHole:
		if up {
			p.swallowed.Add(1)
		}
		return false
	case DropReplies:
		if !up {
			p.dropped.Add(1)
			return false
		}
	case Reset:
		return false
	}
	if !up {
		for {
			n := p.dropNext.Load()
			if n <= 0 {
				break
			}
			if p.dropNext.CompareAndSwap(n, n-1) {
				p.dropped.Add(1)
				return false
			}
		}
	} else {
		p.forwarded.Add(1)
	}
	return true
}

// rst closes c with a TCP reset rather than an orderly FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
