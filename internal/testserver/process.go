// Package testserver starts the real servers the tests talk to — redis-server (single node,
// cluster with or without replicas, Sentinel with one sentinel or a failover group of three),
// Jaeger, a MongoDB-wire-protocol server, PostgreSQL and MariaDB — as child processes on free
// loopback ports, and stops them when the test ends. Nothing here is a fake: a test that cannot get its server
// fails with a message that says how to get it.
//
// It also injects real faults: a server process can be killed (SIGKILL), restarted on the
// same port and directory, paused (SIGSTOP) and resumed; a FaultProxy between a client and a
// server adds latency, loses or delays the reply of one chosen request, partitions, resets
// and refuses connections; Sentinel and Cluster helpers fail a primary over to its replica,
// by command or by killing it, and wait until the deployment agrees on the new primary.
// Every wait polls the servers; none sleeps for a guessed time.
package testserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a server running as a child process of the test. Kill, Restart, Pause and
// Resume may be called from any goroutine.
type Process struct {
	Name string
	Addr string // host:port it listens on

	path string   // the binary
	args []string // its arguments, the same for every run
	out  *syncBuffer

	mu     sync.Mutex // protects run and paused
	run    *run       // the current run: replaced by Restart
	paused bool       // SIGSTOPped by Pause and not resumed since
}

// run is one execution of a Process's command.
type run struct {
	cmd  *exec.Cmd
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
	p := &Process{Name: bin, Addr: addr, path: path, args: args, out: &syncBuffer{}}
	tb.Cleanup(p.Kill)
	p.start(tb)
	return p
}

// start runs the command once more and waits until it listens; the caller holds no lock.
func (p *Process) start(tb testing.TB) {
	tb.Helper()
	r := &run{cmd: exec.Command(p.path, p.args...), done: make(chan struct{})}
	r.cmd.Stdout = p.out
	r.cmd.Stderr = p.out
	if err := r.cmd.Start(); err != nil {
		tb.Fatalf("testserver: start %s: %v", p.Name, err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	p.mu.Lock()
	p.run, p.paused = r, false
	p.mu.Unlock()
	if err := p.waitListening(r, readyTimeout); err != nil {
		p.Kill()
		tb.Fatalf("testserver: %s on %s: %v\n%s", p.Name, p.Addr, err, p.out.String())
	}
}

// Kill stops the process at once (SIGKILL, as a crash would; a paused process too) and waits
// until it is reaped. It is safe to call more than once.
func (p *Process) Kill() {
	r := p.current()
	if r == nil {
		return // never started
	}
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Kill()
	<-r.done
}

// Restart starts the process again with the same arguments, so on the same port and with
// the same working directory, and waits until it listens. A process that still runs is
// killed first (SIGKILL: a crash and a restart). What the server finds when it starts again
// is what it had made durable before it died.
func (p *Process) Restart(tb testing.TB) {
	tb.Helper()
	p.Kill()
	p.start(tb)
}

// Exited reports whether the process has exited (been killed, crashed or stopped by itself)
// and not been restarted since.
func (p *Process) Exited() bool {
	r := p.current()
	if r == nil {
		return true
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Pause stops the process with SIGSTOP — a frozen VM, a long GC or swap storm, a process
// stopped in a debugger — and returns once the kernel reports it stopped. Its sockets stay
// open and the kernel still accepts bytes sent to it, but it runs nothing until Resume. A
// paused process is resumed when tb's test ends (and killed when its Start's test ends).
func (p *Process) Pause(tb testing.TB) {
	tb.Helper()
	p.mu.Lock()
	r := p.run
	if r == nil || p.paused {
		p.mu.Unlock()
		return
	}
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.mu.Unlock()
		tb.Fatalf("testserver: pause %s on %s: %v", p.Name, p.Addr, err)
	}
	p.paused = true
	p.mu.Unlock()
	tb.Cleanup(func() { p.resume(r) })
	if err := p.waitState(r, true); err != nil {
		tb.Fatalf("testserver: pause %s on %s: %v", p.Name, p.Addr, err)
	}
}

// Resume continues a process stopped by Pause (SIGCONT) and returns once the kernel reports
// it running. It does nothing to a process that is not paused.
func (p *Process) Resume(tb testing.TB) {
	tb.Helper()
	if err := p.resume(p.current()); err != nil {
		tb.Fatalf("testserver: resume %s on %s: %v", p.Name, p.Addr, err)
	}
}

// resume sends SIGCONT to run r if it is the current, paused run, and waits until it runs.
func (p *Process) resume(r *run) error {
	p.mu.Lock()
	if r == nil || p.run != r || !p.paused {
		p.mu.Unlock()
		return nil
	}
	p.paused = false
	err := r.cmd.Process.Signal(syscall.SIGCONT)
	p.mu.Unlock()
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	if err != nil {
		return err
	}
	return p.waitState(r, false)
}

// waitState polls /proc until run r is stopped (or no longer stopped). Where /proc cannot
// tell, it returns at once: the signal has been sent, and is delivered before the process
// next runs.
func (p *Process) waitState(r *run, stopped bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	pid := r.cmd.Process.Pid
	return poll(ctx, time.Millisecond, func() error {
		select {
		case <-r.done:
			return nil // exited: neither stopped nor running any more
		default:
		}
		if _, state, ok := procStat(pid); ok && (state == 'T') != stopped {
			return fmt.Errorf("process state is %q", state)
		}
		return nil
	})
}

// current returns the current run, nil before the first one started.
func (p *Process) current() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.run
}

// Output is what the process printed so far, over all its runs.
func (p *Process) Output() string { return p.out.String() }

// Port returns the port of Addr.
func (p *Process) Port() int {
	_, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.Atoi(port)
	return n
}

func (p *Process) waitListening(r *run, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var d net.Dialer
	err := poll(ctx, 10*time.Millisecond, func() error {
		select {
		case <-r.done:
			return errExited
		default:
		}
		c, err := d.DialContext(ctx, "tcp", p.Addr)
		if err == nil {
			c.Close()
		}
		return err
	})
	if errors.Is(err, errExited) {
		return fmt.Errorf("exited before listening: %v", r.err)
	}
	if err != nil {
		return fmt.Errorf("not listening after %v: %w", limit, err)
	}
	return nil
}

// errExited stops a poll: the process it waits for has exited.
var errExited = errors.New("testserver: process exited")

// poll calls check every interval until it returns nil, returns errExited (which poll
// returns at once), or ctx ends; then it returns check's last error.
func poll(ctx context.Context, interval time.Duration, check func() error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := check()
		if err == nil || errors.Is(err, errExited) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
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

// isPaused reports whether Pause stopped the process and Resume has not continued it.
func (p *Process) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}
