package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardlock/guard/internal/ilist"
	"github.com/guardlock/guard/internal/lease"
)

// Lock is a held lock. Its context lives while the lock is held and is cancelled, with a
// cause, when the lock is lost (ErrLockLost), its lease runs out (ErrLeaseExpired), it is
// released (ErrReleased) or its Guard is closed (ErrClosed) — and when the context it was
// acquired with ends. Loss is signalled no later than the lock's local validity deadline.
//
// A Lock is safe for concurrent use. Its lease has one owner, the Guard's lease scheduler
// (package watchdog states its rules): renewals, the claim after a hand-over, Extend and
// Release reach the backend in the order they were decided.
type Lock struct {
	g       *Guard
	name    string
	token   string
	label   string
	kind    Kind
	fence   uint64
	renewed bool // held by the watchdog (no LeaseTime)
	start   time.Time
	heldAt  time.Time // when the grant was learned of
	// releaseCtx is the context of l's release when the caller's has no deadline (see
	// requestRelease): l is released once, so it can live here rather than cost an allocation.
	releaseCtx boundedContext

	outer   *Lock                // for a reentrant handle: the lock it re-entered
	members []*Lock              // for a multi-lock (AcquireAll): the locks it holds, in canonical order
	group   atomic.Pointer[Lock] // for a member of a multi-lock: the multi-lock
	prev    *Lock                // the lock the acquiring context ran under, if any
	unlink  func() bool          // for a reentrant handle: stops following outer's context

	lease lease.Lease // owned by the Guard's scheduler while held; unused by a reentrant handle

	// ctx is the lock's context, once it has one. Without an Observer it is made with the
	// lock, from the context the lock was acquired with. With one, it is made from the
	// context the Observer's AcquireEnd returns — or, when the lock's context is asked for
	// during AcquireEnd, from the acquiring context first and then once more from
	// AcquireEnd's, which ends with the first (see ensureContext and adopt).
	ctx       atomic.Pointer[lockContext]
	ctxMu     sync.Mutex              // protects making ctx, parent, base, the cancels and ended
	parent    context.Context         // what a context made during AcquireEnd derives from
	cancelTwo context.CancelCauseFunc // ends the second context adopt made, if it made one
	ended     error                   // the cause the lock ended with before it had a context
	base      lockContext             // the context made with the lock, when fixed: no allocation of its own
	cancelOne context.CancelCauseFunc // ends it
	fixed     bool                    // the context was made with the lock (startContext), and stays

	released atomic.Bool // Release (or Close) took it

	held ilist.Links[Lock] // in the Guard's held locks; guarded by Guard.mu

	extendMu sync.Mutex // held during Extend: one extension at a time, answered in order
	events   mailbox    // events for the observer, delivered in order
}

// lockKey is the context key of the innermost Lock a context runs under.
type lockKey struct{}

// lockContext is a Lock's context: the cancelable context that the Lock ends, answering
// FromContext's key itself, so that the Lock needs no context of its own for that. Contexts
// derived from it find the cancelable one through Value, as the context package looks for
// it, and are cancelled with it without a goroutine.
type lockContext struct {
	context.Context // from context.WithCancelCause
	l               *Lock
}

// Value returns the Lock for lockKey, and what the cancelable context has for other keys.
func (c *lockContext) Value(key any) any {
	if key == (lockKey{}) {
		return c.l
	}
	return c.Context.Value(key)
}

// Err is the cancelable context's Err, and ends a lock whose deadline has passed first: code
// that checks Err never trusts a lease past its deadline, however late the timer that ends it
// fires on a loaded host.
func (c *lockContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	c.l.endIfDue()
	return c.Context.Err()
}

// FromContext returns the Lock that ctx runs under: the one whose Context ctx is, or derives
// from. Decorated functions and handlers use it to read their fence.
func FromContext(ctx context.Context) (*Lock, bool) {
	l := innermost(ctx)
	return l, l != nil
}

func innermost(ctx context.Context) *Lock {
	l, _ := ctx.Value(lockKey{}).(*Lock)
	return l
}

// Name returns the lock name.
func (l *Lock) Name() string { return l.name }

// Token returns the random owner token of this acquisition (at least 128 bits).
func (l *Lock) Token() string { return l.token }

