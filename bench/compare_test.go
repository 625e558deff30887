package bench

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
	"github.com/guardlock/guard/redisstore"
)

// lib is one lock library under comparison: lock takes name (waiting when wait is set),
// unlock gives it back.
type lib struct {
	name string
	// open returns a locker on client; each instance of a service would have its own.
	open func(tb testing.TB, client *redis.Client) locker
}

type locker func(ctx context.Context, name string, wait bool) (unlock func() error, err error)

const ttl = 30 * time.Second

var libs = []lib{
	{"guard", func(tb testing.TB, client *redis.Client) locker {
		g := guard.New(redisstore.New(client), guard.WithWatchdogTimeout(ttl))
		tb.Cleanup(func() { _ = g.Close(context.Background()) })
		return guardLocker(g)
	}},
	{"redislock", func(tb testing.TB, client *redis.Client) locker {
		c := redislock.New(client)
		// redislock waits by polling; 1 ms is its most eager sensible setting.
		poll := &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)}
		return func(ctx context.Context, name string, wait bool) (func() error, error) {
			var opt *redislock.Options
			if wait {
				opt = poll
			}
			l, err := c.Obtain(ctx, name, ttl, opt)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}
	}},
	{"redsync", func(tb testing.TB, client *redis.Client) locker {
		rs := redsync.New(goredis.NewPool(client))
		return func(ctx context.Context, name string, wait bool) (func() error, error) {
			opts := []redsync.Option{redsync.WithExpiry(ttl), redsync.WithTries(1)}
			if wait {
				// redsync also polls; its default delay is 50-250 ms, 1 ms is the eager end.
				opts = []redsync.Option{redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32),
					redsync.WithRetryDelay(time.Millisecond)}
			}
			m := rs.NewMutex(name, opts...)
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error {
				ok, err := m.UnlockContext(ctx)
				if err == nil && !ok {
					err = errors.New("redsync: not unlocked")
				}
				return err
			}, nil
		}
	}},
}

// guardLocker is the locker of a Guard: TryAcquire, or Acquire when wait is set, without a
// lease time (the watchdog holds the lock), then Release.
func guardLocker(g *guard.Guard) locker {
	return func(ctx context.Context, name string, wait bool) (func() error, error) {
		acquire := g.TryAcquire
		if wait {
			acquire = g.Acquire
		}
		l, err := acquire(ctx, name)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
}

// newClient returns a client on srv with a round-trip counter.
func newClient(tb testing.TB, addr string) (*redis.Client, *testserver.RoundTrips) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	cnt := testserver.CountRoundTrips(c)
	tb.Cleanup(func() { _ = c.Close() })
	return c, cnt
}

// BenchmarkUncontended takes and releases a free name: the cost when nobody else wants it.
func BenchmarkUncontended(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			client, cnt := newClient(b, srv.Addr)
			lock := l.open(b, client)
			ctx := context.Background()
			name := "bench:uncontended:" + l.name
			before := cnt.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				unlock, err := lock(ctx, name, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cnt.Load()-before)/float64(b.N), "roundtrips/op")
		})
	}
}

// BenchmarkUncontendedInterleaved runs the uncontended take-and-release of every library in
// turns of 50 operations, b.N of each in all, and reports each one's median time per operation
// and its ratio to redislock's: on a noisy machine, turns keep slow stretches from landing on
// one library only.
func BenchmarkUncontendedInterleaved(b *testing.B) {
	srv := testserver.StartRedis(b)
	const turn = 50
	ctx := context.Background()
	locks := make([]locker, len(libs))
	for i, l := range libs {
		client, _ := newClient(b, srv.Addr)
		locks[i] = l.open(b, client)
	}
	times := make([][]time.Duration, len(libs))
	b.ResetTimer()
	for done := 0; done < b.N; done += turn {
		for i, lock := range locks {
			name := "bench:interleaved:" + libs[i].name
			start := time.Now()
			for range turn {
				unlock, err := lock(ctx, name, false)
				if err != nil {
					b.Fatal(err)
				}
				if err := unlock(); err != nil {
					b.Fatal(err)
				}
			}
			times[i] = append(times[i], time.Since(start)/turn)
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	base := median(times[slices.IndexFunc(libs, func(l lib) bool { return l.name == "redislock" })])
	for i, l := range libs {
		m := median(times[i])
		b.ReportMetric(float64(m.Microseconds()), l.name+"-µs/op")
		b.ReportMetric(float64(m)/float64(base), l.name+"/redislock")
	}
}

// BenchmarkHandoff passes ONE name back and forth between two instances, each with its own
// client; see locktest.Handoff for what handoff-µs/op measures.
func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			var counters [2]*testserver.RoundTrips
			var lockers [2]locktest.Locker
			for i := range lockers {
				var client *redis.Client
				client, counters[i] = newClient(b, srv.Addr)
				lock := l.open(b, client)
				lockers[i] = func(ctx context.Context, name string) (func() error, error) {
					return lock(ctx, name, true)
				}
			}
			locktest.Handoff(b, "bench:handoff:"+l.name, lockers,
				func() int64 { return counters[0].Load() + counters[1].Load() })
		})
	}
}
