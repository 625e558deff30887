package guard_test

// Each test here reproduces a defect found by review or by programs run against real servers
// (issue 8), through the public API, with a backend wrapper that injects the fault.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
	"github.com/guardlock/guard/memstore"
)

// lostReply runs the first acquire request it sees and then reports a broken connection
// instead of its answer: the server took the lock, the client never heard.
type lostReply struct {
	guard.Backend
	once sync.Once
}

func (b *lostReply) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	fence, err := b.Backend.Acquire(ctx, r)
	lost := false
	b.once.Do(func() { lost = err == nil })
	if lost {
		return 0, errors.New("read tcp 127.0.0.1:40001: connection reset by peer")
	}
	return fence, err
}

// TestAmbiguousAcquireIsCleanedUp (defect 1): an acquire whose reply was lost after the
// backend ran it must not orphan the lock for a whole lease: the Guard releases its token.
func TestAmbiguousAcquireIsCleanedUp(t *testing.T) {
	store := memstore.New()
	g := newGuard(t, &lostReply{Backend: store})
	other := newGuard(t, store)

	_, err := g.TryAcquire(t.Context(), "n")
	require.Error(t, err)
	assert.NotErrorIs(t, err, guard.ErrNotAcquired, "a lost reply is a backend failure, not busy")

	// The orphan's lease is the default 30 s; the clean-up frees the name long before.
	l, err := other.Acquire(t.Context(), "n", guard.WaitTime(5*time.Second))
	require.NoError(t, err, "the lock whose reply was lost stayed taken")
	require.NoError(t, l.Release(t.Context()))
}

// deafSubscription confirms every Watch and never reports a release: a subscription whose
// connection is down, or a notice lost in a reconnect.
type deafSubscription struct{ *memstore.Store }

func (d deafSubscription) Subscribe(func(guard.Notice)) (guard.Subscription, error) { return d, nil }
func (deafSubscription) Watch(context.Context, string) error                        { return nil }
func (deafSubscription) Unwatch(string)                                             {}
func (deafSubscription) Close() error                                               { return nil }

// TestLocalReleaseWakesWithoutNotice (defect 5): a release on the same Guard must wake its
// local waiter itself, not count on the backend's notice, which may never come.
func TestLocalReleaseWakesWithoutNotice(t *testing.T) {
	sp := locktest.NewSpy(deafSubscription{memstore.New()}, 8)
	g := newGuard(t, sp)
	l, err := g.Acquire(t.Context(), "n") // the holder's lease: 30 s
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		w, err := g.Acquire(t.Context(), "n")
		if err == nil {
			err = w.Release(t.Context())
		}
		got <- err
	}()
	<-sp.Busy()
	<-sp.Busy() // parked
	require.NoError(t, l.Release(t.Context()))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the local waiter slept on after a local release (until the holder's 30 s lease)")
	}
}

// failingRelease fails every release with a network error, after the work is done.
type failingRelease struct{ guard.Backend }

func (failingRelease) Release(context.Context, string, string, time.Duration) error {
	return errors.New("dial tcp 127.0.0.1:40001: connection refused")
}

// TestDoAfterTheWorkSucceeded (defect 6): when fn succeeded and only the release failed, Do
// must not report the work as failed (inviting a second run); the observer hears of the
// failed release. A release that finds the lock gone is a loss, and is reported.
func TestDoAfterTheWorkSucceeded(t *testing.T) {
	t.Run("ReleaseFails", func(t *testing.T) {
		rec := &releaseErrors{}
		g := newGuard(t, failingRelease{memstore.New()}, guard.WithObserver(rec))
		runs := 0
		err := g.Do(t.Context(), "n", func(context.Context) error { runs++; return nil })
		require.NoError(t, err, "the work succeeded; only the release failed")
		assert.Equal(t, 1, runs)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Len(t, rec.errs, 1, "the observer was not told of the failed release")
		assert.ErrorContains(t, rec.errs[0], "connection refused")
	})
	t.Run("LockGoneAtRelease", func(t *testing.T) {
		store := memstore.New()
		g := newGuard(t, store)
		err := g.Do(t.Context(), "n", func(ctx context.Context) error {
			// Broken behind our back; the watchdog has not noticed yet.
			return store.ForceRelease(ctx, "n", 0)
		})
		require.ErrorIs(t, err, guard.ErrLockLost, "the work may not have run alone")
	})
}

// releaseErrors is an Observer that keeps the errors of releases.
type releaseErrors struct {
	events
	mu   sync.Mutex // protects errs
	errs []error
}

func (r *releaseErrors) LockEvent(l *guard.Lock, e guard.LockEvent) {
	if e.Kind == guard.EventReleased && e.Err != nil {
		r.mu.Lock()
		r.errs = append(r.errs, e.Err)
		r.mu.Unlock()
	}
}

