package lease

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var watchRun = flag.Duration("watch.run", 3*time.Second, "how long BenchmarkWatch watches each case once its leases are held")

// BenchmarkWatch is the scheduler's own share of issue 21's P4, without a network or a driver:
// it holds n watchdog leases of a 3 s TTL (each renewed every second), taken over a second, on
// a scheduler whose backend answers after 5 µs per lease, and reports the CPU used and the
// allocations made per renewal while they are only renewed.
func BenchmarkWatch(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			for range b.N {
				r := watch(n, *watchRun)
				b.ReportMetric(r.cpu, "cpu-%")
				b.ReportMetric(r.allocs, "allocs/renewal")
				b.ReportMetric(float64(r.lost), "lost")
			}
		})
	}
}

type watched struct {
	cpu    float64 // share of a core, in %
	allocs float64 // per renewal
	lost   int
}

func watch(n int, run time.Duration) watched {
	var renewals atomic.Int64
	s := New(func(_ context.Context, batch []Request) ([]Result, []error) {
		renewals.Add(int64(len(batch)))
		time.Sleep(time.Duration(len(batch)) * 5 * time.Microsecond) // the server's work
		res := make([]Result, len(batch))
		for i := range res {
			res[i] = Renewed
		}
		return res, make([]error, len(batch))
	}, nil)
	defer s.Close()
	ls := make([]Lease, n)
	for i := range ls {
		ls[i].Name, ls[i].Token, ls[i].Owner = fmt.Sprint("held:", i), "t", nopOwner{}
		if i%(n/100) == 0 {
			time.Sleep(10 * time.Millisecond) // taken over a second, as a service takes them
		}
		now := time.Now()
		s.Add(&ls[i], Grant{Start: now, HeldAt: now, Granted: 3 * time.Second, Renew: 3 * time.Second})
	}
	time.Sleep(2 * time.Second)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	r0, cpu0, wall0 := renewals.Load(), cpuTime(), time.Now()
	time.Sleep(run)
	used, wall := cpuTime()-cpu0, time.Since(wall0)
	runtime.ReadMemStats(&m1)
	return watched{
		cpu:    100 * used.Seconds() / wall.Seconds(),
		allocs: float64(m1.Mallocs-m0.Mallocs) / float64(renewals.Load()-r0),
		lost:   n - s.Len(),
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nopOwner hears of its lease and does nothing, as a Guard's lock without an observer does.
type nopOwner struct{}

func (nopOwner) Renewed(time.Time)      {}
func (nopOwner) RenewFailed(error)      {}
func (nopOwner) Ended(EndReason, error) {}