// Fence returns the fencing token of this acquisition: it strictly increases with every
// acquisition of the name on the backend. Pass it to the resource the lock protects, and have
// the resource reject writes with a fence lower than one it has seen.
func (l *Lock) Fence() uint64 { return l.fence }

// Label returns the telemetry label given with the Label option.
func (l *Lock) Label() string { return l.label }

// Kind returns what the lock holds: a mutex, a semaphore's permit, a read or write side, an
// election's term.
func (l *Lock) Kind() Kind { return l.kind }

// AcquiredAt returns when the lock was granted.
func (l *Lock) AcquiredAt() time.Time { return l.root().heldAt }

// Reentrant reports whether this handle re-entered a lock its context already held.
func (l *Lock) Reentrant() bool { return l.outer != nil }

// Context returns the context to run the protected work under. See Lock for when it ends.
// While the Guard's Observer runs AcquireEnd for the lock, it does not carry yet what
// AcquireEnd adds to it.
func (l *Lock) Context() context.Context { return l.context() }

// Done returns a channel closed when the lock's context ends.
func (l *Lock) Done() <-chan struct{} { return l.context().Done() }

// Err returns nil while the lock's context is live, then why it ended: ErrLockLost,
// ErrLeaseExpired, ErrReleased, ErrClosed (all wrapped with detail), or the acquiring
// context's own cause.
func (l *Lock) Err() error {
	c := l.context()
	if c.Err() == nil {
		return nil
	}
	return context.Cause(c)
}

// context returns the lock's context, making it when the lock has none yet (an Observer asks
// for it during AcquireEnd).
func (l *Lock) context() *lockContext {
	if c := l.ctx.Load(); c != nil {
		return c
	}
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	if c := l.ctx.Load(); c != nil {
		return c
	}
	return l.makeContext(l.parent)
}

// Deadline returns the lock's local validity deadline: the time by which the backend's lease
// surely has not run out yet, as last confirmed. The watchdog moves it forward with each
// renewal; Extend moves it for a LeaseTime lock.
func (l *Lock) Deadline() time.Time {
	r := l.root()
	if r.members != nil {
		var first time.Time
		for _, m := range r.members {
			if d := m.Deadline(); first.IsZero() || d.Before(first) {
				first = d
			}
		}
		return first
	}
	return r.g.sched.Deadline(&r.lease)
}

// Extend sets the remaining lease of a lock taken with LeaseTime to d, measured from now.
// Concurrent calls are sent one after the other, so the last one to return set the lease; a
// renewal of the lease that is out (the claim after a hand-over) is answered first, and none is
// sent after it. A d shorter than what is left shortens the lease, and the deadline moves
// before the request is sent: the backend may apply it even if its answer is lost. With
// MinHold, the name stays taken until the window ends even when d ends the lock sooner.
//
// It returns ErrNotExtendable for a lock held by the watchdog (it needs no extending); an
// *OptionError for d < 10 ms; an error matching ErrNotHeld when the lock is no longer ours —
// after Release, or when its lease already ended (then it matches the cause too,
// ErrLeaseExpired or ErrLockLost), or when the backend says so (its context then ends with
// ErrLockLost); or an *OpError that wraps the backend's error. A lock whose context ended
// only because the context it was acquired with did can still be extended.
func (l *Lock) Extend(ctx context.Context, d time.Duration) error {
	r := l.root()
	if r.renewed {
		return ErrNotExtendable
	}
	if d < minTTL {
		return &OptionError{Option: "Extend", Value: d, Reason: "must be at least 10ms"}
	}
	if r.members != nil {
		var errs []error
		for _, m := range r.members {
			errs = append(errs, m.Extend(ctx, d))
		}
		return errors.Join(errs...)
	}
	r.extendMu.Lock()
	defer r.extendMu.Unlock()
	if r.isReleased() {
		return &OpError{Op: "extend", Name: r.name, Err: ErrNotHeld}
	}
	var err error
	res, serr := r.g.sched.Extend(ctx, &r.lease, d, func(ctx context.Context, ttl time.Duration) (lease.Result, error) {
		errs := r.g.backend.Extend(ctx, []Lease{{Name: r.name, Token: r.token, TTL: ttl}})
		if len(errs) != 1 {
			err = fmt.Errorf("backend extended %d leases, asked 1", len(errs))
		} else {
			err = errs[0]
		}
		return result(err), err
	})
	switch {
	case errors.Is(serr, lease.ErrEnded):
		if r.isReleased() {
			return &OpError{Op: "extend", Name: r.name, Err: ErrNotHeld}
		}
		cause := r.lossCause()
		if cause == nil {
			cause = ErrLeaseExpired
		}
		return &OpError{Op: "extend", Name: r.name, Err: because(ErrNotHeld, cause)}
	case res == lease.Renewed:
		r.g.event(r, LockEvent{Kind: EventExtended, Deadline: r.Deadline()})
		return nil
	case serr != nil && err == nil: // the caller's context ended while a renewal was out
		return &OpError{Op: "extend", Name: r.name, Err: serr}
	default: // not held (the lock is lost now), or the backend failed
		return &OpError{Op: "extend", Name: r.name, Err: err}
	}
}

