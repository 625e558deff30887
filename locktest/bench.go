package locktest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardlock/guard"
)

// Bench runs the backend benchmarks: an uncontended acquire+release, and a contended hand-off
// of one name between two Guards with their own clients. Each reports allocations, and round
// trips per operation when the harness can count them.
func Bench(b *testing.B, h Harness) {
	b.Run("AcquireRelease", func(b *testing.B) { benchAcquireRelease(b, h) })
	b.Run("Handoff", func(b *testing.B) { benchHandoff(b, h, mutex) })
}

// BenchPrimitives runs the benchmarks of the primitives: a permit of a semaphore of three, a
// read lock and a write lock taken and given back uncontended, AcquireAll of four names, and
// the hand-over of a one-permit semaphore, of a write lock to a writer, and between a reader
// and a writer, each between two Guards with their own clients (Handoff). Each reports
// allocations, and round trips per operation when the harness can count them.
func BenchPrimitives(b *testing.B, h Harness) {
	semaphore := func(permits int) func(*guard.Guard, int, string) (taker, error) {
		return func(g *guard.Guard, _ int, name string) (taker, error) {
			sem, err := g.Semaphore(name, permits)
			if err != nil {
				return nil, err
			}
			if permits == 1 {
				return func(ctx context.Context) (*guard.Lock, error) { return sem.Acquire(ctx) }, nil
			}
			return func(ctx context.Context) (*guard.Lock, error) { return sem.TryAcquire(ctx) }, nil
		}
	}
	// rw takes the read side when read says so for instance i, else the write side.
	rw := func(read func(i int) bool, opts ...guard.LockOption) func(*guard.Guard, int, string) (taker, error) {
		return func(g *guard.Guard, i int, name string) (taker, error) {
			m, err := g.RWMutex(name)
			if err != nil {
				return nil, err
			}
			if read(i) {
				return func(ctx context.Context) (*guard.Lock, error) { return m.RLock(ctx, opts...) }, nil
			}
			return func(ctx context.Context) (*guard.Lock, error) { return m.Lock(ctx, opts...) }, nil
		}
	}
	always := func(int) bool { return true }
	never := func(int) bool { return false }
	b.Run("SemaphoreAcquireRelease", func(b *testing.B) { benchOp(b, h, semaphore(3)) })
	b.Run("RLockRelease", func(b *testing.B) { benchOp(b, h, rw(always, guard.WaitTime(0))) })
	b.Run("WriteLockRelease", func(b *testing.B) { benchOp(b, h, rw(never, guard.WaitTime(0))) })
	b.Run("AcquireAll4", func(b *testing.B) {
		benchOp(b, h, func(g *guard.Guard, _ int, name string) (taker, error) {
			names := []string{name + ":a", name + ":b", name + ":c", name + ":d"}
			return func(ctx context.Context) (*guard.Lock, error) { return g.AcquireAll(ctx, names, guard.WaitTime(0)) }, nil
		})
	})
	b.Run("SemaphoreHandoff", func(b *testing.B) { benchHandoff(b, h, semaphore(1)) })
	b.Run("WriterHandoff", func(b *testing.B) { benchHandoff(b, h, rw(never)) })
	// Instance 0 reads and instance 1 writes: each waits for the other.
	b.Run("ReadWriteHandoff", func(b *testing.B) { benchHandoff(b, h, rw(func(i int) bool { return i == 0 })) })
}

// taker takes a lock, as prepared for one Guard and one name.
type taker func(ctx context.Context) (*guard.Lock, error)

// mutex prepares g's plain lock of name, waiting for it.
func mutex(g *guard.Guard, _ int, name string) (taker, error) {
	return func(ctx context.Context) (*guard.Lock, error) { return g.Acquire(ctx, name) }, nil
}

// benchAcquireRelease takes and gives back one free name: the cost a caller pays when nobody
// else wants the lock.
func benchAcquireRelease(b *testing.B, h Harness) {
	benchOp(b, h, func(g *guard.Guard, _ int, name string) (taker, error) {
		return func(ctx context.Context) (*guard.Lock, error) { return g.TryAcquire(ctx, name) }, nil
	})
}

