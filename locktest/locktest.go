package locktest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/guardlock/guard"
)

// Target is one backend with its own client, and how to count its network round trips.
type Target struct {
	Backend guard.Backend
	// RoundTrips returns the number of network round trips this backend's client made so
	// far, not counting the ones that open connections or look up the server's topology; nil
	// when the backend makes none (memstore) or cannot count them. The suite then checks that
	// each uncontended operation is one round trip, on a backend that has served one request
	// already.
	RoundTrips func() int64
}

// Harness tells the suite how to reach a backend and how to hurt it. New, Delete, Overwrite
// and Wipe are required; Killable is optional.
type Harness struct {
	// New returns a backend with its own client on the shared server, as a separate service
	// instance would have. Clean it up with tb.Cleanup.
	New func(tb testing.TB) Target
	// Delete removes name's lock behind its holder's back.
	Delete func(tb testing.TB, name string)
	// Overwrite makes name held by another token behind its holder's back, keeping its lease.
	Overwrite func(tb testing.TB, name string)
	// Wipe loses every lock and fence of the backend, as a server restarted without
	// persistence, or an operator reclaiming state, would.
	Wipe func(tb testing.TB)
	// Killable starts a dedicated server and returns a backend on it and a function that
	// kills the server (SIGKILL). Nil for a backend without a server (memstore): the test of a
	// dying server is then skipped.
	Killable func(tb testing.TB) (Target, func())
	// NoSharing says that the backend has no shared holds (guard.Sharing): the tests of
	// semaphores and read-write locks are then skipped. Without it, a backend that lacks
	// Sharing fails them.
	NoSharing bool
}

// Run runs every contract test against the backend of h, each as a subtest: mutual exclusion
// and fences across Guards, stale holders, the watchdog's cadence, loss (deleted and
// overwritten locks, a killed server), fixed leases, MinHold (also with a renewal in flight at
// the release, and with a waiter behind it), waiting (wake-ups, crashed holders, cancellation,
// WaitTime), reentrancy, a retried acquire, Extend batches that mix stale and live tokens of
// one name or name one lock twice (the last lease stands), instances and labels with NUL bytes, invalid UTF-8 and 1 KiB, fences after data
// loss, one round trip per operation, typed errors, Close, and — when the backend implements
// guard.Inspector — inspection, paging and forced release, which must leave a lock taken
// after the caller looked alone; and the primitives: semaphores (never more holders than
// permits; a dead holder's permit comes back), read-write locks (readers together, a writer
// alone and not passed by later readers), multi-locks (all or nothing, no deadlock between
// overlapping sets, one lock lost is the group lost) and elections (one leader at a time, seen
// by Leader and Observe in order). The tests take a minute or two on a local server.
func Run(t *testing.T, h Harness) {
	t.Run("MutualExclusion", func(t *testing.T) { testMutualExclusion(t, h) })
	t.Run("StaleHolder", func(t *testing.T) { testStaleHolder(t, h) })
	t.Run("Watchdog", func(t *testing.T) { testWatchdog(t, h) })
	t.Run("Loss", func(t *testing.T) { testLoss(t, h) })
	t.Run("LeaseTime", func(t *testing.T) { testLeaseTime(t, h) })
	t.Run("MinHold", func(t *testing.T) { testMinHold(t, h) })
	t.Run("MinHoldRenewalInFlight", func(t *testing.T) { testMinHoldRenewalInFlight(t, h) })
	t.Run("MinHoldWaiter", func(t *testing.T) { testMinHoldWaiter(t, h) })
	t.Run("OwnRetry", func(t *testing.T) { testOwnRetry(t, h) })
	t.Run("ExtendMixed", func(t *testing.T) { testExtendMixed(t, h) })
	t.Run("ExtendDuplicate", func(t *testing.T) { testExtendDuplicate(t, h) })
	t.Run("MetadataValues", func(t *testing.T) { testMetadataValues(t, h) })
	t.Run("FenceAfterDataLoss", func(t *testing.T) { testFenceAfterDataLoss(t, h) })
	t.Run("Inspect", func(t *testing.T) { testInspect(t, h) })
	t.Run("Waiting", func(t *testing.T) { testWaiting(t, h) })
	t.Run("Reentrancy", func(t *testing.T) { testReentrancy(t, h) })
	t.Run("RoundTrips", func(t *testing.T) { testRoundTrips(t, h) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, h) })
	t.Run("Close", func(t *testing.T) { testClose(t, h) })
	t.Run("Semaphore", func(t *testing.T) { testSemaphore(t, h) })
	t.Run("RWMutex", func(t *testing.T) { testRWMutex(t, h) })
	t.Run("AcquireAll", func(t *testing.T) { testAcquireAll(t, h) })
	t.Run("Election", func(t *testing.T) { testElection(t, h) })
}

// uniqueName returns a lock name no other test uses, so that tests on a shared server never
// see each other's locks.
func uniqueName(t testing.TB) string {
	return "locktest:" + t.Name() + ":" + time.Now().Format("150405.000000000")
}

