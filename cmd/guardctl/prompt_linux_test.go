package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/guardlock/guard"
)

// openPTY opens a pseudo-terminal: what is written to master, the program on slave reads as
// typed. Both are closed when the test ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = master.Close() })
	// unlockpt, then ptsname.
	require.NoError(t, unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetUint32(int(master.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = slave.Close() })
	return master, slave
}

// watchedWriter collects what a program writes, and closes seen once it holds want.
type watchedWriter struct {
	want string
	seen chan struct{}

	mu   sync.Mutex // protects buf and once
	buf  bytes.Buffer
	once sync.Once
}

func (w *watchedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watchedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestBinaryConfirm runs release on a terminal, where it asks before it breaks a lock.
func TestBinaryConfirm(t *testing.T) {
	t.Parallel()
	fx := startRedis(t)
	const question = "Force-release it? Its holder's context ends at its next renewal, and the next holder gets a higher fence. [y/N] "

	// release runs the binary on a terminal, types answer once it asks, and before that
	// runs meanwhile.
	release := func(t *testing.T, name, answer string, meanwhile func()) (code int, stdout, stderr string) {
		t.Helper()
		master, slave := openPTY(t)
		cmd := exec.CommandContext(t.Context(), binary, fx.args("release", name)...)
		cmd.Env = append(os.Environ(), backendEnv+"=")
		var out bytes.Buffer
		errw := &watchedWriter{want: "[y/N] ", seen: make(chan struct{})}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, &out, errw
		require.NoError(t, cmd.Start())
		select {
		case <-errw.seen:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("release did not ask: %s", errw)
		}
		meanwhile()
		_, err := master.WriteString(answer + "\n")
		require.NoError(t, err)
		_ = cmd.Wait()
		return cmd.ProcessState.ExitCode(), out.String(), errw.String()
	}

	t.Run("no", func(t *testing.T) {
		l := acquire(t, fx.guard(t), "confirm:no", guard.Label("job"))
		code, stdout, stderr := release(t, "confirm:no", "n", func() {})
		assert.Equal(t, 1, code)
		assert.Empty(t, stdout)
		assert.True(t, strings.HasPrefix(stderr, fmt.Sprintf("confirm:no, held by test-instance (label job), fence %d, ", l.Fence())), stderr)
		assert.Contains(t, stderr, question+"guardctl: release confirm:no: not released\n")
		require.NoError(t, l.Err(), "still held")
		shown := decode[lockJSON](t, ok(t, fx.args("-json", "show", "confirm:no")...))
		assert.Equal(t, l.Fence(), shown.Fence)
	})

	t.Run("yes", func(t *testing.T) {
		l := acquire(t, fx.guard(t), "confirm:yes")
		code, stdout, stderr := release(t, "confirm:yes", "y", func() {})
		assert.Equal(t, 0, code, stderr)
		assert.True(t, strings.HasPrefix(stdout, fmt.Sprintf("released confirm:yes, held by test-instance, fence %d, ", l.Fence())), stdout)
		assert.True(t, strings.HasSuffix(stderr, question), "only the question on stderr: %q", stderr)
		require.ErrorIs(t, ended(t, l), guard.ErrLockLost)
	})

	t.Run("changed hands while asking", func(t *testing.T) {
		first := acquire(t, fx.guard(t), "confirm:moved")
		var second *guard.Lock
		code, stdout, stderr := release(t, "confirm:moved", "y", func() {
			require.NoError(t, first.Release(t.Context()))
			second = acquire(t, fx.guard(t), "confirm:moved")
		})
		assert.Equal(t, 1, code)
		assert.Empty(t, stdout)
		assert.Contains(t, stderr, fmt.Sprintf("guardctl: release confirm:moved: not released: it changed hands after it was shown with fence %d; "+
			"now held by test-instance, fence %d, ", first.Fence(), second.Fence()))
		assert.True(t, strings.HasSuffix(stderr, " left; run release again to release the new holder\n"), stderr)
		require.NoError(t, second.Err(), "the new holder keeps its lock")
	})
}