// TestWaitTimeBoundsAHungWatch (defect 7): WaitTime must end a wait even while the waiter's
// Watch is still being confirmed.
func TestWaitTimeBoundsAHungWatch(t *testing.T) {
	store := memstore.New()
	holder := newGuard(t, store)
	l, err := holder.Acquire(t.Context(), "a")
	require.NoError(t, err)
	defer l.Release(t.Context())
	g := newGuard(t, hungWatch{Store: store, watching: make(chan string, 4)})

	done := make(chan error, 1)
	go func() {
		_, err := g.Acquire(context.Background(), "a", guard.WaitTime(100*time.Millisecond))
		done <- err
	}()
	select {
	case err := <-done:
		var busy *guard.BusyError
		require.ErrorAs(t, err, &busy)
		assert.GreaterOrEqual(t, busy.Waited, 100*time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("WaitTime(100ms) did not end a wait whose Watch hung")
	}
}

// releasingObserver releases a lock when it hears that the lock was lost: reasonable user
// code, which must not deadlock the Guard.
type releasingObserver struct {
	events
	released chan error
}

func (o *releasingObserver) LockEvent(l *guard.Lock, e guard.LockEvent) {
	o.events.LockEvent(l, e)
	if e.Kind == guard.EventLost {
		o.released <- l.Release(context.Background())
	}
}

// TestObserverMayCallBack (defect 8): an observer that releases the lock on its loss event
// must return; the Guard must go on enforcing its other locks' deadlines, and Close must
// return.
func TestObserverMayCallBack(t *testing.T) {
	store := memstore.New()
	obs := &releasingObserver{released: make(chan error, 1)}
	g := guard.New(store, guard.WithObserver(obs), guard.WithWatchdogTimeout(300*time.Millisecond))

	lost, err := g.Acquire(t.Context(), "lost")
	require.NoError(t, err)
	fixed, err := g.Acquire(t.Context(), "fixed", guard.LeaseTime(400*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, store.ForceRelease(t.Context(), "lost", 0))

	select {
	case err := <-obs.released:
		require.ErrorIs(t, err, guard.ErrNotHeld)
	case <-time.After(5 * time.Second):
		t.Fatal("the observer's Release never returned")
	}
	<-lost.Done()
	select {
	case <-fixed.Done():
		require.ErrorIs(t, fixed.Err(), guard.ErrLeaseExpired)
	case <-time.After(5 * time.Second):
		t.Fatal("a LeaseTime(400ms) lock outlived its lease: the Guard stopped enforcing deadlines")
	}
	closed := make(chan error, 1)
	go func() { closed <- g.Close(context.Background()) }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
}

// TestReleaseWithCancelledContext (defect 9): a release with a context that is already
// cancelled — a handler whose request ended — must still reach the backend.
func TestReleaseWithCancelledContext(t *testing.T) {
	store := memstore.New()
	g, other := newGuard(t, store), newGuard(t, store)
	ctx, cancel := context.WithCancel(t.Context())
	l, err := g.Acquire(ctx, "n", guard.LeaseTime(5*time.Second))
	require.NoError(t, err)
	cancel()
	require.NoError(t, l.Release(ctx))
	l2, err := other.TryAcquire(t.Context(), "n")
	require.NoError(t, err, "the release never reached the backend: the name stays taken for the lease")
	require.NoError(t, l2.Release(t.Context()))
}

// slowGrant delays the answer of the first grant by delay: a reply slower than the lease.
type slowGrant struct {
	guard.Backend
	delay time.Duration
	n     atomic.Int32
}

func (b *slowGrant) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	fence, err := b.Backend.Acquire(ctx, r)
	if err == nil && b.n.Add(1) == 1 {
		<-time.After(b.delay) // the fault: the answer is on the wire this long
	}
	return fence, err
}

// TestLateGrantIsNotReturned (defect 10): a grant whose answer arrives after the lease it set
// could have ended must not come back as a live lock.
func TestLateGrantIsNotReturned(t *testing.T) {
	const lease = 50 * time.Millisecond
	t.Run("OneAttempt", func(t *testing.T) {
		g := newGuard(t, &slowGrant{Backend: memstore.New(), delay: 2 * lease})
		l, err := g.TryAcquire(t.Context(), "n", guard.LeaseTime(lease))
		if err == nil {
			t.Fatalf("a lock past its deadline (%v ago) was returned, its context live: %v",
				time.Since(l.Deadline()), l.Err())
		}
		assert.NotErrorIs(t, err, guard.ErrNotAcquired)
	})
	t.Run("Waiting", func(t *testing.T) {
		g := newGuard(t, &slowGrant{Backend: memstore.New(), delay: 2 * lease})
		l, err := g.Acquire(t.Context(), "n", guard.LeaseTime(lease), guard.WaitTime(5*time.Second))
		require.NoError(t, err, "the wait goes on after a late grant")
		assert.True(t, time.Now().Before(l.Deadline()), "the lock returned is past its deadline")
		require.NoError(t, l.Err())
	})
}

// reorderedExtend answers extensions out of order: the one to 10 s reaches the backend first
// but its answer comes back only after a later extension's (or after 300 ms).
type reorderedExtend struct {
	guard.Backend
	entered chan struct{} // closed when the 10 s extension reached the backend
	later   chan struct{} // closed when a later extension answered
	once    sync.Once
}

func (b *reorderedExtend) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := b.Backend.Extend(ctx, leases)
	if leases[0].TTL == 10*time.Second {
		close(b.entered)
		select {
		case <-b.later:
		case <-time.After(300 * time.Millisecond):
		}
		return errs
	}
	b.once.Do(func() { close(b.later) })
	return errs
}

