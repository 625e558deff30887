package locktest

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

// testMutualExclusion runs guards × workers goroutines, each Guard with its own client, all on
// ONE name. Every critical section flags itself and fails on a flag already set, and checks
// that its fence is above the last one seen.
func testMutualExclusion(t *testing.T, h Harness) {
	const (
		guards  = 3
		workers = 8
		total   = 1002 // acquisitions in all
	)
	name := uniqueName(t)
	var (
		inside    atomic.Int32
		overlaps  atomic.Int32
		lastFence atomic.Uint64
		backwards atomic.Int32
		done      atomic.Int32
		perGuard  [guards]atomic.Int32
	)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for gi := range guards {
		g, _ := newGuard(t, h, guard.WithWatchdogTimeout(5*time.Second))
		for range workers {
			wg.Go(func() {
				for done.Load() < total {
					err := g.Do(ctx, name, func(ctx context.Context) error {
						if !inside.CompareAndSwap(0, 1) {
							overlaps.Add(1)
						}
						// Stay inside a while, giving every other goroutine the chance to
						// come in too if exclusion were broken.
						for range 3 {
							runtime.Gosched()
						}
						l, _ := guard.FromContext(ctx)
						if prev := lastFence.Swap(l.Fence()); l.Fence() <= prev {
							backwards.Add(1)
						}
						done.Add(1)
						perGuard[gi].Add(1)
						if !inside.CompareAndSwap(1, 0) {
							overlaps.Add(1)
						}
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
	require.GreaterOrEqual(t, int(done.Load()), total)
	assert.Zero(t, overlaps.Load(), "critical sections overlapped")
	assert.Zero(t, backwards.Load(), "a fence did not increase")
	for gi := range guards {
		t.Logf("guard %d: %d acquisitions", gi, perGuard[gi].Load())
	}
}

// testStaleHolder lets a lock's lease run out, lets another owner take the name, and shows that
// the first owner can neither extend nor release the new owner's lock.
func testStaleHolder(t *testing.T, h Harness) {
	name := uniqueName(t)
	ga, ta := newGuard(t, h)
	gb, _ := newGuard(t, h)
	gc, _ := newGuard(t, h)

	stale, err := ga.TryAcquire(t.Context(), name, guard.LeaseTime(400*time.Millisecond)) // long enough for a first answer on a loaded host
	require.NoError(t, err)
	<-stale.Done()
	require.ErrorIs(t, stale.Err(), guard.ErrLeaseExpired)

	fresh, err := gb.Acquire(t.Context(), name, guard.WaitTime(5*time.Second))
	require.NoError(t, err)
	require.Greater(t, fresh.Fence(), stale.Fence())

	// The stale owner's token, straight to the backend and through its Lock.
	errs := ta.Backend.Extend(t.Context(), []guard.Lease{{Name: name, Token: stale.Token(), TTL: time.Minute}})
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], guard.ErrNotHeld)
	assert.ErrorIs(t, ta.Backend.Release(t.Context(), name, stale.Token(), 0), guard.ErrNotHeld)
	assert.ErrorIs(t, stale.Extend(t.Context(), time.Minute), guard.ErrNotHeld)
	assert.ErrorIs(t, stale.Release(t.Context()), guard.ErrNotHeld)

	// The new owner still holds it.
	_, err = gc.TryAcquire(t.Context(), name)
	assert.ErrorIs(t, err, guard.ErrNotAcquired)
	assert.NoError(t, fresh.Err())
	require.NoError(t, fresh.Release(t.Context()))
}

// testWatchdog holds a lock without a lease time across more than five watchdog timeouts
// while another Guard keeps trying, and checks the renewal cadence.
func testWatchdog(t *testing.T, h Harness) {
	const ttl = 600 * time.Millisecond
	name := uniqueName(t)
	rec := &recorder{}
	holder, _ := newGuard(t, h, guard.WithWatchdogTimeout(ttl), guard.WithObserver(rec))
	other, _ := newGuard(t, h)

	l, err := holder.Acquire(t.Context(), name)
	require.NoError(t, err)
	acquired := time.Now()
	tries := 0
	for time.Since(acquired) < 5*ttl+ttl/2 {
		_, err := other.TryAcquire(t.Context(), name)
		require.ErrorIs(t, err, guard.ErrNotAcquired, "the lock was free while its holder ran")
		tries++
		select {
		case <-l.Done():
			t.Fatalf("holder's context ended: %v", l.Err())
		case <-time.After(ttl / 8):
		}
	}
	require.NoError(t, l.Release(t.Context()))

	rec.awaitEvent(t, name, guard.EventReleased) // the last event: all before it are in
	renewals := rec.eventsOf(name, guard.EventRenewed)
	require.GreaterOrEqual(t, len(renewals), 12, "about 16 renewals expected in 5.5 TTLs at TTL/3")
	var gaps []time.Duration
	prev := l.AcquiredAt()
	for _, r := range renewals {
		gaps = append(gaps, r.At.Sub(prev))
		prev = r.At
	}
	mean := time.Since(l.AcquiredAt()) / time.Duration(len(renewals)+1)
	t.Logf("%d tries by another Guard, all busy; %d renewals, mean interval %v (TTL/3 = %v); gaps %v",
		tries, len(renewals), mean, ttl/3, gaps)
	for _, g := range gaps {
		assert.Less(t, g, ttl/2, "a renewal came later than TTL/2 after the one before")
	}
	assert.Empty(t, rec.eventsOf(name, guard.EventLost))
}

// testLoss hurts the backend behind a holder's back and checks that the holder's context ends
// with ErrLockLost no later than its validity deadline.
func testLoss(t *testing.T, h Harness) {
	const ttl = 900 * time.Millisecond
	hurt := []struct {
		name string
		do   func(tb testing.TB, name string)
	}{
		{"DeleteKey", h.Delete},
		{"OverwriteKey", h.Overwrite},
	}
	for _, tc := range hurt {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueName(t)
			g, _ := newGuard(t, h, guard.WithWatchdogTimeout(ttl))
			l, err := g.Acquire(t.Context(), name)
			require.NoError(t, err)
			tc.do(t, name)
			deadline := l.Deadline()
			select {
			case <-l.Done():
			case <-time.After(2 * ttl):
				t.Fatal("the holder's context outlived its lock")
			}
			ended := time.Now()
			require.ErrorIs(t, l.Err(), guard.ErrLockLost)
			assert.True(t, ended.Before(expiryOf(deadline, ttl)),
				"lost at %v, after the lease could have ended (%v)", ended, expiryOf(deadline, ttl))
			t.Logf("lost %v after the %s, %v before the deadline", ended.Sub(deadline.Add(-ttl)), tc.name, deadline.Sub(ended))
			assert.ErrorIs(t, l.Release(t.Context()), guard.ErrNotHeld)
		})
	}
	t.Run("KillServer", func(t *testing.T) {
		if h.Killable == nil {
			t.Skip("this backend has no server to kill")
		}
		const killTTL = 1500 * time.Millisecond
		target, kill := h.Killable(t)
		rec := &recorder{}
		g := guard.New(target.Backend, guard.WithWatchdogTimeout(killTTL), guard.WithObserver(rec))
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		name := uniqueName(t)
		l, err := g.Acquire(t.Context(), name)
		require.NoError(t, err)
		kill()
		deadline := l.Deadline()
		select {
		case <-l.Done():
		case <-time.After(2 * killTTL):
			t.Fatal("the holder's context outlived its lock after the server died")
		}
		require.ErrorIs(t, l.Err(), guard.ErrLockLost)
		lost := rec.awaitEvent(t, name, guard.EventLost)
		require.Len(t, lost, 1)
		assert.True(t, lost[0].At.Before(expiryOf(deadline, killTTL)),
			"lost at %v, after the lease could have ended (%v)", lost[0].At, expiryOf(deadline, killTTL))
		t.Logf("server killed; lock context cancelled %v after its deadline, %v before the lease could end; cause: %v",
			lost[0].At.Sub(deadline), expiryOf(deadline, killTTL).Sub(lost[0].At), l.Err())

		// A dead backend is a failure, never "busy".
		_, err = g.TryAcquire(t.Context(), name+":after")
		require.Error(t, err)
		assert.NotErrorIs(t, err, guard.ErrNotAcquired)
	})
}

// expiryOf returns the earliest moment the backend's lease of a lock whose local deadline is
// deadline can end: the deadline plus the drift margin the Guard subtracted. The safety
// property is that the holder's context ends before then. The Guard arms its timer for the
// deadline itself; the margin absorbs how late a loaded machine runs that timer.
func expiryOf(deadline time.Time, ttl time.Duration) time.Time {
	return deadline.Add(watchdog.Drift(ttl))
}

// testLeaseTime takes a lock with a fixed lease: its context ends with ErrLeaseExpired at its
// deadline, and nothing is sent to the backend in between.
func testLeaseTime(t *testing.T, h Harness) {
	const lease = time.Second
	name := uniqueName(t)
	rec := &recorder{}
	g, target := newGuard(t, h, guard.WithWatchdogTimeout(60*time.Millisecond), guard.WithObserver(rec))
	l, err := g.TryAcquire(t.Context(), name, guard.LeaseTime(lease))
	require.NoError(t, err)
	var before int64
	if target.RoundTrips != nil {
		before = target.RoundTrips()
	}
	deadline := l.Deadline()
	<-l.Done()
	require.ErrorIs(t, l.Err(), guard.ErrLeaseExpired)
	expired := rec.awaitEvent(t, name, guard.EventLeaseExpired)
	require.Len(t, expired, 1)
	assert.True(t, expired[0].At.Before(expiryOf(deadline, lease)),
		"expired at %v, after the lease could have ended (%v)", expired[0].At, expiryOf(deadline, lease))
	assert.Empty(t, rec.eventsOf(name, guard.EventRenewed), "a LeaseTime lock was renewed")
	if target.RoundTrips != nil {
		assert.Equal(t, before, target.RoundTrips(), "round trips during a fixed lease")
	}
}

// testMinHold releases a MinHold lock at once: the name stays locked until the window ends, a
// second instance skips within it and runs after it.
func testMinHold(t *testing.T, h Harness) {
	const window = 700 * time.Millisecond
	name := uniqueName(t)
	ga, _ := newGuard(t, h)
	gb, _ := newGuard(t, h)

	first, err := ga.TryAcquire(t.Context(), name, guard.MinHold(window))
	require.NoError(t, err)
	require.NoError(t, first.Release(t.Context()))

	_, err = gb.TryAcquire(t.Context(), name)
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy, "a second instance ran within the window")

	second, err := gb.Acquire(t.Context(), name, guard.WaitTime(5*time.Second))
	require.NoError(t, err)
	assertWindowKept(t, first, second, window)
	require.NoError(t, second.Release(t.Context()))
}

// testWaiting covers the ways a wait ends.
func testWaiting(t *testing.T, h Harness) {
	t.Run("WokenByReleaseSameGuard", func(t *testing.T) {
		target := h.New(t)
		rec := &recorder{}
		sp := NewSpy(target.Backend, 64)
		g := guard.New(sp, guard.WithObserver(rec))
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		testWake(t, g, g, sp, rec)
	})
	t.Run("WokenByReleaseOtherGuard", func(t *testing.T) {
		target := h.New(t)
		if _, ok := target.Backend.(guard.Notifier); !ok {
			t.Skip("this backend does not announce releases across processes; waiters re-try at expiry with backoff")
		}
		rec := &recorder{}
		sp := NewSpy(target.Backend, 64)
		waiter := guard.New(sp, guard.WithObserver(rec))
		t.Cleanup(func() { _ = waiter.Close(context.Background()) })
		holder, _ := newGuard(t, h)
		testWake(t, holder, waiter, sp, rec)
	})
	t.Run("CrashedHolder", func(t *testing.T) {
		const ttl = 500 * time.Millisecond
		name := uniqueName(t)
		target := h.New(t)
		// A holder that died without releasing leaves exactly this behind: a lease on the
		// backend under a token nobody will ever release.
		start := time.Now()
		_, err := target.Backend.Acquire(t.Context(), guard.Request{Name: name, Token: "crashed-holder", TTL: ttl})
		require.NoError(t, err)

		rec := &recorder{}
		g, _ := newGuard(t, h, guard.WithObserver(rec))
		l, err := g.Acquire(t.Context(), name, guard.WaitTime(10*ttl))
		require.NoError(t, err)
		assert.False(t, l.AcquiredAt().Before(start.Add(ttl-ttl/10)), "taken before the dead holder's lease ran out")
		a, _ := rec.lastAcquisition(name)
		t.Logf("taken %v after the crash (lease %v) in %d attempts", l.AcquiredAt().Sub(start), ttl, a.Attempts)
		require.NoError(t, l.Release(t.Context()))
	})
	t.Run("CancelEndsWait", func(t *testing.T) {
		name := uniqueName(t)
		holder, _ := newGuard(t, h)
		l, err := holder.Acquire(t.Context(), name)
		require.NoError(t, err)

		target := h.New(t)
		sp := NewSpy(target.Backend, 64)
		waiter := guard.New(sp)
		t.Cleanup(func() { _ = waiter.Close(context.Background()) })
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := waiter.Acquire(ctx, name)
			errc <- err
		}()
		parked(t, sp)
		cancel()
		canceled := time.Now()
		select {
		case err = <-errc:
		case <-time.After(5 * time.Second):
			t.Fatal("cancel did not end the wait")
		}
		t.Logf("wait ended %v after cancel", time.Since(canceled))
		assert.ErrorIs(t, err, guard.ErrNotAcquired)
		assert.ErrorIs(t, err, context.Canceled)
		require.NoError(t, l.Release(t.Context()))
	})
	t.Run("WaitTimeRunsOut", func(t *testing.T) {
		name := uniqueName(t)
		holder, _ := newGuard(t, h)
		l, err := holder.Acquire(t.Context(), name)
		require.NoError(t, err)
		rec := &recorder{}
		waiter, _ := newGuard(t, h, guard.WithObserver(rec))
		_, err = waiter.Acquire(t.Context(), name, guard.WaitTime(200*time.Millisecond))
		var busy *guard.BusyError
		require.ErrorAs(t, err, &busy)
		a, _ := rec.lastAcquisition(name)
		assert.Equal(t, guard.OutcomeTimeout, a.Outcome)
		assert.GreaterOrEqual(t, a.Waited, 200*time.Millisecond)
		require.NoError(t, l.Release(t.Context()))
	})
}

// parked returns once the waiter behind sp has had the two busy answers that precede its sleep:
// the first attempt and the one right after it started watching the name.
func parked(t *testing.T, sp *Spy) {
	t.Helper()
	for range 2 {
		select {
		case <-sp.Busy():
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter never asked for the lock")
		}
	}
}

// testWake parks a waiter on waiter's Guard behind a lock held on holder's Guard with the
// default 30 s watchdog lease, releases, and checks that a release notification — not the
// lease running out, not polling — ended the wait.
func testWake(t *testing.T, holder, waiter *guard.Guard, sp *Spy, rec *recorder) {
	name := uniqueName(t)
	l, err := holder.Acquire(t.Context(), name)
	require.NoError(t, err)

	wt := startWaiting(t, sp, func() (*guard.Lock, error) { return waiter.Acquire(t.Context(), name) })
	released := time.Now()
	require.NoError(t, l.Release(t.Context()))
	w := wt.lock(t, 10*time.Second, "the waiter was not woken by the release (the holder's lease is 30s)")
	latency := time.Since(released)
	a, _ := rec.lastAcquisition(name)
	t.Logf("woken %v after release; %d attempts, %d wake-ups", latency, a.Attempts, a.Wakeups)
	assert.Less(t, latency, time.Second, "woken only by a fallback, not by the release")
	if _, notices := sp.Backend.(guard.Notifier); !notices {
		// Without notifications the waiter also re-tries on a short backoff, and on a slow
		// server that re-try can be on the wire when the release wakes it: then the re-try,
		// not the wake-up, takes the lock. The latency above is what counts.
		return
	}
	assert.GreaterOrEqual(t, a.Wakeups, 1, "the wait did not end by a release notification")
	assert.LessOrEqual(t, a.Attempts, 3, "the waiter polled")
	require.NoError(t, w.Release(t.Context()))
}

// testReentrancy asks for a held name again under the lock's own context.
func testReentrancy(t *testing.T, h Harness) {
	name := uniqueName(t)
	g, _ := newGuard(t, h)
	other, _ := newGuard(t, h)
	outer, err := g.Acquire(t.Context(), name)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(outer.Context(), 5*time.Second)
	defer cancel()
	var fence uint64
	err = g.Do(ctx, name, func(ctx context.Context) error {
		inner, ok := guard.FromContext(ctx)
		if !ok || !inner.Reentrant() {
			return errors.New("not re-entered")
		}
		fence = inner.Fence()
		return nil
	})
	require.NoError(t, err, "re-entering a held name through its context")
	assert.Equal(t, outer.Fence(), fence)

	require.NoError(t, outer.Err(), "the inner release ended the outer lock")
	_, err = other.TryAcquire(t.Context(), name)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "the inner release freed the name")
	require.NoError(t, outer.Release(t.Context()))
	l, err := other.TryAcquire(t.Context(), name)
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
}

