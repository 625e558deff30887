// Package holdertest runs a lock holder in a process of its own — a second copy of the test
// binary — and stops, resumes and kills it for real, to show what a store does when a holder
// is paused past its lease (a GC pause, a frozen VM) or dies without releasing.
//
// A store's tests call Main first thing in their TestMain, with a function that opens the
// store from a connection string, and then Paused and Killed from test functions of their own.
package holdertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TTL is the holder's watchdog timeout: its lease runs out this long after it stops renewing.
const TTL = time.Second

// The holder's environment: the connection string its Open gets, and the lock name.
const (
	connEnv = "GUARD_HOLDERTEST_CONN"
	nameEnv = "GUARD_HOLDERTEST_NAME"
	// idEnv, when set, makes the process a contender (Contended) with this instance name.
	idEnv = "GUARD_HOLDERTEST_ID"
)

// Open opens the store a holder locks on, from the connection string its test passed (an
// address, a DSN, or whatever the store's tests encode in it); close frees its client.
type Open func(conn string) (b guard.Backend, close func(), err error)

// Main runs the holder and exits when this process was started as one by Paused or Killed;
// otherwise it returns at once. The holder takes the lock, prints "held FENCE", waits until
// its lock's context ends, and prints whether it was lost and what its release returned.
func Main(open Open) {
	conn, name := os.Getenv(connEnv), os.Getenv(nameEnv)
	if conn == "" {
		return
	}
	run := hold
	if id := os.Getenv(idEnv); id != "" {
		run = func(open Open, conn, name string) error { return contend(open, conn, name, id) }
	}
	if err := run(open, conn, name); err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func hold(open Open, conn, name string) error {
	b, closeClient, err := open(conn)
	if err != nil {
		return err
	}
	defer closeClient()
	g := guard.New(b, guard.WithWatchdogTimeout(TTL))
	defer g.Close(context.Background())
	l, err := g.Acquire(context.Background(), name)
	if err != nil {
		return err
	}
	fmt.Printf("held %d\n", l.Fence())
	<-l.Done()
	// What the test checks, as errors.Is sees it, then the message for its log.
	fmt.Printf("ended lost=%t %v\n", errors.Is(l.Err(), guard.ErrLockLost), l.Err())
	err = l.Release(context.Background())
	fmt.Printf("release notheld=%t %v\n", errors.Is(err, guard.ErrNotHeld), err)
	return nil
}

// holder is a running holder process.
type holder struct {
	cmd   *exec.Cmd
	lines chan string
	fence uint64
}

// start runs a holder process on name and waits until it holds the lock.
func start(t *testing.T, conn, name string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), connEnv+"="+conn, nameEnv+"="+name)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	h := &holder{cmd: cmd, lines: make(chan string, 16)}
	reaped := make(chan struct{})
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(reaped)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-reaped
	})
	line := h.next(t, "held ")
	h.fence, err = strconv.ParseUint(strings.TrimPrefix(line, "held "), 10, 64)
	require.NoError(t, err)
	return h
}

// next returns the holder's next line that starts with prefix.
func (h *holder) next(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				t.Fatalf("the holder process ended before saying %q", prefix)
			}
			if strings.HasPrefix(line, "error ") {
				t.Fatalf("the holder process failed: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-timeout:
			t.Fatalf("the holder process did not say %q", prefix)
		}
	}
}

func (h *holder) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Signal(sig))
}

// Paused stops a holder process on the store conn names (SIGSTOP) until its lease runs out
// and another instance takes the lock, then resumes it. The resumed holder must find its lock
// lost, and its late release must not free the new holder's lock; the fences tell the two
// grants apart. newGuard returns a Guard with a client of its own on the same store.
func Paused(t *testing.T, conn string, newGuard func(*testing.T) *guard.Guard) {
	name := "paused:" + rand.Text()
	h := start(t, conn, name)

	h.signal(t, syscall.SIGSTOP)
	paused := time.Now()
	next, other := newGuard(t), newGuard(t)
	l, err := next.Acquire(t.Context(), name, guard.WaitTime(10*TTL))
	require.NoError(t, err, "the paused holder's lease never ran out")
	t.Logf("taken %v after the holder was paused; fence %d after the holder's %d", time.Since(paused), l.Fence(), h.fence)
	assert.Greater(t, l.Fence(), h.fence)

	h.signal(t, syscall.SIGCONT)
	ended := h.next(t, "ended ")
	assert.True(t, strings.HasPrefix(ended, "ended lost=true "), "the resumed holder did not learn it lost the lock: %s", ended)
	release := h.next(t, "release ")
	assert.True(t, strings.HasPrefix(release, "release notheld=true "), "the resumed holder's release: %s", release)

	_, err = other.TryAcquire(t.Context(), name)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "the old holder's release freed the new holder's lock")
	require.NoError(t, l.Err())
	require.NoError(t, l.Release(t.Context()))
}

// Killed kills a holder process on the store conn names (SIGKILL: no release) and shows that
// a waiter takes the lock once the dead holder's lease runs out, with a higher fence.
func Killed(t *testing.T, conn string, newGuard func(*testing.T) *guard.Guard) {
	name := "killed:" + rand.Text()
	h := start(t, conn, name)

	waiter := newGuard(t)
	got := make(chan *guard.Lock, 1)
	go func() {
		l, err := waiter.Acquire(t.Context(), name, guard.WaitTime(10*TTL))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	h.signal(t, syscall.SIGKILL)
	killed := time.Now()
	l := <-got
	require.NotNil(t, l)
	t.Logf("taken %v after the holder was killed (its lease: %v)", time.Since(killed), TTL)
	assert.Greater(t, l.Fence(), h.fence)
	assert.Less(t, time.Since(killed), 3*TTL)
	require.NoError(t, l.Release(t.Context()))
}