// TestConcurrentExtends (defect 11): the extension the backend applied last must set the
// lock's deadline, whatever order the answers come back in.
func TestConcurrentExtends(t *testing.T) {
	b := &reorderedExtend{Backend: memstore.New(), entered: make(chan struct{}), later: make(chan struct{})}
	g := newGuard(t, b)
	l, err := g.TryAcquire(t.Context(), "n", guard.LeaseTime(time.Second))
	require.NoError(t, err)
	first := make(chan error, 1)
	go func() { first <- l.Extend(t.Context(), 10*time.Second) }()
	<-b.entered
	require.NoError(t, l.Extend(t.Context(), 300*time.Millisecond))
	require.NoError(t, <-first)
	// The backend applied the 10 s extension first, the 300 ms one last: its lease ends in
	// 300 ms, and so must the lock's context.
	select {
	case <-l.Done():
		require.ErrorIs(t, l.Err(), guard.ErrLeaseExpired)
	case <-time.After(3 * time.Second):
		t.Fatalf("the lock's context outlived the lease the backend holds (deadline in %v)", time.Until(l.Deadline()))
	}
}

// lostExtendReply runs every extension and then reports a broken connection instead of its
// answer: the server moved the lease's end, the client never heard.
type lostExtendReply struct{ guard.Backend }

func (b lostExtendReply) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := b.Backend.Extend(ctx, leases)
	for i, err := range errs {
		if err == nil {
			errs[i] = errors.New("read tcp 127.0.0.1:40001: connection reset by peer")
		}
	}
	return errs
}

// TestShorteningExtendWithLostReply (defect 12, found by the chaos run on MariaDB): an Extend
// to a shorter lease than the one left may be applied even when its answer is lost. Until it
// answers, the lock must already count on the shorter lease: no other holder may get the
// name while the lock's context still lives.
func TestShorteningExtendWithLostReply(t *testing.T) {
	store := memstore.New()
	g := newGuard(t, lostExtendReply{store})
	other := newGuard(t, store)
	l, err := g.TryAcquire(t.Context(), "n", guard.LeaseTime(10*time.Second))
	require.NoError(t, err)
	start := time.Now()
	require.Error(t, l.Extend(t.Context(), 300*time.Millisecond), "the answer was lost")
	assert.False(t, l.Deadline().After(start.Add(300*time.Millisecond)),
		"the deadline still counts on the old lease: %v after the extension was sent", l.Deadline().Sub(start))
	next, err := other.Acquire(t.Context(), "n", guard.WaitTime(5*time.Second))
	require.NoError(t, err, "the backend shortened the lease")
	defer next.Release(context.Background())
	select {
	case <-l.Done():
	default:
		t.Fatalf("another holder got the name while the lock's context lived on (deadline in %v)", time.Until(l.Deadline()))
	}
}

// TestLostLocksAreForgotten: a lock that ends on its own and is never released must not stay
// in the Guard (memory, and a hold span that never ends).
func TestLostLocksAreForgotten(t *testing.T) {
	store := memstore.New()
	g := newGuard(t, store, guard.WithWatchdogTimeout(60*time.Millisecond))
	var locks []*guard.Lock
	for i := range 50 {
		l, err := g.Acquire(t.Context(), string(rune('a'+i%26))+string(rune('0'+i/26)))
		require.NoError(t, err)
		locks = append(locks, l)
	}
	expiring, err := g.Acquire(t.Context(), "expiring", guard.LeaseTime(50*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, 51, guard.HeldLocks(g))
	for _, l := range locks {
		// On a loaded host a 60 ms lease may have run out already: it ended on its own too.
		if err := store.ForceRelease(t.Context(), l.Name(), 0); !errors.Is(err, guard.ErrNotHeld) {
			require.NoError(t, err)
		}
	}
	for _, l := range append(locks, expiring) {
		<-l.Done()
	}
	assert.Zero(t, guard.HeldLocks(g), "locks that ended on their own are still held by the Guard")
}
