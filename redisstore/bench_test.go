package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
)

// BenchmarkPrimitives measures the primitives on a single node, a Cluster and a
// Sentinel-managed master (locktest.BenchPrimitives: uncontended permits, read and write
// locks, AcquireAll of four names — spread over slots on a Cluster — and hand-overs), and
// AcquireAll of four names of one Cluster slot. Each reports allocations and round trips per
// operation.
func BenchmarkPrimitives(b *testing.B) {
	for _, dep := range deployments[:3] {
		b.Run(dep.name, func(b *testing.B) {
			d := dep.start(b)
			locktest.BenchPrimitives(b, d.harness(b))
			b.Run("AcquireAll4OneSlot", func(b *testing.B) {
				g, rt := d.guard(b)
				names := sameSlot(uniqueName(b, "slot"), "a", "b", "c", "d")
				benchOp(b, rt, func(ctx context.Context) (*guard.Lock, error) { return g.AcquireAll(ctx, names, guard.WaitTime(0)) })
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
