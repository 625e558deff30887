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
	"github.com/guardlock/guard/watchdog"
)

// Guard hands out locks on one backend. It owns the scheduler that owns its locks' leases,
// the registry of its waiting callers with the one release subscription they share, and every
// lock it gave until that lock is released, lost, or the Guard is closed. A Guard is safe for
// concurrent use; make one per backend and process, and Close it on shutdown.
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

	// bg counts the Guard's background work: event deliveries to the observer, the
	// registry's Watch calls, and releases sent again. Close waits for it; from then on, such
	// work runs on the goroutine that asks for it (see background).
	bg        sync.WaitGroup
	bgMu      sync.Mutex // protects bgClosing, and orders bg.Add before bg.Wait
	bgClosing bool

	waiters waiters // the callers waiting for names; see waiters.go

	bound atomic.Pointer[releaseBound] // the deadline of releases whose caller gave none
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
		panic(s.err) // a *OptionError: recover sees the type, and its message says it all
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
	g.waiters.init(g)
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
func (g *Guard) Do(ctx context.Context, name string, fn func(context.Context) error, opts ...LockOption) error {
	return g.do(ctx, name, fn, opts)
}

// do is Do, for the primitives too.
func (g *Guard) do(ctx context.Context, name string, fn func(context.Context) error, opts []LockOption) (err error) {
	l, err := g.acquire(ctx, name, -1, opts)
	if err != nil {
		return err
	}
	return l.run(ctx, fn)
}

