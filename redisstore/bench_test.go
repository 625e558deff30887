package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
)

// BenchmarkPrimitives measures the primitives on a single node, a Cluster and a
// Sentinel-managed master: an uncontended permit, read lock and write lock (acquire and
// release), AcquireAll of four names of one Cluster slot and of four names spread over slots,
// and the hand-over of a permit, and between a reader and a writer, to an instance that waits
// for it (locktest.Handoff). Each reports allocations and round trips per operation.
func BenchmarkPrimitives(b *testing.B) {
	for _, dep := range deployments[:3] {
		b.Run(dep.name, func(b *testing.B) {
			d := dep.start(b)
			b.Run("SemaphoreAcquireRelease", func(b *testing.B) {
				g, rt := d.guard(b)
				sem, err := g.Semaphore(uniqueName(b, "sem"), 3)
				if err != nil {
					b.Fatal(err)
				}
				benchOp(b, rt, func(ctx context.Context) (*guard.Lock, error) { return sem.TryAcquire(ctx) })
			})
			b.Run("RLockRelease", func(b *testing.B) {
				g, rt := d.guard(b)
				rw, err := g.RWMutex(uniqueName(b, "rw"))
				if err != nil {
					b.Fatal(err)
				}
				benchOp(b, rt, func(ctx context.Context) (*guard.Lock, error) { return rw.RLock(ctx, guard.WaitTime(0)) })
			})
			b.Run("WriteLockRelease", func(b *testing.B) {
				g, rt := d.guard(b)
				rw, err := g.RWMutex(uniqueName(b, "rw"))
				if err != nil {
					b.Fatal(err)
				}
				benchOp(b, rt, func(ctx context.Context) (*guard.Lock, error) { return rw.Lock(ctx, guard.WaitTime(0)) })
			})
			b.Run("AcquireAll4OneSlot", func(b *testing.B) {
				g, rt := d.guard(b)
				names := sameSlot(uniqueName(b, "slot"), "a", "b", "c", "d")
				benchOp(b, rt, func(ctx context.Context) (*guard.Lock, error) { return g.AcquireAll(ctx, names, guard.WaitTime(0)) })
			})
			b.Run("AcquireAll4Spread", func(b *testing.B) {
				g, rt := d.guard(b)
				base := uniqueName(b, "spread")
				names := []string{base + ":a", base + ":b", base + ":c", base + ":d"}
				benchOp(b, rt, func(ctx context.Context) (*guard.Lock, error) { return g.AcquireAll(ctx, names, guard.WaitTime(0)) })
			})
			b.Run("SemaphoreHandoff", func(b *testing.B) {
				var lockers [2]locktest.Locker
				var counts [2]func() int64
				for i := range lockers {
					g, rt := d.guard(b)
					sem, err := g.Semaphore(uniqueName(b, "handoff"), 1)
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
					counts[i] = rt
				}
				locktest.Handoff(b, "", lockers, func() int64 { return counts[0]() + counts[1]() })
			})
			b.Run("ReadWriteHandoff", func(b *testing.B) {
				var lockers [2]locktest.Locker
				var counts [2]func() int64
				for i := range lockers {
					g, rt := d.guard(b)
					rw, err := g.RWMutex(uniqueName(b, "handoff"))
					if err != nil {
						b.Fatal(err)
					}
					take := rw.RLock // instance 0 reads, instance 1 writes: each waits for the other
					if i == 1 {
						take = rw.Lock
					}
					lockers[i] = func(ctx context.Context, _ string) (func() error, error) {
						l, err := take(ctx)
						if err != nil {
							return nil, err
						}
						return func() error { return l.Release(ctx) }, nil
					}
					counts[i] = rt
				}
				locktest.Handoff(b, "", lockers, func() int64 { return counts[0]() + counts[1]() })
			})
		})
	}
}

// guard returns a Guard on a new counted client of d, closed when the benchmark ends, and its
// round-trip counter.
func (d *deployment) guard(b *testing.B) (*guard.Guard, func() int64) {
	s, rt := d.counted(b)
	g := guard.New(s)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	})
	return g, rt.Load
}

// benchOp takes a lock with take and releases it, b.N times, after one warm-up round (scripts
// loaded, connections open), and reports round trips per op.
func benchOp(b *testing.B, roundTrips func() int64, take func(context.Context) (*guard.Lock, error)) {
	ctx := context.Background()
	once := func() {
		l, err := take(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	once()
	before := roundTrips()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		once()
	}
	b.StopTimer()
	b.ReportMetric(float64(roundTrips()-before)/float64(b.N), "roundtrips/op")
}
