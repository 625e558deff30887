package guard

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardlock/guard/internal/ilist"
	"github.com/guardlock/guard/internal/lease"
)

// Guard hands out locks on one backend. It owns the watchdog that renews its locks, the one
// release subscription its waiters share, and every lock it gave until that lock is released,
// lost, or the Guard is closed. A Guard is safe for concurrent use; make one per backend and
// process, and Close it on shutdown.
type Guard struct {
	backend     Backend
	backendName string   // the backend's package name, for telemetry
	notifier    Notifier // nil when the backend cannot announce releases
	obs         Observer // nil: no telemetry
	watchdogTTL time.Duration
	instance    string // Request.Instance of every acquisition
	sched       *lease.Scheduler
	// life ends when Close begins: it ends waits and the Watch calls in flight.
	life    context.Context
	endLife context.CancelFunc

	mu     sync.Mutex // protects held, the held links of every Lock, and closed's changes
	held   ilist.List[Lock]
	closed atomic.Bool

	tokens *tokens // the owner tokens of acquisitions

	// bg counts the Guard's background work: event deliveries to the observer and clean-up
	// releases after ambiguous acquisitions. Close waits for it; from then on, such work runs
	// on the goroutine that asks for it (see background).
	bg        sync.WaitGroup
	bgMu      sync.Mutex // protects bgClosing, and orders bg.Add before bg.Wait
	bgClosing bool

	waiting // the callers waiting for names; see wait.go
}

// New returns a Guard on backend. It panics if an option is invalid: that is a programming
// error, caught at start-up.
func New(backend Backend, opts ...Option) *Guard {
	if backend == nil {
		panic("guard: New with a nil Backend")
	}
	s := settings{watchdogTimeout: DefaultWatchdogTimeout}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.err != nil {
		panic(s.err.Error())
	}
	if s.instance == "" {
		s.instance = defaultInstance()
	}
	g := &Guard{
		backend:     backend,
		obs:         s.observer,
		watchdogTTL: s.watchdogTimeout,
		instance:    s.instance,
		held:        ilist.New(func(l *Lock) *ilist.Links[Lock] { return &l.held }),
		tokens:      newTokens(),
	}
	g.waiters = make(map[string]*waitList)
	g.byToken = make(map[string]*waiter)
	g.life, g.endLife = context.WithCancel(context.Background())
	g.notifier, _ = backend.(Notifier)
	g.backendName = packageName(backend)
	var partition func(string) string
	if p, ok := backend.(Partitioned); ok {
		partition = p.Partition
	}
	g.sched = lease.New(g.renew, partition)
	return g
}

// Acquire takes the lock called name, waiting while someone else holds it: until ctx is done,
// or up to WaitTime when that option is given. Without LeaseTime the watchdog holds the lock
// until Release; with it, the lock lives that long.
//
// When ctx already carries a live Lock of this Guard on name (the caller runs under it),
// Acquire re-enters it instead of waiting for itself: it returns a handle whose Release does
// not free the name.
//
// Errors: a *BusyError (ErrNotAcquired) when one attempt found the lock held or the wait ran
// out; an *OpError matching both ErrNotAcquired and ctx.Err() when ctx ended the wait; a
// *NameError or *OptionError for bad input; ErrClosed after Close; otherwise an *OpError
// that wraps the backend's error.
func (g *Guard) Acquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return g.acquire(ctx, name, -1, opts)
}

// TryAcquire is Acquire with one attempt by default: it returns a *BusyError at once when the
// lock is held. A WaitTime option still overrides that.
func (g *Guard) TryAcquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return g.acquire(ctx, name, 0, opts)
}

// Do acquires name as Acquire does, runs fn under the lock's context, and releases the lock
// when fn returns or panics. It returns fn's error, joined with the cause when the lock was
// lost or its lease ran out while fn ran (ErrLockLost, ErrLeaseExpired) — also when fn itself
// returned nil, because the work may not have run alone — and with ErrLockLost when the
// release found the lock no longer ours.
//
// A release that fails for another reason (the backend is unreachable) is not returned: the
// work is done, the lease runs out on its own, and returning an error would invite running fn
// again. The observer hears of it (EventReleased with Err).
func (g *Guard) Do(ctx context.Context, name string, fn func(context.Context) error, opts ...LockOption) (err error) {
	l, err := g.Acquire(ctx, name, opts...)
	if err != nil {
		return err
	}
	defer func() {
		rerr := l.Release(ctx)
		if errors.Is(rerr, ErrNotHeld) && l.lossCause() == nil {
			err = errors.Join(err, fmt.Errorf("%w: found at release", ErrLockLost))
		}
	}()
	err = fn(l.Context())
	if cause := l.lossCause(); cause != nil && !errors.Is(err, cause) {
		err = errors.Join(err, cause)
	}
	return err
}

