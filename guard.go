package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/guardlock/guard/watchdog"
)

// Guard hands out locks on one backend. It owns the watchdog that renews its locks, the one
// release subscription its waiters share, and every lock it gave until that lock is released
// or the Guard is closed. A Guard is safe for concurrent use; make one per backend and
// process, and Close it on shutdown.
type Guard struct {
	backend     Backend
	backendName string   // the backend's package name, for telemetry
	notifier    Notifier // nil when the backend cannot announce releases
	obs         Observer // nil: no telemetry
	watchdogTTL time.Duration
	sched       *watchdog.Scheduler
	// life ends when Close begins: it ends waits and the Watch calls in flight.
	life    context.Context
	endLife context.CancelFunc

	mu     sync.Mutex // protects held and closed
	held   map[*Lock]struct{}
	closed bool

	wmu     sync.Mutex // protects waiters and the n, queue and gone fields of each; never held while calling out
	waiters map[string]*waitList

	subMu   sync.Mutex // protects sub and subDone; held to open or close the subscription, never during a Watch
	sub     Subscription
	subDone bool
}

// waitList is the set of callers of one Guard waiting for one name. The first waiter asks the
// subscription to watch the name; the last one to leave unwatches it. A list stays in the map
// while it is being unwatched (gone is then set), so that a new first waiter's Watch is always
// sent after the old Unwatch.
//
// A release wakes one waiter, the one queued longest, not all of them: only one can win, and
// the others would each spend a round trip to learn that. A waiter that is woken but leaves
// without the lock passes the wake-up on.
type waitList struct {
	n     int             // waiters registered
	queue []chan struct{} // the waiters' wake-up channels, oldest first
	// ready is closed once the first waiter's Watch has returned; watched tells whether it
	// succeeded (release notifications will arrive) and is read only after ready.
	ready   chan struct{}
	watched bool
	gone    chan struct{} // non-nil once the last waiter left; closed when Unwatch was sent
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
	g := &Guard{
		backend:     backend,
		obs:         s.observer,
		watchdogTTL: s.watchdogTimeout,
		held:        make(map[*Lock]struct{}),
		waiters:     make(map[string]*waitList),
	}
	g.life, g.endLife = context.WithCancel(context.Background())
	g.notifier, _ = backend.(Notifier)
	g.backendName = packageName(backend)
	g.sched = watchdog.New(g.renew)
	return g
}

// WatchdogTimeout returns the lease of locks taken without LeaseTime.
func (g *Guard) WatchdogTimeout() time.Duration { return g.watchdogTTL }

// Acquire takes the lock called name, waiting while someone else holds it: until ctx is done,
// or up to WaitTime when that option is given. Without LeaseTime the watchdog holds the lock
// until Release; with it, the lock lives that long.
//
// When ctx already carries a live Lock of this Guard on name (the caller runs under it),
// Acquire re-enters it instead of waiting for itself: it returns a handle whose Release does
// not free the name.
//
// Errors: a *BusyError (ErrNotAcquired) when one attempt found the lock held or the wait ran
// out; an error matching both ErrNotAcquired and ctx.Err() when ctx ended the wait; a
// *NameError or *OptionError for bad input; ErrClosed after Close; otherwise the backend's
// error, wrapped.
func (g *Guard) Acquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return g.acquire(ctx, name, -1, opts)
}

// TryAcquire is Acquire with one attempt by default: it returns a *BusyError at once when the
// lock is held. A WaitTime option still overrides that.
func (g *Guard) TryAcquire(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	return g.acquire(ctx, name, 0, opts)
}

