// Package tcpproxy is a TCP forwarder for tests that need a dependency to
// become unreachable (and come back) without touching the real server,
// which other tests share.
package tcpproxy

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards connections from Addr to a target.
type Proxy struct {
	t      testing.TB
	target string
	Addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	delay time.Duration
}

// Start listens on a free port and forwards to target until t ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, target: target, Addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	p.serve(ln)
	t.Cleanup(p.Cut)
	return p
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
}

func (p *Proxy) pipe(c net.Conn) {
	p.mu.Lock()
	target, delay := p.target, p.delay
	p.mu.Unlock()
	// a balancer's connect timeout: a target cut off the network does not
	// answer the SYN, and the client waits this long, not TCP's two minutes
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	copyOne := func(dst, src net.Conn) { io.Copy(dst, src) }
	if delay > 0 {
		copyOne = func(dst, src net.Conn) { delayedCopy(dst, src, delay) }
	}
	go func() { copyOne(up, c); done <- struct{}{} }()
	go func() { copyOne(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Cut closes every forwarded connection and stops listening: new
// connections are refused, as if the server were down.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

// SetDelay holds every byte of the connections forwarded from now on for
// d before passing it on, each way: a link to another site. What is held
// when Cut runs is dropped, as a link that fails loses what it carried.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// delayedCopy copies src to dst, each read passed on d after it arrived,
// until either end fails.
func delayedCopy(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			for range q { // what was held is dropped
			}
			return
		}
	}
}

// Retarget sends new connections to target; those forwarded already stay
// where they are: a load balancer moving to another backend.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Move sends new connections to target and closes every connection it
// forwarded so far: a load balancer that shuts the sessions of a backend
// it marks down (HAProxy's on-marked-down shutdown-sessions), so that no
// client keeps talking to a server that is no longer the primary.
func (p *Proxy) Move(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
}

// Restore listens again on the same address.
func (p *Proxy) Restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		p.t.Fatalf("proxy: listening again on %s: %v", p.Addr, err)
	}
	p.serve(ln)
}