// result classifies a backend's answer for one lease.
func result(err error) lease.Result {
	switch {
	case err == nil:
		return lease.Renewed
	case errors.Is(err, ErrNotHeld):
		return lease.NotHeld
	default:
		return lease.Failed
	}
}

// Release gives the lock up and ends its context with ErrReleased. With MinHold, the name
// stays locked until the window ends. Release is idempotent: calls after the first return nil.
// A reentrant handle's Release ends only that handle's context; the name stays held by the
// outer lock.
//
// The release does not depend on ctx staying alive — a handler whose request ended, or whose
// client hung up while the release was on the wire, still frees its lock — and waits for the
// backend's answer for a few seconds at most; ctx's values are kept. A release whose outcome
// is unknown (the backend did not answer) is sent again in the background, owner-checked,
// until it is answered or the lease would have ended anyway.
//
// It returns an error matching ErrNotHeld when the lock was no longer ours (then it also
// matches the cause, ErrLockLost or ErrLeaseExpired, when that is known), or an *OpError that
// wraps the backend's error.
func (l *Lock) Release(ctx context.Context) error {
	if l.outer != nil {
		if !l.markReleased() {
			return nil
		}
		l.unlink()
		l.cancel(ErrReleased)
		return nil
	}
	if !l.markReleased() {
		return nil
	}
	if l.members != nil {
		return l.releaseGroup(ctx)
	}
	return l.g.release(ctx, l, ErrReleased)
}

func (l *Lock) isReleased() bool { return l.released.Load() }

// markReleased reports whether this call is the one that released l.
func (l *Lock) markReleased() bool { return l.released.CompareAndSwap(false, true) }

// root returns the lock that holds the name: l itself, or the one a reentrant handle entered.
func (l *Lock) root() *Lock {
	if l.outer != nil {
		return l.outer
	}
	return l
}

// cancel ends the lock's context with cause — and its multi-lock's, for a member of one; a
// lock that has no context yet gets an ended one.
func (l *Lock) cancel(cause error) {
	if g := l.group.Load(); g != nil {
		defer g.cancel(cause)
	}
	if l.fixed {
		// The common case: a context made with the lock, which adopt never changes.
		l.cancelOne(cause)
		return
	}
	l.ctxMu.Lock()
	if l.ctx.Load() == nil && l.ended == nil {
		l.ended = cause
	}
	one, two := l.cancelOne, l.cancelTwo
	l.ctxMu.Unlock()
	if one != nil {
		one(cause)
	}
	if two != nil {
		two(cause)
	}
}

// startContext gives l its context, derived from parent, when no Observer needs to add to it.
func (l *Lock) startContext(parent context.Context) {
	c, cancel := context.WithCancelCause(parent)
	l.cancelOne, l.fixed = cancel, true
	l.base = lockContext{Context: c, l: l}
	l.ctx.Store(&l.base)
}

// makeContext makes l's context from parent, ended at once if l ended before. l.ctxMu must be
// held.
func (l *Lock) makeContext(parent context.Context) *lockContext {
	c, cancel := context.WithCancelCause(parent)
	var lc *lockContext
	if l.ctx.Load() == nil {
		l.base = lockContext{Context: c, l: l}
		lc, l.cancelOne = &l.base, cancel
	} else {
		lc, l.cancelTwo = &lockContext{Context: c, l: l}, cancel
	}
	if l.ended != nil {
		cancel(l.ended)
	}
	l.ctx.Store(lc)
	return lc
}