// run runs fn under l's context, releases l, and returns fn's error with what happened to l:
// see Guard.Do.
func (l *Lock) run(ctx context.Context, fn func(context.Context) error) (err error) {
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
// ctx allows. Those include the background releases of tokens whose acquisitions ended in
// doubt (each bounded by 5 s): with a backend that does not answer, Close under a context
// without a deadline can take that long. It returns the backend's release errors, if any; a
// lock that was no longer held is not one. Close is idempotent. An Observer must not call it.
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

	errs := g.releaseAll(ctx, locks)
	// The scheduler stops once its renewals in flight return, which a backend whose driver
	// hangs may never let happen: it is waited for, with the rest, only as long as ctx allows.
	stopped := make(chan struct{})
	go func() {
		g.sched.Close()
		close(stopped)
	}()
	if err := g.waiters.closeSubscription(); err != nil {
		errs = append(errs, err)
	}
	g.bgMu.Lock()
	g.bgClosing = true
	g.bgMu.Unlock()
	done := make(chan struct{})
	go func() {
		<-stopped
		g.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("guard: close: renewals, releases or deliveries to the observer still out: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// closeReleases is how many releases Close sends at once.
const closeReleases = 16

// releaseAll releases locks for Close, closeReleases at a time, until ctx ends; releases still
// out then go on in the background (each is bounded by releaseTimeout, and Close waits for
// background work as long as ctx allows). It returns the backend's errors: a lock whose lease
// already ran out is not one, as Close frees what is held.
func (g *Guard) releaseAll(ctx context.Context, locks []*Lock) []error {
	// Every lock ends here and now; their requests go out closeReleases at a time.
	type held struct {
		l *Lock
		e ending
	}
	var ended []held
	for _, l := range locks {
		if l.markReleased() {
			ended = append(ended, held{l, g.endHold(l, ErrClosed)})
		}
	}
	var (
		mu   sync.Mutex // protects errs
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, closeReleases)
	)
	for _, h := range ended {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			// No time to send the rest: their leases run out on their own.
			mu.Lock()
			defer mu.Unlock()
			return append(errs, fmt.Errorf("guard: close: releasing: %w", ctx.Err()))
		}
		wg.Add(1)
		g.background(func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := g.sendRelease(ctx, h.l, h.e); err != nil && !errors.Is(err, ErrNotHeld) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return append(errs, fmt.Errorf("guard: close: releasing: %w", ctx.Err()))
	}
	return errs
}

func (g *Guard) acquire(ctx context.Context, name string, defaultWait time.Duration, opts []LockOption) (*Lock, error) {
	q := newAcquisition(g)
	err := q.s.resolve(defaultWait, opts)
	if err == nil {
		err = CheckName(name)
	}
	if err != nil {
		q.free()
		return nil, err
	}
	if outer := g.heldIn(ctx, name); outer != nil && !q.s.noReentry {
		switch {
		case ctx.Err() != nil:
			return nil, canceled(name, ctx)
		case outer.kind.shared() && !q.s.kind.shared():
			// It would wait for itself: the shared hold stays while this one waits.
			return nil, &OpError{Op: "acquire", Name: name, Err: ErrUpgrade}
		}
		return outer.reenter(ctx), nil
	}
	if g.isClosed() {
		q.free()
		return nil, ErrClosed
	}

	q.begin(name)
	a := &q.a
	if g.obs != nil {
		ctx = g.obs.AcquireStart(ctx, a)
	}
	gr, err := q.run(ctx)
	l, err := g.finish(ctx, q, gr, err)
	q.free()
	return l, err
}

// finish ends the acquisition q, which ran under ctx and returned gr or err: it holds the lock
// of a grant, decides the outcome, and tells the observer.
func (g *Guard) finish(ctx context.Context, q *acquisition, gr grant, err error) (*Lock, error) {
	a := &q.a
	var l *Lock
	if err == nil {
		l = g.hold(ctx, q, gr)
		if l == nil {
			err = ErrClosed
		}
	}
	if busy, ok := errors.AsType[*BusyError](err); ok {
		busy.Kind = q.s.kind
	}
	a.Outcome = outcome(ctx, err, q.s.waitTime == 0)
	if l != nil {
		a.Waited = l.heldAt.Sub(a.Started)
	} else {
		a.Waited = time.Since(a.Started)
	}
	if g.obs == nil {
		return l, err
	}
	parent := g.obs.AcquireEnd(ctx, a, l, err)
	if l != nil {
		l.adopt(parent)
		g.deliver(l) // what happened to it meanwhile, after AcquireEnd
	}
	return l, err
}

func (g *Guard) isClosed() bool { return g.closed.Load() }

// hold makes the Lock of a grant and starts its life: its context (from ctx), its lease with
// the scheduler, and its place among the Guard's locks. It returns nil when the Guard closed
// meanwhile: the lock is then given back.
func (g *Guard) hold(ctx context.Context, q *acquisition, gr grant) *Lock {
	l := &Lock{
		g: g, name: q.a.Name, token: q.w.token, label: q.s.label, kind: q.s.kind, fence: gr.fence,
		renewed: q.renewed, start: gr.start, heldAt: gr.heldAt, prev: innermost(ctx),
	}
	if g.obs != nil {
		l.parent = ctx  // the lock's context is made from AcquireEnd's (adopt)
		l.events.hold() // its events wait until AcquireEnd has seen the lock
	} else {
		l.startContext(ctx)
	}
	l.lease = lease.Lease{Name: l.name, Token: l.token, Owner: (*leaseOwner)(l)}
	lg := lease.Grant{Start: gr.start, HeldAt: gr.heldAt, Granted: gr.granted, MinHold: q.s.minHold}
	if q.renewed {
		lg.Renew = q.ttl
	} else {
		lg.Fixed = q.ttl
	}
	g.mu.Lock()
	closed := g.closed.Load()
	if !closed {
		// Under g.mu, so that Close either sees the lock held and owned, or not at all.
		g.held.Push(l)
		g.sched.Add(&l.lease, lg)
	}
	g.mu.Unlock()
	if closed {
		// Close ran while we were acquiring: give the lock back at once.
		l.released.Store(true)
		_ = g.release(ctx, l, ErrClosed)
		return nil
	}
	return l
}

// forget drops l from the locks the Guard holds: it was released, or it ended on its own.
func (g *Guard) forget(l *Lock) {
	g.mu.Lock()
	g.held.Remove(l)
	g.mu.Unlock()
}

// Timings of releasing.
const (
	// releaseTimeout bounds how long a release waits for the backend's answer: the release
	// does not depend on the caller's context, which may have ended already or end while the
	// release is on the wire.
	releaseTimeout = 5 * time.Second
	// boundStep is how often the deadline that releases share (releaseBound) moves on: a
	// release whose caller's context has no deadline waits between releaseTimeout-boundStep
	// and releaseTimeout.
	boundStep = time.Second
	// cleanupTimeout bounds one clean-up release after an ambiguous acquisition, and each
	// resending of a release whose outcome is unknown.
	cleanupTimeout = 5 * time.Second
	// firstResend is how long after a release whose outcome is unknown it is sent again; the
	// wait doubles up to maxBackoff.
	firstResend = 50 * time.Millisecond
)

// release gives l back to the backend and ends its context with cause. The caller has marked
// l released. A release whose outcome is unknown is sent again in the background (resend).
func (g *Guard) release(ctx context.Context, l *Lock, cause error) error {
	return g.sendRelease(ctx, l, g.endHold(l, cause))
}

// ending is what a release learns from the end of a lock's hold, for its request.
type ending struct {
	keep     time.Duration // the rest of a MinHold window
	deadline time.Time     // the lock's last deadline
	lost     error         // the loss that ended it before, if any
}

// endHold ends l's hold here — its lease is no longer renewed, its context ends with cause, the
// Guard forgets it — before its release is sent.
func (g *Guard) endHold(l *Lock, cause error) ending {
	keep, _ := g.sched.Release(&l.lease)
	e := ending{keep: keep, deadline: g.sched.Deadline(&l.lease), lost: l.lossCause()}
	l.cancel(cause)
	g.forget(l)
	return e
}

// sendRelease sends the release of l, whose hold ended as e says, and reports it.
func (g *Guard) sendRelease(ctx context.Context, l *Lock, e ending) error {
	keep, deadline, lost := e.keep, e.deadline, e.lost
	g.waiters.releasing(l.name, l.token)
	var start time.Time
	if g.obs != nil {
		start = time.Now()
	}
	err := g.requestRelease(ctx, l.name, l.token, keep, &l.releaseCtx)
	switch {
	case err == nil:
		g.waiters.released(l.name, keep > 0)
	case errors.Is(err, ErrNotHeld) && lost != nil:
		err = &OpError{Op: "release", Name: l.name, Err: because(err, lost)}
	case errors.Is(err, ErrNotHeld):
		err = &OpError{Op: "release", Name: l.name, Err: err}
	default:
		// The release may not have reached the backend: send it again until it is answered,
		// or until the lease would have ended on its own.
		g.resend(l.name, l.token, time.Now().Add(keep), deadline.Add(watchdog.Drift(g.watchdogTTL)))
		err = &OpError{Op: "release", Name: l.name, Err: err}
	}
	if g.obs != nil {
		took := time.Since(start)
		g.event(l, LockEvent{Kind: EventReleased, At: start.Add(took), Err: err, Duration: took})
	}
	return err
}

// requestRelease sends a release that does not depend on ctx staying alive: one whose context
// ended before it was sent, or while it was on the wire — a handler whose client hung up — is
// sent again at once under a context of its own, bounded by releaseTimeout, keeping ctx's
// values. A release under a context without a deadline does not wait for ctx at all: it
// keeps ctx's values and is bounded by the deadline the Guard's releases share (between 4 and
// 5 s away), then sent again as one cut short. A release whose first request may have been
// applied and whose second finds the name no longer ours has done its work: it returns nil.
// bounded is the space for that bounded context: the lock's own (Lock.releaseCtx).
func (g *Guard) requestRelease(ctx context.Context, name, token string, keep time.Duration, bounded *boundedContext) error {
	sent := false
	if ctx.Err() == nil {
		first := ctx
		if _, ok := ctx.Deadline(); !ok {
			// A driver can wait forever on a connection that died without a word (a dropped
			// route, a frozen server): a release under a context without a deadline is bounded
			// too. A timer of its own would cost four allocations and a timer on the path of
			// every lock; the shared deadline costs none, in the space the caller gives.
			*bounded = boundedContext{Context: ctx, bound: g.releaseBound()}
			first = bounded
		}
		err := g.backend.Release(first, name, token, keep)
		if err == nil || errors.Is(err, ErrNotHeld) || first.Err() == nil {
			return err
		}
		sent = true // cut short by ctx: it may have been applied
	}
	detached, stop := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer stop()
	err := g.backend.Release(detached, name, token, keep)
	if sent && errors.Is(err, ErrNotHeld) {
		return nil
	}
	return err
}

// releaseBound is a deadline that releases share: a context that ends releaseTimeout after it
// was made, used by every release that starts within boundStep of that.
type releaseBound struct {
	ctx    context.Context
	cancel context.CancelFunc // never called: ctx ends at its deadline, and its timer with it
	until  time.Time
}

// releaseBound returns a context that ends between releaseTimeout-boundStep and
// releaseTimeout from now.
func (g *Guard) releaseBound() context.Context {
	now := time.Now()
	if b := g.bound.Load(); b != nil && b.until.Sub(now) > releaseTimeout-boundStep {
		return b.ctx
	}
	b := &releaseBound{until: now.Add(releaseTimeout)}
	b.ctx, b.cancel = context.WithDeadline(context.Background(), b.until)
	g.bound.Store(b)
	return b.ctx
}

// boundedContext is Context's values with bound's end: its deadline, Done, Err and cause are
// bound's, and so is the end of a context derived from it; Context's cancellation is ignored.
type boundedContext struct {
	context.Context
	bound context.Context // from context.WithDeadline(context.Background(), …)
}

func (c boundedContext) Deadline() (time.Time, bool) { return c.bound.Deadline() }
func (c boundedContext) Done() <-chan struct{}       { return c.bound.Done() }
func (c boundedContext) Err() error                  { return c.bound.Err() }

// Value is bound's value for the one key that bound, derived from Background, has a value for:
// the context package's key of its cancelable context, which context.Cause and contexts
// derived from c look up, and so find bound's end (as context.WithoutCancel hides the
// caller's). It is Context's value for every other key.
func (c boundedContext) Value(key any) any {
	if v := c.bound.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}

// resend sends the release of token's lock on name again in the background, with a backoff,
// until the backend answers it, the Guard closes (after one more try), or until, when the
// lease would have ended on its own. keepUntil is when a MinHold window ends.
func (g *Guard) resend(name, token string, keepUntil, until time.Time) {
	g.background(func() {
		wait := firstResend
		for {
			t := time.NewTimer(min(wait, max(time.Until(until), 0)))
			select {
			case <-t.C:
			case <-g.life.Done():
				t.Stop()
			}
			if !time.Now().Before(until) {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			keep := max(time.Until(keepUntil), 0)
			g.waiters.releasing(name, token)
			err := g.backend.Release(ctx, name, token, keep)
			cancel()
			switch {
			case err == nil:
				g.waiters.released(name, keep > 0)
				return
			case errors.Is(err, ErrNotHeld), g.life.Err() != nil:
				return
			}
			wait = min(2*wait, maxBackoff)
		}
	})
}

// cleanup releases token's lock on name in the background, in case an attempt whose outcome
// is unknown (its reply was lost, it came too late, its context ended while it was out) took
// the lock: nobody else may wait a whole lease for it. The release is owner-checked, so it
// never touches another owner's lock.
func (g *Guard) cleanup(name, token string) {
	g.background(func() { g.giveBack(name, token) })
}

// giveBack sends cleanup's release.
func (g *Guard) giveBack(name, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	g.waiters.releasing(name, token)
	if g.backend.Release(ctx, name, token, 0) == nil {
		g.waiters.released(name, false)
	}
}

// inDoubtReleases are the delays after which cleanupInDoubt sends its release again.
var inDoubtReleases = [...]time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 500 * time.Millisecond}

// cleanupInDoubt is cleanup for an acquire request that may still be on its way: its context
// ended while it was out, or its reply was lost. A release sent on another connection can
// reach the backend before it, and the request then queues (or takes) the name for a caller
// that is gone — a place no one renews, which blocks the waiters behind it until it lapses.
// So the release goes again once the request must have landed; each one is owner-checked and
// frees nothing when there is nothing of ours. A closing Guard sends the last one at once.
func (g *Guard) cleanupInDoubt(name, token string) {
	g.background(func() {
		g.giveBack(name, token)
		for _, d := range inDoubtReleases {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-g.life.Done():
				t.Stop()
				g.giveBack(name, token)
				return
			}
			g.giveBack(name, token)
		}
	})
}

// background runs f on a goroutine that Close waits for — or, once Close waits, on this one.
func (g *Guard) background(f func()) {
	if !g.spawn(f) {
		f()
	}
}

// spawn runs f on a goroutine that Close waits for, and reports whether it did: not once
// Close waits.
func (g *Guard) spawn(f func()) bool {
	g.bgMu.Lock()
	if g.bgClosing {
		g.bgMu.Unlock()
		return false
	}
	g.bg.Add(1)
	g.bgMu.Unlock()
	go func() {
		defer g.bg.Done()
		f()
	}()
	return true
}

// renew is the scheduler's RenewFunc: one backend call for the whole batch.
func (g *Guard) renew(ctx context.Context, batch []lease.Request) ([]lease.Result, []error) {
	leases := make([]Lease, len(batch))
	for i, r := range batch {
		leases[i] = Lease{Name: r.Name, Token: r.Token, TTL: r.TTL}
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
		results[i] = result(err)
	}
	return results, errs
}

// heldIn returns the live lock of this Guard on name that ctx runs under, if any.
func (g *Guard) heldIn(ctx context.Context, name string) *Lock {
	for l := innermost(ctx); l != nil; l = l.prev {
		if l.members != nil {
			for _, m := range l.members {
				if m.g == g && m.name == name && m.Context().Err() == nil {
					return m
				}
			}
			continue
		}
		root := l.root()
		if root.g == g && root.name == name && root.Context().Err() == nil {
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
