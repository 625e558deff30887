package guard_test

// The tests here reproduce the cases of issue 16 — the queue, the hand-over and the deferred
// claim breaking "one holder at a time" and "a dead instance blocks a name no longer than it
// asked" — through the public API, on memstore (a queueing store, as redisstore is) under
// testing/synctest's clock, so that every time below is exact.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
)

// bubbleGuard returns a Guard on b that is closed when the bubble's test function returns.
func bubbleGuard(t *testing.T, b guard.Backend, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g := guard.New(b, opts...)
	t.Cleanup(func() { require.NoError(t, g.Close(context.Background())) })
	return g
}

// handOver makes waiter's Guard wait for name (held by holder's Guard) with opts, releases
// holder's lock so that the store hands the name over, and returns the waiter's lock and when
// it was granted.
func handOver(t *testing.T, holder, waiter *guard.Guard, name string, opts ...guard.LockOption) (*guard.Lock, time.Time) {
	t.Helper()
	h, err := holder.Acquire(t.Context(), name)
	require.NoError(t, err)
	got := make(chan *guard.Lock, 1)
	go func() {
		l, err := waiter.Acquire(t.Context(), name, opts...)
		assert.NoError(t, err)
		got <- l
	}()
	synctest.Wait() // queued
	require.NoError(t, h.Release(t.Context()))
	l := <-got
	require.NotNil(t, l)
	return l, time.Now()
}

// grantedAt returns when g acquires name, waiting for it up to d.
func grantedAt(t *testing.T, g *guard.Guard, name string, d time.Duration) (*guard.Lock, time.Time) {
	t.Helper()
	l, err := g.Acquire(t.Context(), name, guard.WaitTime(d))
	require.NoError(t, err)
	return l, time.Now()
}

// TestExtendAfterHandOver (case 1): a lock handed over with a shorter lease than it asked for
// claims the rest later; an Extend made meanwhile must not be undone by that claim, or the
// server's lease ends while the holder still trusts its lock.
func TestExtendAfterHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		a, b, c := bubbleGuard(t, store), bubbleGuard(t, store), bubbleGuard(t, store)
		// Asked for more than a queue place lasts: handed over with the place's lease.
		l, _ := handOver(t, a, b, "n", guard.LeaseTime(memstore.QueueTimeout+time.Second))
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, l.Extend(t.Context(), 10*time.Second))

		_, at := grantedAt(t, c, "n", time.Minute)
		assert.Error(t, l.Err(), "another Guard was granted the name at %v while the holder's context was live", at)
		assert.False(t, at.Before(l.Deadline()), "granted at %v, before the holder's deadline %v", at, l.Deadline())
	})
}

// TestHandedOverLeaseTimeIsKept (case 1, without an Extend): a LeaseTime lock handed over with
// a short lease lives the lease it asked for, not a third more.
func TestHandedOverLeaseTimeIsKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		a, b := bubbleGuard(t, store), bubbleGuard(t, store)
		lease := memstore.QueueTimeout + time.Second
		l, handed := handOver(t, a, b, "n", guard.LeaseTime(lease))
		<-l.Done()
		require.ErrorIs(t, l.Err(), guard.ErrLeaseExpired)
		assert.LessOrEqual(t, time.Since(handed), lease, "a LeaseTime(%v) lock lived longer than asked", lease)
		assert.Greater(t, time.Since(handed), lease-lease/10, "a LeaseTime(%v) lock ended too soon", lease)
	})
}

// TestMinHoldReleaseWakesLocalWaiter (case 3): after a release that keeps the name for the
// rest of a MinHold window, a waiter of the same Guard must acquire when the window ends.
func TestMinHoldReleaseWakesLocalWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		g, other := bubbleGuard(t, store), bubbleGuard(t, store)
		start := time.Now()
		l, err := g.Acquire(t.Context(), "n", guard.MinHold(time.Second))
		require.NoError(t, err)

		local := make(chan time.Time, 1)
		go func() {
			w, err := g.Acquire(t.Context(), "n")
			if assert.NoError(t, err) {
				local <- time.Now()
				assert.NoError(t, w.Release(t.Context()))
			}
		}()
		synctest.Wait()
		remote := make(chan time.Time, 1)
		go func() {
			w, err := other.Acquire(t.Context(), "n")
			if assert.NoError(t, err) {
				remote <- time.Now()
				assert.NoError(t, w.Release(t.Context()))
			}
		}()
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, l.Release(t.Context()))

		end := start.Add(time.Second)
		at := <-local
		assert.WithinDuration(t, end, at, 25*time.Millisecond, "the local waiter acquired %v after the window ended", at.Sub(end))
		at = <-remote
		assert.WithinDuration(t, end, at, 50*time.Millisecond, "the waiter queued behind it acquired %v after the window ended", at.Sub(end))
	})
}

// slowWatch confirms a Watch only after delay: a loaded network, or a server slow to
// subscribe. A Watch whose context ends first fails.
type slowWatch struct {
	*memstore.Store
	delay time.Duration
}

func (s slowWatch) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	sub, err := s.Store.Subscribe(notify)
	return &slowSubscription{Subscription: sub, delay: s.delay}, err
}

