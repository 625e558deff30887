package holdertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// Contention: each contender process runs Goroutines goroutines that take the name in turn,
// hold it for Hold and release it, for as long as the process lives.
const (
	Contenders = 4
	Goroutines = 4
	Hold       = 50 * time.Millisecond
)

// contend is a contender process: it prints "acq ID UNIXNANO FENCE" after each grant.
func contend(open Open, conn, name, id string) error {
	b, closeClient, err := open(conn)
	if err != nil {
		return err
	}
	defer closeClient()
	g := guard.New(b, guard.WithWatchdogTimeout(TTL), guard.WithInstance(id))
	defer g.Close(context.Background())
	var out sync.Mutex // one line at a time
	var wg sync.WaitGroup
	for range Goroutines {
		wg.Go(func() {
			for {
				l, err := g.Acquire(context.Background(), name)
				if err != nil {
					out.Lock()
					fmt.Printf("error %v\n", err)
					out.Unlock()
					os.Exit(1)
				}
				out.Lock()
				fmt.Printf("acq %s %d %d\n", id, time.Now().UnixNano(), l.Fence())
				out.Unlock()
				select {
				case <-time.After(Hold):
				case <-l.Done():
				}
				_ = l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	return nil
}

// grant is one "acq" line of a contender.
type grant struct {
	id    string
	at    time.Time
	fence uint64
}

// Contended runs Contenders processes of Goroutines goroutines each on one name of the store
// conn names, each with a watchdog timeout of TTL, and stops (SIGSTOP) a process while it
// holds the lock, runs times. It returns, for each run, how long after the stop another
// process took the lock — what a paused instance costs the others: no more than its TTL, its
// waiters' places in a queue included — and checks that bound and that fences increase.
// inspect tells who holds the lock (Inspector.Inspect of the store).
func Contended(t *testing.T, conn string, inspect func(ctx context.Context, name string) (guard.LockInfo, error), runs int) []time.Duration {
	name := "contended:" + rand.Text()
	grants := make(chan grant, 1024)
	procs := make(map[string]*exec.Cmd)
	for i := range Contenders {
		id := "proc-" + strconv.Itoa(i)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), connEnv+"="+conn, nameEnv+"="+name, idEnv+"="+id)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		procs[id] = cmd
		reaped := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if g, ok := parseGrant(sc.Text()); ok {
					grants <- g
				} else if strings.HasPrefix(sc.Text(), "error ") {
					t.Errorf("%s: %s", id, sc.Text())
				}
			}
		}()
		go func() {
			_ = cmd.Wait()
			close(reaped)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-reaped
		})
	}

	var last uint64
	next := func() grant {
		t.Helper()
		select {
		case g := <-grants:
			assert.Greater(t, g.fence, last, "fences went backwards")
			last = max(last, g.fence)
			return g
		case <-time.After(20 * TTL):
			t.Fatal("no contender took the lock")
			return grant{}
		}
	}
	seen := make(map[string]bool) // every contender got the lock at least once: all are up
	for len(seen) < Contenders {
		seen[next().id] = true
	}

	var took []time.Duration
	for len(took) < runs {
		g := next()
		p := procs[g.id]
		require.NoError(t, p.Process.Signal(syscall.SIGSTOP))
		stopped := time.Now()
		info, err := inspect(t.Context(), name)
		require.NoError(t, err)
		if !info.Held || info.Instance != g.id {
			require.NoError(t, p.Process.Signal(syscall.SIGCONT)) // it let go before the stop
			continue
		}
		for {
			n := next()
			if n.id != g.id {
				took = append(took, n.at.Sub(stopped))
				break
			}
		}
		require.NoError(t, p.Process.Signal(syscall.SIGCONT))
	}
	slices.Sort(took)
	t.Logf("%d processes × %d goroutines, watchdog %v: another process took the lock %v after a holder was stopped", Contenders, Goroutines, TTL, took)
	for _, d := range took {
		assert.Less(t, d, TTL+TTL/4, "a stopped process blocked the name longer than its TTL")
	}
	return took
}

func parseGrant(line string) (grant, bool) {
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "acq" {
		return grant{}, false
	}
	ns, err1 := strconv.ParseInt(f[2], 10, 64)
	fence, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		return grant{}, false
	}
	return grant{id: f[1], at: time.Unix(0, ns), fence: fence}, true
}
