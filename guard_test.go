package guard_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
	"github.com/guardlock/guard/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newGuard(t *testing.T, b guard.Backend, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g := guard.New(b, opts...)
	t.Cleanup(func() { require.NoError(t, g.Close(context.Background())) })
	return g
}

// losingBackend answers "not held" to every extension once lose is set: what a backend says
// after someone deleted or took the key.
type losingBackend struct {
	guard.Backend
	mu   sync.Mutex // protects lose
	lose bool
}

func (b *losingBackend) Extend(ctx context.Context, leases []guard.Lease) []error {
	b.mu.Lock()
	lose := b.lose
	b.mu.Unlock()
	if !lose {
		return b.Backend.Extend(ctx, leases)
	}
	errs := make([]error, len(leases))
	for i := range errs {
		errs[i] = guard.ErrNotHeld
	}
	return errs
}

func TestDoReportsLossEvenWhenFnSucceeds(t *testing.T) {
	b := &losingBackend{Backend: memstore.New()}
	g := newGuard(t, b, guard.WithWatchdogTimeout(60*time.Millisecond))
	err := g.Do(t.Context(), "n", func(ctx context.Context) error {
		b.mu.Lock()
		b.lose = true
		b.mu.Unlock()
		<-ctx.Done() // the work notices and stops
		return nil
	})
	require.ErrorIs(t, err, guard.ErrLockLost)
}

func TestDoReleasesOnPanic(t *testing.T) {
	store := memstore.New()
	g := newGuard(t, store)
	func() {
		defer func() { assert.Equal(t, "boom", recover()) }()
		_ = g.Do(t.Context(), "n", func(context.Context) error { panic("boom") })
	}()
	l, err := g.TryAcquire(t.Context(), "n")
	require.NoError(t, err, "the panic left the lock held")
	require.NoError(t, l.Release(t.Context()))
}