type slowSubscription struct {
	guard.Subscription
	delay time.Duration
}

func (s *slowSubscription) Watch(ctx context.Context, name string) error {
	select {
	case <-time.After(s.delay):
		return s.Subscription.Watch(ctx, name)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestImpatientFirstWaiterDecidesNoWatch (case 5): the first waiter of a name gives up while
// the Guard's Watch is on the wire; the waiters after it must still be told of the release.
func TestImpatientFirstWaiterDecidesNoWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder := bubbleGuard(t, store)
		g := bubbleGuard(t, slowWatch{Store: store, delay: 200 * time.Millisecond})
		h, err := holder.Acquire(t.Context(), "n")
		require.NoError(t, err)

		impatient := make(chan error, 1)
		go func() {
			_, err := g.Acquire(t.Context(), "n", guard.WaitTime(50*time.Millisecond))
			impatient <- err
		}()
		time.Sleep(10 * time.Millisecond)
		got := make(chan time.Time, 1)
		go func() {
			l, err := g.Acquire(t.Context(), "n")
			if assert.NoError(t, err) {
				got <- time.Now()
				assert.NoError(t, l.Release(t.Context()))
			}
		}()
		require.ErrorIs(t, <-impatient, guard.ErrNotAcquired)

		time.Sleep(time.Second)
		released := time.Now()
		require.NoError(t, h.Release(t.Context()))
		at := <-got
		assert.Less(t, at.Sub(released), 20*time.Millisecond, "the waiter polled instead of hearing the release")
	})
}

// callingObserver calls back into the Lock it is given at the end of an acquisition, as an
// observer may: it reads the lock's context and releases it.
type callingObserver struct {
	mu       sync.Mutex // protects released, errs
	released []error
	errs     []error
}

func (o *callingObserver) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context {
	return ctx
}

func (o *callingObserver) AcquireEnd(ctx context.Context, _ *guard.Acquisition, l *guard.Lock, _ error) context.Context {
	if l == nil {
		return ctx
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if l.Context() == nil || l.Done() == nil {
		o.errs = append(o.errs, errors.New("the lock has no context during AcquireEnd"))
		return ctx
	}
	if l.Err() != nil {
		o.errs = append(o.errs, l.Err())
	}
	o.released = append(o.released, l.Release(ctx))
	return ctx
}

func (o *callingObserver) LockEvent(*guard.Lock, guard.LockEvent) {}

// TestObserverGetsAWholeLock (case 6): the Lock an observer is given in AcquireEnd works —
// its context, Err, Done and Release — and a release made there frees the name.
func TestObserverGetsAWholeLock(t *testing.T) {
	store := memstore.New()
	obs := &callingObserver{}
	g := newGuard(t, store, guard.WithObserver(obs))
	other := newGuard(t, store)

	var l *guard.Lock
	require.NotPanics(t, func() {
		var err error
		l, err = g.Acquire(t.Context(), "n")
		require.NoError(t, err)
	})
	obs.mu.Lock()
	assert.Empty(t, obs.errs)
	require.Len(t, obs.released, 1)
	assert.NoError(t, obs.released[0])
	obs.mu.Unlock()
	assert.ErrorIs(t, l.Err(), guard.ErrReleased)
	assert.NoError(t, l.Release(t.Context()), "a second release is a no-op")

	o, err := other.TryAcquire(t.Context(), "n")
	require.NoError(t, err, "the observer's release did not free the name")
	require.NoError(t, o.Release(t.Context()))
	assert.Zero(t, guard.HeldLocks(g), "the released lock is still held and renewed")
}

// TestExtendKeepsMinHold (case 7): an Extend that shortens the lease must not end a MinHold
// window early: the name stays taken until the window ends, though the lock's own lease is
// as short as asked.
func TestExtendKeepsMinHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		g, other := bubbleGuard(t, store), bubbleGuard(t, store)
		start := time.Now()
		l, err := g.Acquire(t.Context(), "n", guard.LeaseTime(2*time.Second), guard.MinHold(2*time.Second))
		require.NoError(t, err)
		require.NoError(t, l.Extend(t.Context(), 50*time.Millisecond))
		<-l.Done()
		assert.ErrorIs(t, l.Err(), guard.ErrLeaseExpired)
		assert.Less(t, time.Since(start), 100*time.Millisecond, "the lock outlived the lease it was extended to")

		_, at := grantedAt(t, other, "n", time.Minute)
		assert.False(t, at.Before(start.Add(2*time.Second)), "granted %v after the MinHold(2s) lock", at.Sub(start))
	})
}

// abortingRelease is a network whose release takes a while on the wire, as any request does:
// a caller's context that ends meanwhile aborts it before it reaches the server, as a driver
// does. fail makes the next releases fail on the network before they reach the server: the
// caller cannot tell whether they did.
type abortingRelease struct {
	guard.Backend
	fail atomic.Int32 // releases still to fail
}

