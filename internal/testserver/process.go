// Package testserver starts the real servers the tests talk to — redis-server (single node and
// cluster), a MongoDB-wire-protocol server, PostgreSQL — as child processes on free loopback
// ports, and stops them when the test ends. Nothing here is a fake: a test that cannot get its
// server fails with a message that says how to get it.
package testserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Process is a server running as a child process of the test.
type Process struct {
	Name string
	Addr string // host:port it listens on

	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // exit status; read after done
}

// FreePort returns a loopback TCP port that nothing listens on right now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testserver: no free loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs bin with args as a child process that should listen on addr, waits until addr
// accepts connections, and registers a cleanup that kills and reaps it. hint says how to get
// bin when it is missing.
func Start(tb testing.TB, addr, hint, bin string, args ...string) *Process {
	tb.Helper()
	path, err := exec.LookPath(bin)
	if err != nil {
		tb.Fatalf("testserver: %s not found (%v); %s", bin, err, hint)
	}
	p := &Process{Name: bin, Addr: addr, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("testserver: start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(p.Kill)
	if err := p.waitListening(30 * time.Second); err != nil {
		p.Kill()
		tb.Fatalf("testserver: %s on %s: %v\n%s", bin, addr, err, p.out.String())
	}
	return p
}

// Kill stops the process at once (SIGKILL, as a crash would) and waits until it is reaped.
// It is safe to call more than once.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Output is what the process printed so far.
func (p *Process) Output() string { return p.out.String() }

// Host returns the host of Addr; Port its port.
func (p *Process) Port() int {
	_, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.Atoi(port)
	return n
}

func (p *Process) waitListening(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", p.Addr)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited before listening: %v", p.err)
		case <-ctx.Done():
			return errors.New("not listening after " + limit.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// syncBuffer collects a child's output; os/exec writes to it from its own goroutine.
type syncBuffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