// benchOp takes a lock on a free name as prepare makes it and gives it back, b.N times, after
// one warm-up round (statements prepared, scripts loaded, connections open), on a Guard of its
// own.
func benchOp(b *testing.B, h Harness, prepare func(g *guard.Guard, i int, name string) (taker, error)) {
	g, target := newGuard(b, h)
	take, err := prepare(g, 0, uniqueName(b))
	if err != nil {
		b.Fatal(err)
	}
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
	var before int64
	if target.RoundTrips != nil {
		before = target.RoundTrips()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		once()
	}
	b.StopTimer()
	if target.RoundTrips != nil {
		b.ReportMetric(float64(target.RoundTrips()-before)/float64(b.N), "roundtrips/op")
	}
}

// benchHandoff passes one name back and forth between two Guards with their own clients;
// instance i (0 or 1) takes it as prepare makes it.
func benchHandoff(b *testing.B, h Harness, prepare func(g *guard.Guard, i int, name string) (taker, error)) {
	name := uniqueName(b)
	var lockers [2]Locker
	var counters []func() int64
	for i := range lockers {
		g, target := newGuard(b, h)
		take, err := prepare(g, i, name)
		if err != nil {
			b.Fatal(err)
		}
		lockers[i] = func(ctx context.Context, _ string) (func() error, error) {
			l, err := take(ctx)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}
		if target.RoundTrips != nil {
			counters = append(counters, target.RoundTrips)
		}
	}
	var roundTrips func() int64
	if len(counters) == len(lockers) {
		roundTrips = func() int64 { return counters[0]() + counters[1]() }
	}
	Handoff(b, name, lockers, roundTrips)
}

// Locker takes the lock called name, waiting for it, and returns its release. Benchmarks of
// other lock libraries wrap them in one to run Handoff.
type Locker func(ctx context.Context, name string) (unlock func() error, err error)

// HandoffSection is how long each holder keeps the lock in Handoff.
const HandoffSection = 200 * time.Microsecond

// Handoff measures how fast a lock passes from one instance to another that is waiting for
// it. Two instances take turns on ONE name: each holds the lock for HandoffSection, during
// which the other asks for it and waits; after its release an instance asks again only when
// its turn comes, so that nobody barges back in. An op is one acquisition. handoff-µs/op is
// the wall time of an op minus the time spent holding: the release, the waiter noticing, and
// its grant. With roundTrips, roundtrips/op counts every request both instances sent.
func Handoff(b *testing.B, name string, lockers [2]Locker, roundTrips func() int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var (
		turns  = [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}
		ops    atomic.Int64 // acquisitions so far
		inside atomic.Int32 // holders right now: more than one is a failure
		held   atomic.Int64 // ns spent holding
		before int64
	)
	turns[0] <- struct{}{}
	if roundTrips != nil {
		before = roundTrips()
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for me := range 2 {
		other := 1 - me
		// pass gives the other instance a turn unless it has one already.
		pass := func() {
			select {
			case turns[other] <- struct{}{}:
			default:
			}
		}
		// stop ends the run after a failure: the other instance's wait is cut short, and
		// at its next turn it sees the end.
		stop := func() {
			ops.Store(int64(b.N))
			cancel()
			pass()
		}
		wg.Go(func() {
			for range turns[me] {
				if ops.Load() >= int64(b.N) {
					pass() // let the other one see the end too
					return
				}
				unlock, err := lockers[me](ctx, name)
				if err != nil {
					if ops.Load() < int64(b.N) { // not the other's stop
						b.Error(err)
					}
					stop()
					return
				}
				if inside.Add(1) != 1 {
					b.Error("two holders at once")
				}
				ops.Add(1)
				t0 := time.Now()
				turns[other] <- struct{}{} // the other instance asks for the lock now
				time.Sleep(HandoffSection)
				held.Add(int64(time.Since(t0)))
				inside.Add(-1)
				if err := unlock(); err != nil {
					b.Error(err)
					stop()
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(elapsed.Nanoseconds()-held.Load())/1e3/float64(b.N), "handoff-µs/op")
	if roundTrips != nil {
		b.ReportMetric(float64(roundTrips()-before)/float64(b.N), "roundtrips/op")
	}
}