func TestDoReleasesWhenCallerContextIsCancelled(t *testing.T) {
	store := memstore.New()
	g := newGuard(t, store)
	ctx, cancel := context.WithCancel(t.Context())
	err := g.Do(ctx, "n", func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	l, err := newGuard(t, store).TryAcquire(t.Context(), "n")
	require.NoError(t, err, "a cancelled caller left the lock held")
	require.NoError(t, l.Release(t.Context()))
}

func TestReentrancyThroughOtherNames(t *testing.T) {
	g := newGuard(t, memstore.New())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	// a → b → a must re-enter a, not wait for it.
	err := g.Do(ctx, "a", func(ctx context.Context) error {
		return g.Do(ctx, "b", func(ctx context.Context) error {
			return g.Do(ctx, "a", func(ctx context.Context) error {
				l, _ := guard.FromContext(ctx)
				if !l.Reentrant() || l.Name() != "a" {
					return errors.New("not re-entered")
				}
				return nil
			})
		})
	})
	require.NoError(t, err)
}

func TestInnerLockEndsWithOuter(t *testing.T) {
	g := newGuard(t, memstore.New())
	outer, err := g.Acquire(t.Context(), "n", guard.LeaseTime(50*time.Millisecond))
	require.NoError(t, err)
	inner, err := g.Acquire(outer.Context(), "n")
	require.NoError(t, err)
	<-inner.Done()
	require.ErrorIs(t, inner.Err(), guard.ErrLeaseExpired)
}

func TestTryAcquireHonoursWaitTime(t *testing.T) {
	store := memstore.New()
	a, b := newGuard(t, store), newGuard(t, store)
	l, err := a.TryAcquire(t.Context(), "n", guard.LeaseTime(80*time.Millisecond))
	require.NoError(t, err)
	got, err := b.TryAcquire(t.Context(), "n", guard.WaitTime(5*time.Second))
	require.NoError(t, err, "WaitTime overrides TryAcquire's single attempt")
	assert.Greater(t, got.Fence(), l.Fence())
	require.NoError(t, got.Release(t.Context()))
}

func TestExtendPushesDeadline(t *testing.T) {
	g := newGuard(t, memstore.New())
	l, err := g.TryAcquire(t.Context(), "n", guard.LeaseTime(time.Second))
	require.NoError(t, err)
	before := l.Deadline()
	require.NoError(t, l.Extend(t.Context(), time.Minute))
	assert.True(t, l.Deadline().After(before.Add(50*time.Second)))
	require.NoError(t, l.Release(t.Context()))
	assert.ErrorIs(t, l.Extend(t.Context(), time.Minute), guard.ErrNotHeld)
}

func TestNewPanicsOnBadOption(t *testing.T) {
	assert.PanicsWithError(t, "guard: invalid option WithWatchdogTimeout(1ms): must be at least 10ms", func() {
		guard.New(memstore.New(), guard.WithWatchdogTimeout(time.Millisecond))
	})
	assert.Panics(t, func() { guard.New(nil) })

	// The panic is the typed error, and says no more than 64 bytes of a bad value.
	defer func() {
		var opt *guard.OptionError
		err, _ := recover().(error)
		require.ErrorAs(t, err, &opt)
		assert.Equal(t, "WithInstance", opt.Option)
		assert.Less(t, len(err.Error()), 200)
	}()
	guard.New(memstore.New(), guard.WithInstance(strings.Repeat("x", 1<<20)))
}

func TestCheckLockOptions(t *testing.T) {
	require.NoError(t, guard.CheckLockOptions(guard.WaitTime(time.Second), guard.LeaseTime(time.Second), guard.MinHold(time.Second)))
	var oe *guard.OptionError
	require.ErrorAs(t, guard.CheckLockOptions(guard.MinHold(-1)), &oe)
	assert.Equal(t, "MinHold", oe.Option)
}

// events is an Observer that records the order of what it is told, and signals renewals.
type events struct {
	mu      sync.Mutex // protects got
	got     []string
	renewed chan struct{} // one value per renewal; buffered
}

func (e *events) add(s string) {
	e.mu.Lock()
	e.got = append(e.got, s)
	e.mu.Unlock()
}

func (e *events) AcquireStart(ctx context.Context, a *guard.Acquisition) context.Context {
	e.add("start " + a.Name + " " + a.Backend)
	return ctx
}

func (e *events) AcquireEnd(ctx context.Context, a *guard.Acquisition, _ *guard.Lock, _ error) context.Context {
	e.add("end " + a.Outcome.String())
	return ctx
}

func (e *events) LockEvent(_ *guard.Lock, ev guard.LockEvent) {
	e.add(ev.Kind.String())
	if ev.Kind == guard.EventRenewed {
		select {
		case e.renewed <- struct{}{}:
		default:
		}
	}
}

func TestObserverSeesLifecycle(t *testing.T) {
	rec := &events{renewed: make(chan struct{}, 8)}
	g := newGuard(t, memstore.New(), guard.WithObserver(rec), guard.WithWatchdogTimeout(300*time.Millisecond))
	l, err := g.Acquire(t.Context(), "n")
	require.NoError(t, err)
	_, err = g.TryAcquire(context.Background(), "n")
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	for range 2 {
		select {
		case <-rec.renewed:
		case <-l.Done():
			t.Fatalf("lost: %v", l.Err())
		}
	}
	require.NoError(t, l.Release(t.Context()))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Equal(t, []string{"start n memstore", "end acquired", "start n memstore", "end busy", "renewed", "renewed", "released"}, rec.got)
}

// hungWatch is a backend whose release notifications never confirm a watch: a subscription
// whose server stopped answering. Its Watch honours its context, as the real ones do.
type hungWatch struct {
	*memstore.Store
	watching chan string // receives the name of each Watch as it starts
}

func (h hungWatch) Subscribe(func(guard.Notice)) (guard.Subscription, error) { return h, nil }

func (h hungWatch) Watch(ctx context.Context, name string) error {
	h.watching <- name
	<-ctx.Done()
	return ctx.Err()
}

func (hungWatch) Unwatch(string) {}
func (hungWatch) Close() error   { return nil }

// TestHungWatchBlocksNothingElse: one waiter stuck in a Watch must not hold up another
// waiter's cancellation, nor Close.
func TestHungWatchBlocksNothingElse(t *testing.T) {
	store := memstore.New()
	holder := newGuard(t, store)
	for _, name := range []string{"a", "b"} {
		l, err := holder.Acquire(t.Context(), name)
		require.NoError(t, err)
		defer l.Release(context.Background())
	}
	hw := hungWatch{Store: store, watching: make(chan string, 4)}
	g := guard.New(hw)

	stuck := make(chan error, 1)
	go func() {
		_, err := g.Acquire(context.Background(), "a")
		stuck <- err
	}()
	require.Equal(t, "a", <-hw.watching)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := g.Acquire(ctx, "b")
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, guard.ErrNotAcquired)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter's cancelled context did not end its wait while another Watch hung")
	}

	closed := make(chan error, 1)
	go func() { closed <- g.Close(context.Background()) }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung behind a Watch")
	}
	require.ErrorIs(t, <-stuck, guard.ErrClosed)
}