// testRoundTrips counts the network round trips of acquire, extend and release.
func testRoundTrips(t *testing.T, h Harness) {
	g, target := newGuard(t, h)
	if target.RoundTrips == nil {
		t.Skip("this backend makes no round trips")
	}
	name := uniqueName(t)
	count := func(op string, f func() error, want error) {
		t.Helper()
		before := target.RoundTrips()
		err := f()
		n := target.RoundTrips() - before
		if want == nil {
			require.NoError(t, err, op)
		} else {
			require.ErrorIs(t, err, want, op)
		}
		t.Logf("%s: %d round trip(s)", op, n)
		assert.EqualValues(t, 1, n, "%s round trips", op)
	}
	var l *guard.Lock
	count("acquire", func() (err error) {
		l, err = g.TryAcquire(t.Context(), name, guard.LeaseTime(time.Minute))
		return err
	}, nil)
	count("busy acquire", func() error {
		_, err := g.TryAcquire(t.Context(), name, guard.LeaseTime(time.Minute))
		return err
	}, guard.ErrNotAcquired)
	count("extend", func() error { return l.Extend(t.Context(), time.Minute) }, nil)
	count("release", func() error { return l.Release(t.Context()) }, nil)
}

// testErrors checks the typed errors of bad input and the guard on a bad name.
func testErrors(t *testing.T, h Harness) {
	g, _ := newGuard(t, h)
	cases := []struct {
		name string
		lock string
		opts []guard.LockOption
		want error
	}{
		{"EmptyName", "", nil, guard.ErrInvalidName},
		{"NULInName", "a\x00b", nil, guard.ErrInvalidName},
		{"LongName", string(make([]byte, guard.MaxNameLen+1)), nil, guard.ErrInvalidName},
		{"NegativeWait", "x", []guard.LockOption{guard.WaitTime(-1)}, guard.ErrInvalidOption},
		{"TinyLease", "x", []guard.LockOption{guard.LeaseTime(time.Millisecond)}, guard.ErrInvalidOption},
		{"MinHoldOverLease", "x", []guard.LockOption{guard.LeaseTime(time.Second), guard.MinHold(2 * time.Second)}, guard.ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := g.TryAcquire(t.Context(), tc.lock, tc.opts...)
			require.ErrorIs(t, err, tc.want)
			assert.NotErrorIs(t, err, guard.ErrNotAcquired)
		})
	}
	t.Run("CanceledBeforeAttempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := g.Acquire(ctx, uniqueName(t))
		require.ErrorIs(t, err, guard.ErrNotAcquired)
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("ExtendWatchdogLock", func(t *testing.T) {
		l, err := g.TryAcquire(t.Context(), uniqueName(t))
		require.NoError(t, err)
		require.ErrorIs(t, l.Extend(t.Context(), time.Second), guard.ErrNotExtendable)
		require.NoError(t, l.Release(t.Context()))
		require.NoError(t, l.Release(t.Context()), "Release is idempotent")
		require.ErrorIs(t, l.Err(), guard.ErrReleased)
	})
}

// testClose closes a Guard that holds a lock and has a waiter.
func testClose(t *testing.T, h Harness) {
	name := uniqueName(t)
	target := h.New(t)
	sp := NewSpy(target.Backend, 64)
	g := guard.New(sp)
	other, _ := newGuard(t, h)
	l, err := g.Acquire(t.Context(), name)
	require.NoError(t, err)
	w, err := other.Acquire(t.Context(), name+":held")
	require.NoError(t, err)
	defer w.Release(t.Context())

	waitErr := make(chan error, 1)
	go func() {
		_, err := g.Acquire(t.Context(), name+":held")
		waitErr <- err
	}()
	parked(t, sp) // the waiter is waiting, not just about to start
	require.NoError(t, g.Close(t.Context()))
	require.ErrorIs(t, l.Err(), guard.ErrClosed)
	select {
	case err := <-waitErr:
		require.ErrorIs(t, err, guard.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a wait")
	}
	free, err := other.TryAcquire(t.Context(), name)
	require.NoError(t, err, "Close did not release the lock")
	require.NoError(t, free.Release(t.Context()))
	_, err = g.Acquire(t.Context(), name)
	require.ErrorIs(t, err, guard.ErrClosed)
}
