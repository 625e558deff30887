package locktest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/guardlock/guard"
)

// Bench runs the backend benchmarks: an uncontended acquire+release, and a contended hand-off
// of one name between Guards with their own clients. Each reports allocations, and round trips
// per operation when the harness can count them.
func Bench(b *testing.B, h Harness) {
	b.Run("AcquireRelease", func(b *testing.B) { benchAcquireRelease(b, h) })
	b.Run("Handoff", func(b *testing.B) { benchHandoff(b, h) })
}

// benchAcquireRelease takes and gives back one free name: the cost a caller pays when nobody
// else wants the lock.
func benchAcquireRelease(b *testing.B, h Harness) {
	g, target := newGuard(b, h)
	name := uniqueName(b)
	ctx := context.Background()
	var before int64
	if target.RoundTrips != nil {
		before = target.RoundTrips()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		l, err := g.TryAcquire(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if target.RoundTrips != nil {
		b.ReportMetric(float64(target.RoundTrips()-before)/float64(b.N), "roundtrips/op")
	}
}

// benchHandoff has 2 Guards × 4 goroutines take turns on ONE name; an op is one acquisition,
// so ns/op is the time from one holder's release to the next holder's grant, plus the section.
func benchHandoff(b *testing.B, h Harness) {
	const guards, workers = 2, 4
	name := uniqueName(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var counters []func() int64
	gs := make([]*guard.Guard, guards)
	for i := range gs {
		var target Target
		gs[i], target = newGuard(b, h)
		if target.RoundTrips != nil {
			counters = append(counters, target.RoundTrips)
		}
	}
	total := func() (n int64) {
		for _, c := range counters {
			n += c()
		}
		return n
	}
	before := total()
	var (
		mu   sync.Mutex // protects left
		left = b.N
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if left == 0 {
			return false
		}
		left--
		return true
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, g := range gs {
		for range workers {
			wg.Go(func() {
				for take() {
					if err := g.Do(ctx, name, func(context.Context) error { return nil }); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	b.StopTimer()
	if len(counters) > 0 {
		b.ReportMetric(float64(total()-before)/float64(b.N), "roundtrips/op")
	}
}