func (b *abortingRelease) Release(ctx context.Context, name, token string, keep time.Duration) error {
	select {
	case <-time.After(5 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	if b.fail.Add(-1) >= 0 {
		return errors.New("read tcp 127.0.0.1:40001: i/o timeout")
	}
	return b.Backend.Release(ctx, name, token, keep)
}

// TestReleaseOutlivesItsContext (case 9): a release whose caller's context ends while it is on
// the wire still frees the name, and a release whose answer is lost is sent again.
func TestReleaseOutlivesItsContext(t *testing.T) {
	t.Run("CancelledOnTheWire", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memstore.New()
			g, other := bubbleGuard(t, &abortingRelease{Backend: store}), bubbleGuard(t, store)
			ctx, cancel := context.WithCancel(t.Context())
			err := g.Do(ctx, "n", func(context.Context) error {
				time.AfterFunc(2*time.Millisecond, cancel) // the client hangs up as the handler ends
				return nil
			})
			require.NoError(t, err)
			start := time.Now()
			_, at := grantedAt(t, other, "n", time.Minute)
			assert.Less(t, at.Sub(start), time.Second, "the name stayed taken for its lease after the release")
		})
	})
	t.Run("AnswerLost", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memstore.New()
			b := &abortingRelease{Backend: store}
			b.fail.Store(1)
			g, other := bubbleGuard(t, b), bubbleGuard(t, store)
			l, err := g.Acquire(t.Context(), "n")
			require.NoError(t, err)
			require.Error(t, l.Release(t.Context()))
			start := time.Now()
			_, at := grantedAt(t, other, "n", time.Minute)
			assert.Less(t, at.Sub(start), time.Second, "a release whose answer was lost was not sent again")
		})
	})
}

// TestErrPastTheDeadline: a lock's Err and its context's Err report the end of the lease as
// soon as its local validity deadline passes, even when the scheduler's timer that ends it is
// late (a loaded host: review of issue 16, F1 — Err was nil 1 s past the deadline after a
// pause, and another Guard was granted the name meanwhile).
func TestErrPastTheDeadline(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  []guard.LockOption
		cause error
	}{
		{"lease time", []guard.LockOption{guard.LeaseTime(60 * time.Millisecond)}, guard.ErrLeaseExpired},
		{"watchdog", nil, guard.ErrLockLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newGuard(t, memstore.New(), guard.WithWatchdogTimeout(300*time.Millisecond))
			l, err := g.Acquire(t.Context(), "job", c.opts...)
			require.NoError(t, err)
			m, err := g.AcquireAll(t.Context(), []string{"a", "b"}, c.opts...)
			require.NoError(t, err)
			last := l.Deadline()
			if d := m.Deadline(); d.After(last) {
				last = d
			}
			resume := guard.StallScheduler(g) // no timer ends a lease, no renewal is sent
			time.Sleep(time.Until(last) + 5*time.Millisecond)
			assert.ErrorIs(t, l.Err(), c.cause)
			assert.ErrorIs(t, context.Cause(l.Context()), c.cause, "the context ended too")
			assert.ErrorIs(t, m.Context().Err(), context.Canceled)
			assert.ErrorIs(t, m.Err(), c.cause, "a multi-lock's")
			resume()
			_ = l.Release(context.Background())
			_ = m.Release(context.Background())
		})
	}
}

// lateBackend delivers each acquire request to its backend 20 ms after it was sent, and
// answers the caller at once when the caller's context ends first: a request whose context
// was cancelled on the wire lands after the release sent on another connection.
type lateBackend struct{ guard.Backend }

func (b lateBackend) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	type answer struct {
		fence uint64
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		f, err := b.Backend.Acquire(context.Background(), r)
		done <- answer{f, err}
	}()
	select {
	case a := <-done:
		return a.fence, a.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestCancelledRequestLandsLate: a waiter whose context ends while its request is on the wire
// leaves no place behind when the request lands after its release — the simulation found
// such a place blocking the waiters behind it for its whole length (seed 88, bound (c)).
func TestCancelledRequestLandsLate(t *testing.T) {
	store := memstore.New()
	holder := newGuard(t, store)
	gone := newGuard(t, lateBackend{store}, guard.WithWatchdogTimeout(3*time.Second))
	next := newGuard(t, store)
	l, err := holder.Acquire(t.Context(), "n")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond) // ends on the wire
	defer cancel()
	_, err = gone.Acquire(ctx, "n")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Eventually(t, func() bool { // the late request lands: its place is before the next waiter's
		info, err := store.Inspect(t.Context(), "n")
		return err == nil && info.Waiting == 1
	}, 5*time.Second, time.Millisecond)

	waited := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		w, err := next.Acquire(t.Context(), "n", guard.WaitTime(10*time.Second))
		if assert.NoError(t, err) {
			waited <- time.Since(start)
			_ = w.Release(context.Background())
		}
	}()
	time.Sleep(700 * time.Millisecond) // the late request has landed, and every release after it
	released := time.Now()
	require.NoError(t, l.Release(t.Context()))
	select {
	case <-waited:
		assert.Less(t, time.Since(released), time.Second, "the gone waiter's place outlived it")
	case <-time.After(10 * time.Second):
		t.Fatal("the next waiter never got the name")
	}
}
