package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// BenchmarkPrimitives measures the primitives on one member: a permit of a semaphore taken and
// given back, a read lock taken and given back, a multi-lock of 4 names taken and given back,
// and the hand-over of a one-permit semaphore and of a write lock between two Guards with
// clients of their own (locktest.Handoff). Each reports allocations and round trips per op.
func BenchmarkPrimitives(b *testing.B) {
	srv := testserver.StartEtcd(b)
	newGuard := func(b *testing.B) (*guard.Guard, func() int64) {
		s, rt := newCounted(b, srv.Endpoints())
		g := guard.New(s)
		b.Cleanup(func() { _ = g.Close(context.Background()) })
		return g, rt.Load
	}
	run := func(b *testing.B, op func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error)) {
		g, rt := newGuard(b)
		name := fmt.Sprint(b.Name(), time.Now().UnixNano())
		ctx := context.Background()
		before := rt()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			l, err := op(ctx, g, name)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(rt()-before)/float64(b.N), "roundtrips/op")
	}
	b.Run("SemaphoreAcquireRelease", func(b *testing.B) {
		run(b, func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error) {
			sem, err := g.Semaphore(name, 3)
			if err != nil {
				return nil, err
			}
			return sem.TryAcquire(ctx)
		})
	})
	b.Run("RLockRelease", func(b *testing.B) {
		run(b, func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error) {
			rw, err := g.RWMutex(name)
			if err != nil {
				return nil, err
			}
			return rw.RLock(ctx, guard.WaitTime(0))
		})
	})
	b.Run("AcquireAll4", func(b *testing.B) {
		run(b, func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error) {
			return g.AcquireAll(ctx, []string{name + ":a", name + ":b", name + ":c", name + ":d"}, guard.WaitTime(0))
		})
	})
	handoff := func(b *testing.B, take func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error)) {
		var lockers [2]locktest.Locker
		var rts [2]func() int64
		for i := range lockers {
			g, rt := newGuard(b)
			rts[i] = rt
			lockers[i] = func(ctx context.Context, name string) (func() error, error) {
				l, err := take(ctx, g, name)
				if err != nil {
					return nil, err
				}
				return func() error { return l.Release(ctx) }, nil
			}
		}
		locktest.Handoff(b, fmt.Sprint(b.Name(), time.Now().UnixNano()), lockers,
			func() int64 { return rts[0]() + rts[1]() })
	}
	b.Run("SemaphoreHandoff", func(b *testing.B) {
		handoff(b, func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error) {
			sem, err := g.Semaphore(name, 1)
			if err != nil {
				return nil, err
			}
			return sem.Acquire(ctx)
		})
	})
	b.Run("WriterHandoff", func(b *testing.B) {
		handoff(b, func(ctx context.Context, g *guard.Guard, name string) (*guard.Lock, error) {
			rw, err := g.RWMutex(name)
			if err != nil {
				return nil, err
			}
			return rw.Lock(ctx)
		})
	})
}