// newGuard returns a Guard on a new client of the harness, closed when the test ends.
func newGuard(t testing.TB, h Harness, opts ...guard.Option) (*guard.Guard, Target) {
	t.Helper()
	target := h.New(t)
	g := guard.New(target.Backend, opts...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	})
	return g, target
}

// recorder is an Observer that keeps what the suite checks: acquisitions and lock events.
type recorder struct {
	mu      sync.Mutex // protects acqs, events and changed
	acqs    []guard.Acquisition
	events  []recorded
	changed chan struct{} // closed (and replaced) when an event comes in
}

type recorded struct {
	name string
	ev   guard.LockEvent
}

func (r *recorder) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context {
	return ctx
}

func (r *recorder) AcquireEnd(ctx context.Context, a *guard.Acquisition, _ *guard.Lock, _ error) context.Context {
	r.mu.Lock()
	r.acqs = append(r.acqs, *a)
	r.mu.Unlock()
	return ctx
}

func (r *recorder) LockEvent(l *guard.Lock, e guard.LockEvent) {
	r.mu.Lock()
	r.events = append(r.events, recorded{name: l.Name(), ev: e})
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
	r.mu.Unlock()
}

// awaitEvent waits until the observer has heard an event of kind k for name, and returns the
// events of that kind: the Guard delivers the watchdog's events on a goroutine of its own.
func (r *recorder) awaitEvent(t testing.TB, name string, k guard.EventKind) []guard.LockEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		changed := r.changed
		r.mu.Unlock()
		if evs := r.eventsOf(name, k); len(evs) > 0 {
			return evs
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no %v event for %q", k, name)
		}
	}
}

// eventsOf returns the events of kind k for name.
func (r *recorder) eventsOf(name string, k guard.EventKind) []guard.LockEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []guard.LockEvent
	for _, e := range r.events {
		if e.name == name && e.ev.Kind == k {
			out = append(out, e.ev)
		}
	}
	return out
}

// lastAcquisition returns the last acquisition of name that ended.
func (r *recorder) lastAcquisition(name string) (guard.Acquisition, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.acqs) - 1; i >= 0; i-- {
		if r.acqs[i].Name == name {
			return r.acqs[i], true
		}
	}
	return guard.Acquisition{}, false
}

// Spy is a backend that reports each busy answer to Acquire on Busy, so that a test knows its
// waiter is parked without sleeping. It passes release notifications through when the
// backend it wraps has them; otherwise its Subscribe fails, and a Guard waits without them.
type Spy struct {
	guard.Backend
	busy chan struct{}
}

// NewSpy wraps b; Busy buffers up to buffer answers and drops the ones beyond.
func NewSpy(b guard.Backend, buffer int) *Spy {
	return &Spy{Backend: b, busy: make(chan struct{}, buffer)}
}

// Busy receives one value per busy answer to Acquire.
func (s *Spy) Busy() <-chan struct{} { return s.busy }

// Acquire is the backend's Acquire, reporting busy answers.
func (s *Spy) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	fence, err := s.Backend.Acquire(ctx, r)
	if errors.Is(err, guard.ErrNotAcquired) {
		select {
		case s.busy <- struct{}{}:
		default:
		}
	}
	return fence, err
}

// Subscribe is the backend's Subscribe, or an error when it has none.
func (s *Spy) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	n, ok := s.Backend.(guard.Notifier)
	if !ok {
		return nil, errNoNotifications
	}
	return n.Subscribe(notify)
}

var errNoNotifications = errors.New("locktest: the backend has no release notifications")

// waiter is an acquisition that waits in a goroutine of its own.
type waiter struct {
	got  chan *guard.Lock
	errc chan error
}

// startWaiting runs acquire in a goroutine, and returns once sp reports it waiting.
func startWaiting(t *testing.T, sp *Spy, acquire func() (*guard.Lock, error)) *waiter {
	t.Helper()
	w := &waiter{got: make(chan *guard.Lock, 1), errc: make(chan error, 1)}
	go func() {
		l, err := acquire()
		if err != nil {
			w.errc <- err
			return
		}
		w.got <- l
	}()
	parked(t, sp)
	return w
}

// waitMinute starts a Guard on a new backend of h waiting up to a minute for name, and returns
// once it waits.
func waitMinute(t *testing.T, h Harness, name string) *waiter {
	t.Helper()
	sp := NewSpy(h.New(t).Backend, 64)
	g := guard.New(sp)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return startWaiting(t, sp, func() (*guard.Lock, error) {
		return g.Acquire(t.Context(), name, guard.WaitTime(time.Minute))
	})
}

// lock returns the lock the waiter got, and fails the test with why when it gets none within
// d.
func (w *waiter) lock(t *testing.T, d time.Duration, why string) *guard.Lock {
	t.Helper()
	select {
	case l := <-w.got:
		return l
	case err := <-w.errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(d):
		t.Fatal(why)
	}
	return nil
}
