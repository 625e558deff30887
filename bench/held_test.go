package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
)

// The watchdog workload of issue 21 (P4): one Guard holds many locks without a lease time, and
// its watchdog renews each of them every heldTTL/3.
const heldTTL = 3 * time.Second

var (
	heldRun     = flag.Duration("held.run", 6*time.Second, "how long BenchmarkHeld watches each case once its locks are held")
	heldProfile = flag.String("held.cpuprofile", "", "write a CPU profile of the Guard's process while it only renews to this file")
	heldSizes   = flag.String("held.sizes", "10000,30000,50000,100000,200000", "the numbers of held locks BenchmarkHeld runs")
)

// heldResult is what one run of the watchdog workload measured.
type heldResult struct {
	held     int
	cpu      float64 // the share of one core the Guard's process used while it only renewed, in %
	srvCPU   float64 // the share of one core the redis-server used meanwhile, in %
	commands float64 // commands the server ran per second meanwhile
	lost     int     // locks lost by the end
	perLock  float64 // heap bytes per held lock (the Guard's and the locks' own)
	allocs   float64 // heap allocations per renewal (each lock is renewed every heldTTL/3)
}

// BenchmarkHeld holds each size of -held.sizes watchdog locks on one Guard, on a redis-server
// of its own, for -held.run, and reports the CPU of this process (the Guard is all that runs
// in it meanwhile), the server's commands per second, the locks lost and the heap bytes per
// held lock. Run it once per size: -benchtime 1x.
//
//	go test -run '^$' -bench Held -benchtime 1x
func BenchmarkHeld(b *testing.B) {
	for _, n := range sizes(b, *heldSizes) {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				r := runHeld(b, n, *heldRun)
				b.ReportMetric(r.cpu, "cpu-%")
				b.ReportMetric(r.srvCPU, "srv-cpu-%")
				b.ReportMetric(r.commands, "cmds/s")
				b.ReportMetric(float64(r.lost), "lost")
				b.ReportMetric(r.perLock, "B/lock")
				b.ReportMetric(r.allocs, "allocs/renewal")
			}
		})
	}
}

func sizes(tb testing.TB, list string) []int {
	var out []int
	for s := range splitComma(list) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			tb.Fatalf("bad size %q", s)
		}
		out = append(out, n)
	}
	return out
}

func splitComma(s string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for len(s) > 0 {
			i := 0
			for i < len(s) && s[i] != ',' {
				i++
			}
			if !yield(s[:i]) {
				return
			}
			if i == len(s) {
				return
			}
			s = s[i+1:]
		}
	}
}

// runHeld takes n watchdog locks on one Guard and watches them for run.
func runHeld(tb testing.TB, n int, run time.Duration) heldResult {
	srv := testserver.StartRedis(tb)
	client, _ := newClient(tb, srv.Addr)
	g := guard.New(redisstore.New(client), guard.WithWatchdogTimeout(heldTTL))
	defer func() { _ = g.Close(context.Background()) }()
	ctx := context.Background()

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	locks := make([]*guard.Lock, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 4 { // gently: the server renews the locks taken first meanwhile
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				l, err := g.TryAcquire(ctx, fmt.Sprintf("bench:held:%d", i))
				if err != nil {
					failed.Store(err)
					return
				}
				locks[i] = l
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		tb.Fatal(err)
	}
	perLock := float64(heap()-before) / float64(n)
	lostNow := func() (k int) {
		for _, l := range locks {
			if l != nil && l.Err() != nil {
				k++
			}
		}
		return k
	}
	if k := lostNow(); k > 0 {
		tb.Logf("%d locks lost while the others were taken", k)
	}

	// Watch a whole renewal period first: the locks taken first are renewed while the
	// rest are taken.
	time.Sleep(heldTTL / 3)
	cmds0, srv0 := commands(tb, srv.Addr), serverCPU(tb, client)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0, wall0 := cpuTime(), time.Now()
	if *heldProfile != "" {
		f, err := os.Create(*heldProfile)
		if err != nil {
			tb.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			tb.Fatal(err)
		}
		defer f.Close()
	}
	time.Sleep(run)
	if *heldProfile != "" {
		pprof.StopCPUProfile()
	}
	cpu, wall := cpuTime()-cpu0, time.Since(wall0)
	runtime.ReadMemStats(&m1)
	renewals := float64(n) * wall.Seconds() / (heldTTL / 3).Seconds()
	cmds := commands(tb, srv.Addr) - cmds0
	srvCPU := serverCPU(tb, client) - srv0
	lost := 0
	for _, l := range locks {
		if l.Err() != nil {
			if lost == 0 {
				tb.Logf("first lost: %v", context.Cause(l.Context()))
			}
			lost++
		}
	}
	for _, l := range locks {
		_ = l.Release(ctx)
	}
	return heldResult{held: n, cpu: 100 * cpu.Seconds() / wall.Seconds(),
		srvCPU:   100 * srvCPU.Seconds() / wall.Seconds(),
		commands: float64(cmds) / wall.Seconds(), lost: lost, perLock: perLock,
		allocs: float64(m1.Mallocs-m0.Mallocs) / renewals}
}

// commands returns how many scripts (EVALSHA and EVAL: the commands a Guard sends) the server
// at addr has run; the commands the scripts call are not counted.
func commands(tb testing.TB, addr string) int64 {
	info, err := testserver.RedisInfo(context.Background(), addr, "commandstats")
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for _, key := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		stat, _, _ := strings.Cut(info[key], ",")
		if calls, ok := strings.CutPrefix(stat, "calls="); ok {
			c, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			n += c
		}
	}
	return n
}

// cpuTime returns the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