func TestReentryWithCancelledContext(t *testing.T) {
	g := newGuard(t, memstore.New())
	outer, err := g.Acquire(t.Context(), "n")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(outer.Context())
	cancel()
	_, err = g.Acquire(ctx, "n")
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.ErrorIs(t, err, context.Canceled)
	ran := false
	err = g.Do(ctx, "n", func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, ran, "Do ran its function under a cancelled context")
	require.NoError(t, outer.Release(t.Context()))
}

func TestExtendAfterCallerCancelled(t *testing.T) {
	store := memstore.New()
	g, other := newGuard(t, store), newGuard(t, store)
	ctx, cancel := context.WithCancel(t.Context())
	l, err := g.Acquire(ctx, "n", guard.LeaseTime(time.Second))
	require.NoError(t, err)
	cancel()
	<-l.Done()
	require.ErrorIs(t, l.Err(), context.Canceled)

	// The caller is gone, but the lock is still held: it can be extended and released.
	require.NoError(t, l.Extend(t.Context(), time.Minute))
	_, err = other.TryAcquire(t.Context(), "n")
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.NoError(t, l.Release(t.Context()))
	require.ErrorIs(t, l.Extend(t.Context(), time.Minute), guard.ErrNotHeld)
}

// TestReleaseHandsOverToOneWaiter parks five waiters of one Guard behind a lock of another.
// The store queues them; each release hands the name to the next waiter, whose Guard wakes it
// and no other: after the first release no waiter sends another attempt (waking all would cost
// 4 + 3 + 2 + 1 of them), and every waiter is woken exactly once.
func TestReleaseHandsOverToOneWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const waiters = 5
		store := memstore.New()
		holder := bubbleGuard(t, store)
		l, err := holder.Acquire(t.Context(), "n")
		require.NoError(t, err)

		counted := &countingBackend{Spy: locktest.NewSpy(store, 4*waiters)}
		rec := &acquisitions{}
		g := bubbleGuard(t, counted, guard.WithObserver(rec))
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				if err := g.Do(t.Context(), "n", func(context.Context) error { return nil }); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait() // every waiter asleep
		info, err := store.Inspect(t.Context(), "n")
		require.NoError(t, err)
		require.Equal(t, waiters, info.Waiting, "the waiters never queued")
		before := counted.attempts.Load()
		require.NoError(t, l.Release(t.Context()))
		wg.Wait()
		assert.EqualValues(t, before, counted.attempts.Load(), "attempts after the first release")
		for _, a := range rec.snapshot() {
			assert.Equal(t, guard.OutcomeAcquired, a.Outcome)
			assert.Equal(t, 1, a.Wakeups)
		}
	})
}

// acquisitions is an Observer that keeps the acquisitions that ended.
type acquisitions struct {
	events
	mu   sync.Mutex // protects got
	done []guard.Acquisition
}

func (r *acquisitions) AcquireEnd(ctx context.Context, a *guard.Acquisition, _ *guard.Lock, _ error) context.Context {
	r.mu.Lock()
	r.done = append(r.done, *a)
	r.mu.Unlock()
	return ctx
}

func (r *acquisitions) snapshot() []guard.Acquisition {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.done)
}

// countingBackend counts acquire attempts.
type countingBackend struct {
	*locktest.Spy
	attempts atomic.Int64
}

func (c *countingBackend) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	c.attempts.Add(1)
	return c.Spy.Acquire(ctx, r)
}

// victimKey marks the context of a waiter that a test cancels at its first attempt after a
// wake-up.
type victimKey struct{}

type victim struct {
	cancel   context.CancelFunc
	attempts atomic.Int32
}

// cancelOnWake cancels the victim's context as it makes its third attempt, the one a wake-up
// sends it on: it leaves holding a wake-up it never used.
type cancelOnWake struct{ *locktest.Spy }

