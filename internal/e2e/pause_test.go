package e2e

import (
	"bufio"
	"bytes"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
)

// runStarts is the log line in which a worker says when its run's window 0 starts: the run's
// ID is that instant in Unix milliseconds.
var runStarts = regexp.MustCompile(`run (\d+): window 0 starts`)

// A worker process stopped (SIGSTOP) while it runs a task, past the lease of the task's lock,
// and continued (SIGCONT) after another process took the task over: the task's done record of
// the stopped process is refused by its fence, and both processes give the verdict of a run
// without a pause — every window and every task exactly once. Two processes of one instance
// each, two tasks of 1 s and 2.4 s, locks with a lease of 1 s: the stopped process holds one
// of the tasks from window 0 on; the other runs its own task, then waits for the held one,
// takes it once its lease has run out, and runs it while the stopped process sleeps through
// the end of its work. The stopped process continues just after window 3 starts, while the
// other process holds that window's job: the job's ticks it missed find it taken.
func TestWorkerPausedPastItsLease(t *testing.T) {
	worker, _ := exampleBinaries(t)
	srv := testserver.StartRedis(t)
	args := []string{"-instances", "1", "-windows", "6", "-window", "1s", "-tasks", "2", "-work", "2s",
		"-tenants", "1", "-imports", "0", "-lease", "1s", "-redis", srv.Addr}

	type proc struct {
		cmd       *exec.Cmd
		out, logs bytes.Buffer
		err       error
	}
	paused, other := &proc{}, &proc{}
	epochs := make(chan int64, 1)
	var read sync.WaitGroup
	for _, p := range []*proc{paused, other} {
		p.cmd = exec.CommandContext(t.Context(), worker, args...)
		p.cmd.Env, p.cmd.Stdout = exampleEnv(), &p.out
		stderr, err := p.cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, p.cmd.Start())
		read.Go(func() {
			s := bufio.NewScanner(stderr)
			for s.Scan() {
				p.logs.WriteString(s.Text() + "\n")
				if m := runStarts.FindStringSubmatch(s.Text()); m != nil && p == paused {
					ms, _ := strconv.ParseInt(m[1], 10, 64)
					epochs <- ms
				}
			}
			_, _ = io.Copy(io.Discard, stderr)
		})
	}
	var epoch time.Time
	select {
	case ms := <-epochs:
		epoch = time.UnixMilli(ms)
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not say when its run starts")
	}
	time.Sleep(time.Until(epoch.Add(300 * time.Millisecond)))
	require.NoError(t, paused.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(time.Until(epoch.Add(3*time.Second + 150*time.Millisecond)))
	require.NoError(t, paused.cmd.Process.Signal(syscall.SIGCONT))

	read.Wait()
	paused.err, other.err = paused.cmd.Wait(), other.cmd.Wait()
	for _, p := range []*proc{paused, other} {
		require.NoError(t, p.err, "%s\n%s", p.out.String(), p.logs.String())
		assert.Contains(t, p.out.String(), "OK: every window ran exactly once, and every task ran exactly once.")
	}
	refused := strings.Contains(paused.out.String(), "the journal refused their done records")
	t.Logf("the stopped process's done record refused by its fence: %v (else its task's context ended first)\n%s", refused, paused.out.String())
}