// Do acquires name as Acquire does, runs fn under the lock's context, and releases the lock
// when fn returns or panics. If the lock was lost or its lease ran out while fn ran, the error
// matches ErrLockLost or ErrLeaseExpired, even when fn itself returned nil. Do releases with a
// context that ignores ctx's cancellation, bounded by the lock's lease.
func (g *Guard) Do(ctx context.Context, name string, fn func(context.Context) error, opts ...LockOption) (err error) {
	l, err := g.Acquire(ctx, name, opts...)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := l.releaseDetached(ctx); rerr != nil && l.lossCause() == nil {
			err = errors.Join(err, rerr)
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
// subscription, and waits for their goroutines. It returns the backend's release errors, if
// any; a lock that was no longer held is not one. Close is idempotent.
func (g *Guard) Close(ctx context.Context) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.endLife()
	locks := make([]*Lock, 0, len(g.held))
	for l := range g.held {
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
	g.subMu.Lock()
	sub := g.sub
	g.sub, g.subDone = nil, true
	g.subMu.Unlock()
	if sub != nil {
		if err := sub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("guard: close subscription: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (g *Guard) acquire(ctx context.Context, name string, defaultWait time.Duration, opts []LockOption) (*Lock, error) {
	s, err := resolve(defaultWait, opts)
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

	a := &Acquisition{Name: name, Label: s.label, Backend: g.backendName, MaxWait: s.waitTime, Started: time.Now()}
	if g.obs != nil {
		ctx = g.obs.AcquireStart(ctx, a)
	}
	l, err := g.attempt(ctx, a, &s)
	a.Waited = time.Since(a.Started)
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

// attempt runs the attempts of one acquisition and sets a.Outcome.
func (g *Guard) attempt(ctx context.Context, a *Acquisition, s *lockSettings) (*Lock, error) {
	ttl, renewed := s.leaseTime, false
	if ttl == 0 {
		ttl, renewed = g.watchdogTTL, true
	}
	var giveUp time.Time
	if s.waitTime > 0 {
		giveUp = a.Started.Add(s.waitTime)
	}
	var (
		wl      *waitList
		sig     chan struct{} // a release hands us its wake-up here; one at most
		woken   bool          // we took a wake-up and no attempt has answered since
		backoff = firstBackoff
	)
	defer func() {
		if wl == nil {
			return
		}
		g.dequeue(wl, sig)
		if a.Outcome != OutcomeAcquired && (woken || len(sig) > 0) {
			// A release woke us, but we leave without the lock: wake the next waiter instead,
			// or it would sleep until its fallback.
			g.wake(a.Name)
		}
		g.unregister(a.Name)
	}()
	for {
		if err := ctx.Err(); err != nil {
			a.Outcome = OutcomeCanceled
			return nil, canceled(a.Name, ctx)
		}
		if wl != nil {
			// Queue before the attempt, so that a release while it is out still wakes us.
			g.enqueue(wl, sig)
		}
		token := rand.Text()
		start := time.Now()
		a.Attempts++
		fence, err := g.backend.Acquire(ctx, a.Name, token, ttl)
		if err == nil {
			woken = false
			a.Outcome = OutcomeAcquired
			return &Lock{
				g: g, name: a.Name, token: token, label: s.label, fence: fence,
				ttl: ttl, renewed: renewed, minHold: s.minHold,
				start: start, heldAt: time.Now(), prev: innermost(ctx),
			}, nil
		}
		var busy *BusyError
		if !errors.As(err, &busy) {
			// A wake-up that this attempt did not use (it was cancelled, or the backend
			// failed) is passed on when we leave.
			if ctx.Err() != nil {
				a.Outcome = OutcomeCanceled
				return nil, canceled(a.Name, ctx)
			}
			a.Outcome = OutcomeError
			return nil, fmt.Errorf("guard: acquire %q: %w", a.Name, err)
		}
		woken = false // the wake-up is used: someone else holds the lock, and its release wakes us
		if s.waitTime == 0 {
			a.Outcome = OutcomeBusy
			return nil, busy
		}
		if wl == nil {
			// From now on a release of the name wakes us. Try again at once: the holder may
			// have released it between our attempt and the watch.
			var werr error
			if wl, werr = g.register(ctx, a.Name); werr != nil {
				a.Outcome = waitOutcome(werr)
				return nil, werr
			}
			sig = make(chan struct{}, 1)
			continue
		}

		// Sleep until a release wakes us, or until the holder's lease would have run out
		// (a crashed holder never releases), whichever comes first.
		delay := busy.Remaining
		if !wl.watched || delay <= 0 {
			// No notifications from other processes: back off, but never past the holder's
			// expiry. Jitter keeps many waiters from hitting the backend in step.
			delay = jitter(backoff, delay)
			backoff = min(2*backoff, maxBackoff)
		} else {
			delay += time.Duration(mrand.Int64N(int64(delay/50) + int64(time.Millisecond)))
		}
		if !giveUp.IsZero() {
			left := time.Until(giveUp)
			if left <= 0 {
				a.Outcome = OutcomeTimeout
				return nil, fmt.Errorf("guard: gave up waiting for %q after %v: %w", a.Name, s.waitTime, busy)
			}
			delay = min(delay, left)
		}
		t := time.NewTimer(delay)
		select {
		case <-sig:
			a.Wakeups++
			woken = true
		case <-t.C:
		case <-ctx.Done():
		case <-g.life.Done():
			t.Stop()
			a.Outcome = OutcomeError
			return nil, ErrClosed
		}
		t.Stop()
	}
}

// waitOutcome classifies an error that ended a wait before an attempt.
func waitOutcome(err error) Outcome {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return OutcomeCanceled
	}
	return OutcomeError
}

const (
	firstBackoff = 10 * time.Millisecond
	maxBackoff   = time.Second
)

// jitter returns a delay between half of and all of backoff, but no later than limit when
// limit is positive.
func jitter(backoff, limit time.Duration) time.Duration {
	d := backoff/2 + time.Duration(mrand.Int64N(int64(backoff/2)+1))
	if limit > 0 {
		d = min(d, limit)
	}
	return d
}

func canceled(name string, ctx context.Context) error {
	return fmt.Errorf("guard: waiting for %q: %w: %w", name, ErrNotAcquired, ctx.Err())
}

func (g *Guard) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// hold starts the life of a lock that the backend granted: its context, its lease in the
// watchdog, and its place among the Guard's locks.
func (g *Guard) hold(parent context.Context, l *Lock) error {
	l.ctx, l.cancel = context.WithCancelCause(context.WithValue(parent, lockKey{}, l))
	l.lease = watchdog.Lease{Name: l.name, Token: l.token, Owner: (*leaseOwner)(l)}
	if l.renewed {
		l.lease.TTL = l.ttl
	}
	g.mu.Lock()
	closed := g.closed
	if !closed {
		// Under g.mu, so that Close either sees the lock held and watched, or not at all.
		g.held[l] = struct{}{}
		g.sched.Add(&l.lease, l.start, l.ttl)
	}
	g.mu.Unlock()
	if closed {
		// Close ran while we were acquiring: give the lock back at once.
		l.released = true
		_ = g.release(context.WithoutCancel(parent), l, ErrClosed)
		return ErrClosed
	}
	return nil
}

func (g *Guard) event(l *Lock, e LockEvent) {
	if g.obs == nil {
		return
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	g.obs.LockEvent(l, e)
}

// release gives l back to the backend and ends its context with cause. The caller has marked
// l released.
func (g *Guard) release(ctx context.Context, l *Lock, cause error) error {
	g.sched.Remove(&l.lease)
	lost := l.lossCause()
	l.cancel(cause)
	g.mu.Lock()
	delete(g.held, l)
	g.mu.Unlock()

	var keep time.Duration
	if l.minHold > 0 {
		keep = l.minHold - time.Since(l.heldAt)
	}
	start := time.Now()
	err := g.backend.Release(ctx, l.name, l.token, keep)
	took := time.Since(start)
	switch {
	case err == nil:
		if keep <= 0 {
			g.wakeLocal(l.name)
		}
	case errors.Is(err, ErrNotHeld) && lost != nil:
		err = fmt.Errorf("guard: release %q: %w (%w)", l.name, err, lost)
	default:
		err = fmt.Errorf("guard: release %q: %w", l.name, err)
	}
	g.event(l, LockEvent{Kind: EventReleased, At: start.Add(took), Err: err, Duration: took})
	return err
}

// renew is the watchdog's RenewFunc: one backend call for the whole batch.
func (g *Guard) renew(ctx context.Context, batch []*watchdog.Lease) ([]watchdog.Result, []error) {
	leases := make([]Lease, len(batch))
	for i, l := range batch {
		leases[i] = Lease{Name: l.Name, Token: l.Token, TTL: l.TTL}
	}
	errs := g.backend.Extend(ctx, leases)
	results := make([]watchdog.Result, len(batch))
	if len(errs) != len(batch) {
		err := fmt.Errorf("guard: backend extended %d leases, asked %d", len(errs), len(batch))
		errs = make([]error, len(batch))
		for i := range batch {
			results[i], errs[i] = watchdog.Failed, err
		}
		return results, errs
	}
	for i, err := range errs {
		switch {
		case err == nil:
			results[i] = watchdog.Renewed
		case errors.Is(err, ErrNotHeld):
			results[i] = watchdog.NotHeld
		default:
			results[i] = watchdog.Failed
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

// register adds a waiter for name and makes sure the Guard's subscription watches it.
func (g *Guard) register(ctx context.Context, name string) (*waitList, error) {
	for {
		g.wmu.Lock()
		wl := g.waiters[name]
		if wl != nil && wl.gone != nil {
			// The last waiter is unwatching the name: watch it again only after that.
			gone := wl.gone
			g.wmu.Unlock()
			select {
			case <-gone:
				continue
			case <-ctx.Done():
				return nil, canceled(name, ctx)
			case <-g.life.Done():
				return nil, ErrClosed
			}
		}
		first := wl == nil
		if first {
			wl = &waitList{ready: make(chan struct{})}
			g.waiters[name] = wl
		}
		wl.n++
		g.wmu.Unlock()

		if first {
			wl.watched = g.watch(ctx, name)
			close(wl.ready)
			return wl, nil
		}
		select {
		case <-wl.ready:
			return wl, nil
		case <-ctx.Done():
			g.unregister(name)
			return nil, canceled(name, ctx)
		case <-g.life.Done():
			g.unregister(name)
			return nil, ErrClosed
		}
	}
}

// watch asks the backend to report releases of name; it reports whether it will. It gives up
// when ctx ends or the Guard closes.
func (g *Guard) watch(ctx context.Context, name string) bool {
	if g.notifier == nil {
		return false
	}
	g.subMu.Lock()
	if g.sub == nil && !g.subDone {
		if sub, err := g.notifier.Subscribe(g.wake); err == nil {
			g.sub = sub
		}
	}
	sub := g.sub
	g.subMu.Unlock()
	if sub == nil {
		return false
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(g.life, cancel)
	defer stop()
	return sub.Watch(ctx, name) == nil
}

// unregister removes a waiter for name; the last one unwatches the name.
func (g *Guard) unregister(name string) {
	g.wmu.Lock()
	wl := g.waiters[name]
	wl.n--
	if wl.n > 0 {
		g.wmu.Unlock()
		return
	}
	// The last waiter: the first one's Watch has returned (it is counted until then).
	wl.gone = make(chan struct{})
	g.wmu.Unlock()

	if wl.watched {
		g.subMu.Lock()
		sub := g.sub
		g.subMu.Unlock()
		if sub != nil {
			sub.Unwatch(name)
		}
	}
	g.wmu.Lock()
	delete(g.waiters, name)
	g.wmu.Unlock()
	close(wl.gone)
}

// enqueue puts a waiter's wake-up channel at the back of wl's queue, unless it is queued.
func (g *Guard) enqueue(wl *waitList, sig chan struct{}) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if !slices.Contains(wl.queue, sig) {
		wl.queue = append(wl.queue, sig)
	}
}

// dequeue takes a waiter's wake-up channel out of wl's queue.
func (g *Guard) dequeue(wl *waitList, sig chan struct{}) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if i := slices.Index(wl.queue, sig); i >= 0 {
		wl.queue = slices.Delete(wl.queue, i, i+1)
	}
}

// wakeLocal wakes a waiter of this Guard after this Guard released name, unless the name is
// watched: the backend then announces the release to this Guard's subscription too, and a
// second wake-up would cost a waiter a round trip for nothing.
func (g *Guard) wakeLocal(name string) {
	g.wmu.Lock()
	wl := g.waiters[name]
	watched := wl != nil && wl.watchedNow()
	g.wmu.Unlock()
	if !watched {
		g.wake(name)
	}
}

// watchedNow reports whether the list's Watch has succeeded; false while it is in flight.
func (wl *waitList) watchedNow() bool {
	select {
	case <-wl.ready:
		return wl.watched
	default:
		return false
	}
}

// wake wakes the waiter of this Guard that has waited longest for name. The subscription
// calls it for releases elsewhere.
func (g *Guard) wake(name string) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	wl := g.waiters[name]
	if wl == nil || len(wl.queue) == 0 {
		return
	}
	sig := wl.queue[0]
	wl.queue = slices.Delete(wl.queue, 0, 1)
	select {
	case sig <- struct{}{}:
	default: // it has a wake-up it has not taken yet
	}
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