// Close releases every lock this Guard still holds (their contexts end with cause ErrClosed),
// ends the waits of its callers with ErrClosed, stops the watchdog and the release
// subscription, and waits for their goroutines and for deliveries to the observer, as long as
// ctx allows. It returns the backend's release errors, if any; a lock that was no longer held
// is not one. Close is idempotent. An Observer must not call it.
func (g *Guard) Close(ctx context.Context) error {
	g.mu.Lock()
	if g.closed.Load() {
		g.mu.Unlock()
		return nil
	}
	g.closed.Store(true)
	g.endLife()
	locks := make([]*Lock, 0, g.held.Len())
	for l := g.held.Front(); l != nil; l = g.held.Next(l) {
		locks = append(locks, l)
	}
	g.mu.Unlock()

	var errs []error
	for _, l := range locks {
		if !l.markReleased() {
			continue
		}
		// A lock whose lease already ran out is not an error here: Close frees what is held.
		if err := g.release(ctx, l, ErrClosed); err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	g.sched.Close()
	if err := g.closeSubscription(); err != nil {
		errs = append(errs, err)
	}
	g.bgMu.Lock()
	g.bgClosing = true
	g.bgMu.Unlock()
	done := make(chan struct{})
	go func() {
		g.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("guard: close: waiting for the observer: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

func (g *Guard) acquire(ctx context.Context, name string, defaultWait time.Duration, opts []LockOption) (*Lock, error) {
	w := &waiter{g: g}
	err := w.s.resolve(defaultWait, opts)
	if err == nil {
		err = CheckName(name)
	}
	if err != nil {
		return nil, err
	}
	if outer := g.heldIn(ctx, name); outer != nil {
		if ctx.Err() != nil {
			return nil, canceled(name, ctx)
		}
		return outer.reenter(ctx), nil
	}
	if g.isClosed() {
		return nil, ErrClosed
	}

	w.start(name)
	a := &w.a
	if g.obs != nil {
		ctx = g.obs.AcquireStart(ctx, a)
	}
	l, err := w.wait(ctx)
	if l != nil {
		a.Waited = l.heldAt.Sub(a.Started)
	} else {
		a.Waited = time.Since(a.Started)
	}
	parent := ctx
	if g.obs != nil {
		parent = g.obs.AcquireEnd(ctx, a, l, err)
	}
	if l == nil {
		return nil, err
	}
	if err := g.hold(parent, l); err != nil {
		return nil, err
	}
	return l, nil
}

func canceled(name string, ctx context.Context) error {
	return &OpError{Op: "acquire", Name: name, Err: fmt.Errorf("%w: %w", ErrNotAcquired, ctx.Err())}
}

func (g *Guard) isClosed() bool { return g.closed.Load() }

// hold starts the life of a lock that the backend granted: its context, its lease in the
// watchdog, and its place among the Guard's locks.
func (g *Guard) hold(parent context.Context, l *Lock) error {
	cctx, cancel := context.WithCancelCause(parent)
	l.lctx = lockContext{Context: cctx, l: l}
	l.ctx, l.cancel = &l.lctx, cancel
	l.lease = lease.Lease{Name: l.name, Token: l.token, Owner: (*leaseOwner)(l)}
	if l.renewed {
		l.lease.TTL = l.ttl
	}
	if l.granted < l.ttl {
		l.lease.Claim = l.ttl // handed over with a short lease: claim the rest, unless released soon
	}
	g.mu.Lock()
	closed := g.closed.Load()
	if !closed {
		// Under g.mu, so that Close either sees the lock held and watched, or not at all.
		g.held.Push(l)
		g.sched.Add(&l.lease, l.start, l.granted)
	}
	g.mu.Unlock()
	if closed {
		// Close ran while we were acquiring: give the lock back at once.
		l.released.Store(true)
		_ = g.release(parent, l, ErrClosed)
		return ErrClosed
	}
	return nil
}

// forget drops l from the locks the Guard holds: it was released, or it ended on its own.
func (g *Guard) forget(l *Lock) {
	g.mu.Lock()
	g.held.Remove(l)
	g.mu.Unlock()
}

// releaseTimeout bounds a release whose context was already cancelled: it is sent all the
// same, so that a handler whose request ended still frees its lock.
const releaseTimeout = 5 * time.Second

// release gives l back to the backend and ends its context with cause. The caller has marked
// l released.
func (g *Guard) release(ctx context.Context, l *Lock, cause error) error {
	g.sched.Remove(&l.lease)
	lost := l.lossCause()
	l.cancel(cause)
	g.forget(l)

	var keep time.Duration
	if l.minHold > 0 {
		keep = l.minHold - time.Since(l.heldAt)
	}
	if ctx.Err() != nil {
		// Already cancelled (a handler whose request ended): release all the same.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	g.expectEcho(l.name, l.token)
	var start time.Time
	if g.obs != nil {
		start = time.Now()
	}
	err := g.backend.Release(ctx, l.name, l.token, keep)
	switch {
	case err == nil:
		// A MinHold release frees nothing, but a local waiter learns when the window ends.
		g.wakeAfterRelease(l.name)
	case errors.Is(err, ErrNotHeld) && lost != nil:
		err = &OpError{Op: "release", Name: l.name, Err: because(err, lost)}
	default:
		err = &OpError{Op: "release", Name: l.name, Err: err}
	}
	if g.obs != nil {
		took := time.Since(start)
		g.event(l, LockEvent{Kind: EventReleased, At: start.Add(took), Err: err, Duration: took})
	}
	return err
}

// cleanupTimeout bounds a clean-up release after an ambiguous acquisition.
const cleanupTimeout = 5 * time.Second

// cleanup releases token's lock on name in the background, in case an attempt whose outcome
// is unknown (its reply was lost, it came too late, its context ended while it was out) took
// the lock: nobody else may wait a whole lease for it. The release is owner-checked, so it
// never touches another owner's lock.
func (g *Guard) cleanup(name, token string) {
	g.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		g.expectEcho(name, token)
		if g.backend.Release(ctx, name, token, 0) == nil {
			g.wakeAfterRelease(name)
		}
	})
}

// background runs f on a goroutine that Close waits for — or, once Close waits, on this one.
func (g *Guard) background(f func()) {
	g.bgMu.Lock()
	if g.bgClosing {
		g.bgMu.Unlock()
		f()
		return
	}
	g.bg.Add(1)
	g.bgMu.Unlock()
	go func() {
		defer g.bg.Done()
		f()
	}()
}

// renew is the watchdog's RenewFunc: one backend call for the whole batch.
func (g *Guard) renew(ctx context.Context, batch []*lease.Lease) ([]lease.Result, []error) {
	leases := make([]Lease, len(batch))
	for i, l := range batch {
		leases[i] = Lease{Name: l.Name, Token: l.Token, TTL: l.RenewTTL()}
	}
	errs := g.backend.Extend(ctx, leases)
	results := make([]lease.Result, len(batch))
	if len(errs) != len(batch) {
		err := fmt.Errorf("guard: backend extended %d leases, asked %d", len(errs), len(batch))
		errs = make([]error, len(batch))
		for i := range batch {
			results[i], errs[i] = lease.Failed, err
		}
		return results, errs
	}
	for i, err := range errs {
		switch {
		case err == nil:
			results[i] = lease.Renewed
		case errors.Is(err, ErrNotHeld):
			results[i] = lease.NotHeld
		default:
			results[i] = lease.Failed
		}
	}
	return results, errs
}

// heldIn returns the live lock of this Guard on name that ctx runs under, if any.
func (g *Guard) heldIn(ctx context.Context, name string) *Lock {
	for l := innermost(ctx); l != nil; l = l.prev {
		root := l.root()
		if root.g == g && root.name == name && root.ctx.Err() == nil {
			return root
		}
	}
	return nil
}

// packageName returns the name of the package that defines v's type: "redisstore" for a
// *redisstore.Store.
func packageName(v any) string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	p := t.PkgPath()
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if p == "" {
		return t.String()
	}
	return p
}