func (c cancelOnWake) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if v, ok := ctx.Value(victimKey{}).(*victim); ok && v.attempts.Add(1) == 3 {
		v.cancel()
		return 0, ctx.Err()
	}
	return c.Spy.Acquire(ctx, r)
}

// unqueued is a memstore that keeps no wait queue: a release frees the name and wakes waiters,
// as the backends without a queue do.
type unqueued struct{ *memstore.Store }

func (u unqueued) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	r.Wait = false
	return u.Store.Acquire(ctx, r)
}

// TestWakeUpIsPassedOn: on a backend without a wait queue, a waiter woken by a release that
// leaves without the lock must wake the next one, which would otherwise sleep until its
// fallback (the holder's 30 s lease).
func TestWakeUpIsPassedOn(t *testing.T) {
	store := memstore.New()
	holder := newGuard(t, store)
	l, err := holder.Acquire(t.Context(), "n")
	require.NoError(t, err)

	sp := locktest.NewSpy(unqueued{store}, 8)
	g := newGuard(t, cancelOnWake{sp})
	vctx, cancel := context.WithCancel(t.Context())
	vctx = context.WithValue(vctx, victimKey{}, &victim{cancel: cancel})
	victimDone := make(chan error, 1)
	go func() {
		_, err := g.Acquire(vctx, "n")
		victimDone <- err
	}()
	<-sp.Busy()
	<-sp.Busy() // the victim is parked first, so the release wakes it

	other := make(chan error, 1)
	go func() {
		got, err := g.Acquire(t.Context(), "n")
		if err == nil {
			err = got.Release(t.Context())
		}
		other <- err
	}()
	<-sp.Busy() // the name is watched already: one attempt, then it sleeps behind the victim

	require.NoError(t, l.Release(t.Context()))
	require.ErrorIs(t, <-victimDone, context.Canceled)
	select {
	case err := <-other:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the wake-up died with the waiter that left; the next waiter was not woken")
	}
}

// stuckBackend's Extend does not return until unstuck, whatever its context says: a driver
// hung in a connection's setup (review of issue 16, F2).
type stuckBackend struct {
	guard.Backend
	stuck   chan struct{} // closed to unstick
	entered chan struct{} // gets a value when an Extend is stuck
}

func (b *stuckBackend) Extend(ctx context.Context, leases []guard.Lease) []error {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.stuck
	return b.Backend.Extend(ctx, leases)
}

// TestCloseKeepsToItsContext: Close returns when its context ends, even while a renewal is
// stuck in the backend, and says what it was waiting for.
func TestCloseKeepsToItsContext(t *testing.T) {
	b := &stuckBackend{Backend: memstore.New(), stuck: make(chan struct{}), entered: make(chan struct{}, 1)}
	g := guard.New(b, guard.WithWatchdogTimeout(300*time.Millisecond))
	defer func() {
		close(b.stuck)
		require.NoError(t, g.Close(context.Background()))
	}()
	_, err := g.Acquire(t.Context(), "job")
	require.NoError(t, err)
	<-b.entered // a renewal is out, and stays out
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- g.Close(ctx) }()
	select {
	case err := <-returned:
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "renewals")
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return when its context ended")
	}
}

// deadConnBackend's Release waits until its context ends, as a driver does on a connection
// that died without a word.
type deadConnBackend struct{ guard.Backend }

func (b deadConnBackend) Release(ctx context.Context, name, token string, keep time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestReleaseWithoutDeadlineIsBounded: Release under a context without a deadline returns
// even when the backend never answers (a chaos worker hung for good in pgx's read of a dead
// connection at shutdown).
func TestReleaseWithoutDeadlineIsBounded(t *testing.T) {
	g := guard.New(deadConnBackend{memstore.New()})
	defer func() { _ = g.Close(context.Background()) }() // once the resends stop, with the lease
	l, err := g.Acquire(t.Context(), "job", guard.LeaseTime(2*time.Second))
	require.NoError(t, err)
	returned := make(chan error, 1)
	go func() { returned <- l.Release(context.Background()) }()
	select {
	case err := <-returned:
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(30 * time.Second):
		t.Fatal("Release under a context without a deadline waited for a backend that never answers")
	}
}
