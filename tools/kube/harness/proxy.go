package main

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// tcpProxy forwards one loopback port to an upstream address. block() drops every open
// connection and closes the listener, so that new connections are refused (what a client sees
// when the apiserver is away: client-go retries a refused watch from its last resourceVersion,
// with backoff); unblock() listens again on the same port.
type tcpProxy struct {
	addr, upstream string
	mu             sync.Mutex
	ln             net.Listener
	conns          map[net.Conn]bool
	blocks         int // reasons to stay blocked (own disconnect, apiserver restart)
	accepted       int
	closed         bool
}

func newProxy(upstream string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{addr: ln.Addr().String(), upstream: upstream, ln: ln, conns: map[net.Conn]bool{}}
	go p.serve(ln)
	return p, nil
}

func (p *tcpProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.blocks > 0 || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = true
		p.accepted++
		p.mu.Unlock()
		go p.pipe(c)
	}
}

func (p *tcpProxy) pipe(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		c.Close()
		p.forget(c)
		return
	}
	p.mu.Lock()
	if p.blocks > 0 || p.closed {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[u] = true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	p.forget(c)
	p.forget(u)
}

func (p *tcpProxy) forget(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// block drops the connections and stops listening (nested: each block needs its unblock).
func (p *tcpProxy) block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocks++
	if p.blocks > 1 {
		return
	}
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, as a peer that went away
		}
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

func (p *tcpProxy) unblock() error {
	p.mu.Lock()
	p.blocks--
	if p.blocks > 0 || p.closed {
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	var err error
	for i := 0; i < 200; i++ {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.mu.Lock()
			p.ln = ln
			p.mu.Unlock()
			go p.serve(ln)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("proxy %s: listen again: %w", p.addr, err)
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}
