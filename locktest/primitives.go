package locktest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// sharing skips a test of shared holds on a backend whose harness says it has none, and
// fails it on one that should.
func sharing(t *testing.T, h Harness) {
	t.Helper()
	if h.NoSharing {
		t.Skip("the harness says the backend has no shared holds (guard.Sharing)")
	}
	if _, ok := h.New(t).Backend.(guard.Sharing); !ok {
		t.Fatal("the backend does not implement guard.Sharing; set Harness.NoSharing if it is not meant to")
	}
}

// testSemaphore runs guards × workers goroutines on one semaphore: never more than its permits
// inside at once, every permit with its own fence, and the permit of a holder that never
// releases it (a dead one) comes back when its lease ends.
func testSemaphore(t *testing.T, h Harness) {
	sharing(t, h)
	const (
		guards, workers = 3, 4
		permits         = 3
		total           = 300
	)
	name := uniqueName(t)
	var inside, most, done, over atomic.Int32
	fences := sync.Map{}
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for range guards {
		g, _ := newGuard(t, h, guard.WithWatchdogTimeout(5*time.Second))
		sem, err := g.Semaphore(name, permits)
		require.NoError(t, err)
		for range workers {
			wg.Go(func() {
				for done.Load() < total {
					err := sem.Do(ctx, func(ctx context.Context) error {
						n := inside.Add(1)
						defer inside.Add(-1)
						if n > permits {
							over.Add(1)
						}
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						l, _ := guard.FromContext(ctx)
						if _, dup := fences.LoadOrStore(l.Fence(), true); dup {
							t.Errorf("fence %d given twice", l.Fence())
						}
						for range 3 {
							runtime.Gosched()
						}
						// Long enough beside a polling backend's round trips (FerretDB: a few
						// ms) for the permits to be all in use at times.
						time.Sleep(10 * time.Millisecond)
						done.Add(1)
						return nil
					})
					if err != nil {
						t.Errorf("Do: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	assert.Zero(t, over.Load(), "more holders than permits at once")
	assert.Equal(t, int32(permits), most.Load(), "the permits were never all in use: the test shows nothing")

	// A holder that dies keeps its permit only until its lease runs out.
	g, _ := newGuard(t, h)
	sem, err := g.Semaphore(name+":dead", 1)
	require.NoError(t, err)
	_, err = sem.Acquire(t.Context(), guard.LeaseTime(300*time.Millisecond)) // never released
	require.NoError(t, err)
	other, _ := newGuard(t, h)
	sem2, err := other.Semaphore(name+":dead", 1)
	require.NoError(t, err)
	start := time.Now()
	l, err := sem2.Acquire(t.Context(), guard.WaitTime(5*time.Second))
	require.NoError(t, err, "the dead holder's permit never came back")
	assert.Less(t, time.Since(start), 3*time.Second)
	require.NoError(t, l.Release(t.Context()))
}

// testRWMutex: readers hold the name together, a writer alone, and a writer that waits is not
// passed by readers that come after it.
func testRWMutex(t *testing.T, h Harness) {
	sharing(t, h)
	name := uniqueName(t)
	g1, _ := newGuard(t, h)
	g2, _ := newGuard(t, h)
	rw1, err := g1.RWMutex(name)
	require.NoError(t, err)
	rw2, err := g2.RWMutex(name)
	require.NoError(t, err)

	r1, err := rw1.RLock(t.Context())
	require.NoError(t, err)
	r2, err := rw2.RLock(t.Context(), guard.WaitTime(0))
	require.NoError(t, err, "two readers could not hold the name together")
	assert.Equal(t, guard.KindRead, r2.Kind())
	assert.NotEqual(t, r1.Fence(), r2.Fence(), "each reader has its own fence")
	_, err = rw2.Lock(t.Context(), guard.WaitTime(0))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a writer got in beside readers")

	// A writer waits; a reader that comes after it must not pass it.
	wrote := make(chan *guard.Lock, 1)
	go func() {
		w, err := rw2.Lock(context.Background(), guard.WaitTime(30*time.Second))
		if err != nil {
			t.Errorf("writer: %v", err)
		}
		wrote <- w
	}()
	require.Eventually(t, func() bool {
		l, err := rw1.RLock(t.Context(), guard.WaitTime(0))
		if err == nil {
			_ = l.Release(t.Context()) // the writer has not queued yet
		}
		return errors.Is(err, guard.ErrNotAcquired)
	}, 10*time.Second, 5*time.Millisecond, "a reader passed the waiting writer")
	require.NoError(t, r1.Release(t.Context()))
	require.NoError(t, r2.Release(t.Context()))
	w := <-wrote
	require.NotNil(t, w)
	_, err = rw1.RLock(t.Context(), guard.WaitTime(0))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a reader got in beside the writer")
	assert.Greater(t, w.Fence(), r2.Fence())
	require.NoError(t, w.Release(t.Context()))
	r, err := rw1.RLock(t.Context(), guard.WaitTime(5*time.Second))
	require.NoError(t, err)
	require.NoError(t, r.Release(t.Context()))

	// Many goroutines: never a writer with anyone else.
	var readers, writers, bad, reads atomic.Int32
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 8 {
		rw := rw1
		if i%2 == 1 {
			rw = rw2
		}
		wg.Go(func() {
			for j := range 30 {
				write := (i+j)%4 == 0
				var l *guard.Lock
				var err error
				if write {
					l, err = rw.Lock(ctx)
				} else {
					l, err = rw.RLock(ctx)
				}
				if err != nil {
					t.Errorf("lock: %v", err)
					return
				}
				if write {
					if writers.Add(1) > 1 || readers.Load() > 0 {
						bad.Add(1)
					}
				} else {
					readers.Add(1)
					reads.Add(1)
					if writers.Load() > 0 {
						bad.Add(1)
					}
				}
				time.Sleep(time.Millisecond)
				if write {
					writers.Add(-1)
				} else {
					readers.Add(-1)
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, bad.Load(), "a writer held the name with someone else")
}

// testAcquireAll: goroutines take overlapping sets of names in every order, and none waits
// for another in a circle; a set one of whose names is busy is not taken at all; and the
// group's context ends when one of its locks is lost.
func testAcquireAll(t *testing.T, h Harness) {
	base := uniqueName(t)
	names := []string{base + ":a", base + ":b", base + ":c", base + ":d"}
	g1, _ := newGuard(t, h)
	g2, _ := newGuard(t, h)

	var inside [4]atomic.Int32
	var bad atomic.Int32
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 8 {
		g := g1
		if i%2 == 1 {
			g = g2
		}
		wg.Go(func() {
			for j := range 20 {
				pick := []int{(i + j) % 4, (i + 2*j + 1) % 4, (3*i + j + 2) % 4}
				slices.Reverse(pick) // callers ask in every order
				var set []string
				for _, k := range pick {
					set = append(set, names[k])
				}
				l, err := g.AcquireAll(ctx, set)
				if err != nil {
					t.Errorf("AcquireAll: %v", err)
					return
				}
				held := slices.Compact(slices.Sorted(slices.Values(pick)))
				for _, k := range held {
					if inside[k].Add(1) > 1 {
						bad.Add(1)
					}
				}
				time.Sleep(time.Millisecond)
				for _, k := range held {
					inside[k].Add(-1)
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, bad.Load(), "two groups held one name at once")

	// All or nothing: with one name busy, none of the others is taken.
	busy, err := g2.Acquire(t.Context(), names[2])
	require.NoError(t, err)
	_, err = g1.AcquireAll(t.Context(), names, guard.WaitTime(0))
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	for _, n := range []string{names[0], names[1], names[3]} {
		l, err := g2.TryAcquire(t.Context(), n)
		require.NoError(t, err, "%s stayed held by a group that failed", n)
		require.NoError(t, l.Release(t.Context()))
	}
	require.NoError(t, busy.Release(t.Context()))

	// One member lost, the group lost.
	if h.Delete == nil {
		return
	}
	g3, _ := newGuard(t, h, guard.WithWatchdogTimeout(900*time.Millisecond))
	l, err := g3.AcquireAll(t.Context(), names[:2])
	require.NoError(t, err)
	require.Len(t, l.Members(), 2)
	h.Delete(t, names[1])
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the group's context outlived one of its locks")
	}
	assert.ErrorIs(t, l.Err(), guard.ErrLockLost)
	_ = l.Release(t.Context())
}

// testElection: one leader at a time among the candidates; Leader and Observe see each term,
// in order, with the value its leader published; a resigned term passes on at once.
func testElection(t *testing.T, h Harness) {
	name := uniqueName(t)
	const candidates = 3
	observer, _ := newGuard(t, h)
	watch, err := guard.NewElection(observer, name)
	require.NoError(t, err)
	_, err = watch.Leader(t.Context())
	require.ErrorIs(t, err, guard.ErrNoLeader)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var observed []guard.Leader
	var observedMu sync.Mutex
	observing := make(chan struct{})
	go func() {
		defer close(observing)
		for l := range watch.Observe(ctx) {
			observedMu.Lock()
			observed = append(observed, l)
			observedMu.Unlock()
		}
	}()

	clock := watchClock(t)
	var leading, bad, lost atomic.Int32
	var terms sync.Map // fence → value
	var wg sync.WaitGroup
	for i := range candidates {
		g, _ := newGuard(t, h, guard.WithWatchdogTimeout(2*time.Second))
		e, err := guard.NewElection(g, name)
		require.NoError(t, err)
		wg.Go(func() {
			for range 2 {
				term, err := e.Campaign(t.Context(), fmt.Sprint("candidate-", i))
				if err != nil {
					t.Errorf("Campaign: %v", err)
					return
				}
				if leading.Add(1) > 1 {
					bad.Add(1)
				}
				terms.Store(term.Fence(), fmt.Sprint("candidate-", i))
				l, err := e.Leader(t.Context())
				if assert.NoError(t, err) {
					assert.Equal(t, term.Fence(), l.Fence)
					assert.Equal(t, fmt.Sprint("candidate-", i), l.Value)
				}
				assert.NoError(t, e.Check())
				select {
				case <-time.After(1200 * time.Millisecond): // long enough for Observe to see the term
				case <-term.Done(): // a leader that lost its term leads no more
				}
				leading.Add(-1)
				if term.Err() != nil {
					lost.Add(1)
					_ = e.Resign(t.Context())
					continue
				}
				assert.NoError(t, e.Resign(t.Context()))
			}
		})
	}
	wg.Wait()
	cancel()
	<-observing
	if (bad.Load() > 0 || lost.Load() > 0) && clock.stepped(t) {
		// A step forward of the servers' clock ends every lease at once; another candidate may
		// win before a leader's Guard notices (docs/operations.md#clocks). Nothing to check.
		return
	}
	assert.Zero(t, bad.Load(), "two leaders at once")
	assert.Zero(t, lost.Load(), "a leader lost its term")
	var last uint64
	for _, l := range observed {
		require.Greater(t, l.Fence, last, "Observe went back in time")
		last = l.Fence
		want, ok := terms.Load(l.Fence)
		require.True(t, ok, "Observe saw a term nobody campaigned for: %+v", l)
		assert.Equal(t, want, l.Value)
	}
	assert.Len(t, observed, 2*candidates, "Observe missed terms")
}
