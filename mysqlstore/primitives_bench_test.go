package mysqlstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
)

// BenchmarkPrimitives measures the uncontended cost of each primitive on the store — round
// trips and allocations per op — and the hand-over of a permit between two Guards.
func BenchmarkPrimitives(b *testing.B) {
	benchPrimitives(b, startServer(b).harness())
}

// benchPrimitives runs the benchmarks of BenchmarkPrimitives on h.
func benchPrimitives(b *testing.B, h locktest.Harness) {
	newGuard := func(b *testing.B) (*guard.Guard, locktest.Target) {
		target := h.New(b)
		g := guard.New(target.Backend)
		b.Cleanup(func() { _ = g.Close(context.Background()) })
		return g, target
	}
	// op runs take+release b.N times, after a first run that prepares the statements.
	op := func(b *testing.B, take func(g *guard.Guard, name string) (*guard.Lock, error)) {
		g, target := newGuard(b)
		name := "bench:" + rand.Text()
		ctx := context.Background()
		run := func() {
			l, err := take(g, name)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		run()
		before := target.RoundTrips()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			run()
		}
		b.StopTimer()
		b.ReportMetric(float64(target.RoundTrips()-before)/float64(b.N), "roundtrips/op")
	}
	ctx := context.Background()
	b.Run("SemaphoreAcquireRelease", func(b *testing.B) {
		op(b, func(g *guard.Guard, name string) (*guard.Lock, error) {
			sem, err := g.Semaphore(name, 3)
			if err != nil {
				return nil, err
			}
			return sem.TryAcquire(ctx)
		})
	})
	b.Run("RLockRelease", func(b *testing.B) {
		op(b, func(g *guard.Guard, name string) (*guard.Lock, error) {
			rw, err := g.RWMutex(name)
			if err != nil {
				return nil, err
			}
			return rw.RLock(ctx, guard.WaitTime(0))
		})
	})
	b.Run("WriteLockRelease", func(b *testing.B) {
		op(b, func(g *guard.Guard, name string) (*guard.Lock, error) {
			rw, err := g.RWMutex(name)
			if err != nil {
				return nil, err
			}
			return rw.Lock(ctx, guard.WaitTime(0))
		})
	})
	b.Run("AcquireAll4", func(b *testing.B) {
		op(b, func(g *guard.Guard, name string) (*guard.Lock, error) {
			names := make([]string, 4)
			for i := range names {
				names[i] = fmt.Sprint(name, ":", i)
			}
			return g.AcquireAll(ctx, names, guard.WaitTime(0))
		})
	})
	b.Run("PermitHandoff", func(b *testing.B) {
		// One permit passed back and forth: MySQL cannot wake the other Guard, which asks
		// again with its backoff.
		var lockers [2]locktest.Locker
		var targets [2]locktest.Target
		name := "bench:handoff:" + rand.Text()
		for i := range lockers {
			g, target := newGuard(b)
			targets[i] = target
			sem, err := g.Semaphore(name, 1)
			if err != nil {
				b.Fatal(err)
			}
			lockers[i] = func(ctx context.Context, _ string) (func() error, error) {
				l, err := sem.Acquire(ctx)
				if err != nil {
					return nil, err
				}
				return func() error { return l.Release(ctx) }, nil
			}
		}
		locktest.Handoff(b, name, lockers, func() int64 { return targets[0].RoundTrips() + targets[1].RoundTrips() })
	})
}
