package bench

import (
	"context"
	"errors"
	"flag"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
)

// The contended workload of issue 11: workers goroutines on ONE name, each holding the lock
// for holdFor and then working for twice as long before it asks again, for the run's duration.
const (
	workers   = 16
	holdFor   = time.Millisecond // and work for twice as long
	contLease = 10 * time.Second
)

var contentionRun = flag.Duration("contention.run", 3*time.Second, "how long each BenchmarkContention case runs")

// contender is a lock library as one instance of a service uses it: lock waits for name.
type contender struct {
	name string
	// open returns a lock function on client for one instance.
	open func(tb testing.TB, client *redis.Client) func(ctx context.Context, name string) (unlock func(), err error)
}

var contenders = []contender{
	{"guard", func(tb testing.TB, client *redis.Client) func(context.Context, string) (func(), error) {
		g := guard.New(redisstore.New(client))
		tb.Cleanup(func() { _ = g.Close(context.Background()) })
		return guardContender(g)
	}},
	redislockContender("redislock-1ms", time.Millisecond),
	// redislock's README waits with a linear backoff of 100 ms.
	redislockContender("redislock-100ms", 100*time.Millisecond),
	redsyncContender("redsync-default", nil),
	redsyncContender("redsync-1ms", []redsync.Option{redsync.WithRetryDelay(time.Millisecond)}),
}

// guardContender is the contended workload's lock function on a Guard: Acquire with a lease
// time of contLease, then Release.
func guardContender(g *guard.Guard) func(context.Context, string) (func(), error) {
	return func(ctx context.Context, name string) (func(), error) {
		l, err := g.Acquire(ctx, name, guard.LeaseTime(contLease))
		if err != nil {
			return nil, err
		}
		return func() { _ = l.Release(ctx) }, nil
	}
}

func redislockContender(name string, poll time.Duration) contender {
	return contender{name, func(tb testing.TB, client *redis.Client) func(context.Context, string) (func(), error) {
		c := redislock.New(client)
		opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(poll)}
		return func(ctx context.Context, name string) (func(), error) {
			l, err := c.Obtain(ctx, name, contLease, opt)
			if err != nil {
				return nil, err
			}
			return func() { _ = l.Release(ctx) }, nil
		}
	}}
}

func redsyncContender(name string, opts []redsync.Option) contender {
	return contender{name, func(tb testing.TB, client *redis.Client) func(context.Context, string) (func(), error) {
		rs := redsync.New(goredis.NewPool(client))
		opts := append([]redsync.Option{redsync.WithExpiry(contLease), redsync.WithTries(math.MaxInt32)}, opts...)
		return func(ctx context.Context, name string) (func(), error) {
			m := rs.NewMutex(name, opts...)
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() { _, _ = m.UnlockContext(ctx) }, nil
		}
	}}
}

// BenchmarkContention runs the contended workload for each library, with all workers in one
// instance and with 4 instances of 4, and reports utilisation (time the lock was held over
// wall time), the median and 99th percentile wait, and Redis commands per acquisition. An
// in-process channel mutex gives the ideal. The run's length is -contention.run, not b.N.
func BenchmarkContention(b *testing.B) {
	srv := testserver.StartRedis(b)
	b.Run("chan-mutex/1x16", func(b *testing.B) {
		mu := make(chan struct{}, 1)
		lock := func(ctx context.Context, _ string) (func(), error) {
			select {
			case mu <- struct{}{}:
				return func() { <-mu }, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		contend(b, []func(context.Context, string) (func(), error){lock}, nil)
	})
	for _, c := range contenders {
		for _, instances := range []int{1, 4} {
			b.Run(c.name+"/"+map[int]string{1: "1x16", 4: "4x4"}[instances], func(b *testing.B) {
				var locks []func(context.Context, string) (func(), error)
				var counters []*testserver.RoundTrips
				for range instances {
					client, cnt := newClient(b, srv.Addr)
					locks = append(locks, c.open(b, client))
					counters = append(counters, cnt)
				}
				contend(b, locks, counters)
			})
		}
	}
}

// contend runs the workload with the workers spread over the instances' lock functions.
func contend(b *testing.B, locks []func(context.Context, string) (func(), error), counters []*testserver.RoundTrips) {
	commands := func() (n int64) {
		for _, c := range counters {
			n += c.Load()
		}
		return n
	}
	before := commands()
	b.ResetTimer()
	r := contendFor("bench:contention:"+b.Name(), locks, workers, holdFor, *contentionRun)
	b.StopTimer()
	if r.overlaps > 0 {
		b.Errorf("%d overlapping holders", r.overlaps)
	}
	if r.acquired == 0 {
		b.Fatal("no acquisition")
	}
	b.ReportMetric(r.util, "util-%")
	b.ReportMetric(r.p50, "p50-ms")
	b.ReportMetric(r.p99, "p99-ms")
	b.ReportMetric(r.perSecond, "acq/s")
	if counters != nil {
		b.ReportMetric(float64(commands()-before)/float64(r.acquired), "cmds/acq")
	}
	if r.failures > 0 {
		b.ReportMetric(float64(r.failures), "failures")
	}
}

// contention is what one run of the contended workload measured.
type contention struct {
	util               float64 // time the lock was held over wall time, in %
	p50, p99           float64 // waits, in ms
	perSecond          float64 // acquisitions per second
	acquired           int
	overlaps, failures int32
}

// contendFor runs n workers on name for run, spread over the instances' lock functions: each
// holds the lock for hold, then works for twice as long before it asks again.
func contendFor(name string, locks []func(context.Context, string) (func(), error), n int, hold, run time.Duration) contention {
	ctx, cancel := context.WithTimeout(context.Background(), run+time.Minute)
	defer cancel()
	var (
		mu       sync.Mutex // protects waits
		waits    []time.Duration
		held     atomic.Int64 // ns
		inside   atomic.Int32
		overlaps atomic.Int32
		failures atomic.Int32
	)
	start := time.Now()
	stop := start.Add(run)
	var wg sync.WaitGroup
	for i := range n {
		lock := locks[i%len(locks)]
		wg.Go(func() {
			for time.Now().Before(stop) {
				asked := time.Now()
				unlock, err := lock(ctx, name)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						failures.Add(1)
					}
					continue
				}
				got := time.Now()
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				time.Sleep(hold)
				inside.Add(-1)
				held.Add(int64(time.Since(got)))
				unlock()
				mu.Lock()
				waits = append(waits, got.Sub(asked))
				mu.Unlock()
				time.Sleep(2 * hold)
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	r := contention{acquired: len(waits), overlaps: overlaps.Load(), failures: failures.Load()}
	if len(waits) == 0 {
		return r
	}
	slices.Sort(waits)
	pct := func(p float64) float64 { return float64(waits[int(p*float64(len(waits)-1))]) / 1e6 }
	r.util = 100 * float64(held.Load()) / float64(wall)
	r.p50, r.p99 = pct(0.5), pct(0.99)
	r.perSecond = float64(len(waits)) / wall.Seconds()
	return r
}
