package pgstore

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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// The holder process: a second copy of this test binary that takes a lock, says so, and
// reports what happens to it. The tests below stop, resume and kill it for real.
const (
	holderDSNEnv   = "GUARD_TEST_HOLDER_DSN"
	holderTableEnv = "GUARD_TEST_HOLDER_TABLE"
	holderNameEnv  = "GUARD_TEST_HOLDER_NAME"
	holderTTL      = time.Second // the holder's watchdog timeout
)

// TestHolderProcess is the holder's main, not a test: it does nothing unless run by
// startHolder.
func TestHolderProcess(t *testing.T) {
	dsn, table, name := os.Getenv(holderDSNEnv), os.Getenv(holderTableEnv), os.Getenv(holderNameEnv)
	if dsn == "" {
		return
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		fmt.Printf("error %v\n", err)
		return
	}
	defer pool.Close()
	g := guard.New(New(pool, WithTable(table)), guard.WithWatchdogTimeout(holderTTL))
	defer g.Close(context.Background())
	l, err := g.Acquire(context.Background(), name)
	if err != nil {
		fmt.Printf("error %v\n", err)
		return
	}
	fmt.Printf("held %d\n", l.Fence())
	<-l.Done()
	// What the test checks, as errors.Is sees it, then the message for its log.
	fmt.Printf("ended lost=%t %v\n", errors.Is(l.Err(), guard.ErrLockLost), l.Err())
	err = l.Release(context.Background())
	fmt.Printf("release notheld=%t %v\n", errors.Is(err, guard.ErrNotHeld), err)
}

// holder is a running holder process.
type holder struct {
	cmd   *exec.Cmd
	lines chan string
	fence uint64
}

// startHolder runs the holder process on name in srv's table and waits until it holds the
// lock.
func startHolder(t *testing.T, srv *server, name string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderDSNEnv+"="+srv.pg.DSN, holderTableEnv+"="+srv.table, holderNameEnv+"="+name)
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

// guardOn returns a Guard on a Store of srv with a pool of its own, closed when the test ends.
func guardOn(t *testing.T, srv *server) *guard.Guard {
	st, _ := srv.store(t)
	g := guard.New(st)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

// TestPausedHolder stops a holder process (SIGSTOP: a GC pause, a frozen VM) until its lease
// runs out by the database's clock and another instance takes the lock, then resumes it. The
// resumed holder must find its lock lost, and its late release must not free the new holder's
// lock; the fences tell the two grants apart.
func TestPausedHolder(t *testing.T) {
	srv := startServer(t)
	name := "paused:" + rand.Text()
	h := startHolder(t, srv, name)

	h.signal(t, syscall.SIGSTOP)
	paused := time.Now()
	next, other := guardOn(t, srv), guardOn(t, srv)
	l, err := next.Acquire(t.Context(), name, guard.WaitTime(10*holderTTL))
	require.NoError(t, err, "the paused holder's lease never ran out")
	t.Logf("taken %v after the holder was paused; fence %d after the holder's %d", time.Since(paused), l.Fence(), h.fence)
	assert.Greater(t, l.Fence(), h.fence)

	h.signal(t, syscall.SIGCONT)
	ended := h.next(t, "ended ")
	assert.Contains(t, ended, "lost=true", "the resumed holder did not learn it lost the lock")
	release := h.next(t, "release ")
	assert.Contains(t, release, "notheld=true", "the resumed holder's release")
	t.Logf("the resumed holder: %s; %s", ended, release)

	_, err = other.TryAcquire(t.Context(), name)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "the old holder's release freed the new holder's lock")
	require.NoError(t, l.Err())
	require.NoError(t, l.Release(t.Context()))
}

// TestKilledHolder kills a holder process (SIGKILL: no release) and shows that a waiter
// takes the lock once the dead holder's lease runs out, with a higher fence.
func TestKilledHolder(t *testing.T) {
	srv := startServer(t)
	name := "killed:" + rand.Text()
	h := startHolder(t, srv, name)

	waiter := guardOn(t, srv)
	got := make(chan *guard.Lock, 1)
	go func() {
		l, err := waiter.Acquire(t.Context(), name, guard.WaitTime(10*holderTTL))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	h.signal(t, syscall.SIGKILL)
	killed := time.Now()
	l := <-got
	require.NotNil(t, l)
	t.Logf("taken %v after the holder was killed (its lease: %v)", time.Since(killed), holderTTL)
	assert.Greater(t, l.Fence(), h.fence)
	assert.Less(t, time.Since(killed), 3*holderTTL)
	require.NoError(t, l.Release(t.Context()))
}