// adopt makes the context the Observer's AcquireEnd returned the parent of l's context: what
// it carries (a span of the locked section) is seen by the work. When the lock's context was
// made during AcquireEnd already, the new one replaces it and ends with it.
func (l *Lock) adopt(parent context.Context) {
	l.ctxMu.Lock()
	defer l.ctxMu.Unlock()
	first := l.ctx.Load()
	l.makeContext(parent)
	if first != nil {
		cancel := l.cancelTwo
		if first.Err() != nil {
			cancel(context.Cause(first)) // at once: ended during AcquireEnd
		}
		context.AfterFunc(first, func() { cancel(context.Cause(first)) })
	}
}

// endCause returns the event and the context's cause of a lease that ended on its own.
func (l *Lock) endCause(reason lease.EndReason, lastErr error) (EventKind, error) {
	switch {
	case reason == lease.Lost:
		return EventLost, fmt.Errorf("%w: held by another owner or free", ErrLockLost)
	case reason == lease.Suspended:
		return EventLost, fmt.Errorf("%w: not confirmed before its deadline: %w", ErrLockLost, lastErr)
	case !l.renewed:
		return EventLeaseExpired, fmt.Errorf("%w: reached its lease time", ErrLeaseExpired)
	case lastErr != nil:
		return EventLost, fmt.Errorf("%w: not renewed before its deadline: %w", ErrLockLost, lastErr)
	default:
		return EventLost, fmt.Errorf("%w: not renewed before its deadline", ErrLockLost)
	}
}

// endIfDue ends the context of a lock whose local validity deadline has passed — of a member
// of a multi-lock, and so the group's — when the scheduler, whose timer can fire late on a
// loaded host, has not ended it yet. The scheduler still ends the lease, and tells the
// observer, when its turn comes.
func (l *Lock) endIfDue() {
	r := l.root()
	if r.members != nil {
		for _, m := range r.members {
			m.endIfDue()
		}
		return
	}
	if r.lease.Due() {
		_, cause := r.endCause(lease.Expired, nil)
		r.cancel(cause)
	}
}

// lossCause returns the cause when the lock was lost or its lease ran out, else nil.
func (l *Lock) lossCause() error {
	r := l.root()
	c := r.ctx.Load()
	if c == nil {
		r.ctxMu.Lock()
		cause := r.ended
		r.ctxMu.Unlock()
		if isLoss(cause) {
			return cause
		}
		return nil
	}
	if c.Err() == nil {
		return nil
	}
	cause := context.Cause(c)
	if isLoss(cause) {
		return cause
	}
	return nil
}

// reenter returns a handle on l for code that runs under l and asks for it again.
func (l *Lock) reenter(ctx context.Context) *Lock {
	h := &Lock{
		g: l.g, name: l.name, token: l.token, label: l.label, kind: l.kind, fence: l.fence,
		renewed: l.renewed, start: l.start, heldAt: l.heldAt, outer: l, prev: innermost(ctx),
	}
	h.startContext(ctx)
	h.unlink = context.AfterFunc(l.Context(), func() { h.cancel(context.Cause(l.Context())) })
	return h
}

// leaseOwner is a Lock as its lease's scheduler sees it: the owner of its lease. Its methods
// are the scheduler's callbacks, kept off Lock's own method set. They never block: observer
// events go out on a goroutine of their own.
type leaseOwner Lock

// Renewed reports a renewal to the observer.
func (o *leaseOwner) Renewed(deadline time.Time) {
	l := (*Lock)(o)
	l.g.eventAsync(l, LockEvent{Kind: EventRenewed, Deadline: deadline})
}

// RenewFailed reports a failed renewal to the observer.
func (o *leaseOwner) RenewFailed(err error) {
	l := (*Lock)(o)
	l.g.eventAsync(l, LockEvent{Kind: EventRenewFailed, Err: err, Deadline: l.Deadline()})
}

// Ended ends the lock: the lease ended without a release.
func (o *leaseOwner) Ended(reason lease.EndReason, lastErr error) {
	l := (*Lock)(o)
	kind, cause := l.endCause(reason, lastErr)
	l.g.forget(l)
	// Queue the event first, so that the observer hears of the loss before it hears of the
	// release that the work's reaction to it may bring.
	l.g.eventAsync(l, LockEvent{Kind: kind, Err: cause})
	l.cancel(cause)
}
