package guard

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/guardlock/guard/watchdog"
)

// Lock is a held lock. Its context lives while the lock is held and is cancelled, with a
// cause, when the lock is lost (ErrLockLost), its lease runs out (ErrLeaseExpired), it is
// released (ErrReleased) or its Guard is closed (ErrClosed) — and when the context it was
// acquired with ends. Loss is signalled no later than the lock's local validity deadline.
//
// A Lock is safe for concurrent use.
type Lock struct {
	g       *Guard
	name    string
	token   string
	label   string
	fence   uint64
	ttl     time.Duration // lease set by each acquisition or renewal
	renewed bool          // held by the watchdog (no LeaseTime)
	minHold time.Duration
	start   time.Time // read before the acquire request was sent
	heldAt  time.Time // read when its answer came back

	outer *Lock // for a reentrant handle: the lock it re-entered
	prev  *Lock // the lock the acquiring context ran under, if any

	lease  watchdog.Lease // in the Guard's scheduler while held; unused by a reentrant handle
	ctx    context.Context
	cancel context.CancelCauseFunc
	unlink func() bool // for a reentrant handle: stops following outer's context

	mu       sync.Mutex // protects released
	released bool
}

// lockKey is the context key of the innermost Lock a context runs under.
type lockKey struct{}

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

// AcquiredAt returns when the lock was granted.
func (l *Lock) AcquiredAt() time.Time { return l.root().heldAt }

// Reentrant reports whether this handle re-entered a lock its context already held.
func (l *Lock) Reentrant() bool { return l.outer != nil }

// Context returns the context to run the protected work under. See Lock for when it ends.
func (l *Lock) Context() context.Context { return l.ctx }

// Done returns a channel closed when the lock's context ends.
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock's context is live, then why it ended: ErrLockLost,
// ErrLeaseExpired, ErrReleased, ErrClosed (all wrapped with detail), or the acquiring
// context's own cause.
func (l *Lock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Deadline returns the lock's local validity deadline: the time by which the backend's lease
// surely has not run out yet, as last confirmed. The watchdog moves it forward with each
// renewal; Extend moves it for a LeaseTime lock.
func (l *Lock) Deadline() time.Time {
	r := l.root()
	return r.g.sched.Deadline(&r.lease)
}

// Extend sets the remaining lease of a lock taken with LeaseTime to d, measured from now. It
// returns an *OptionError for a lock held by the watchdog (it needs no extending) or for
// d < 10 ms; an error matching ErrNotHeld when the lock is no longer ours — after Release, or
// when its lease already ended (then it matches the cause too, ErrLeaseExpired or
// ErrLockLost), or when the backend says so (its context then ends with ErrLockLost); or the
// backend's error, wrapped. A lock whose context ended only
// because the context it was acquired with did can still be extended.
func (l *Lock) Extend(ctx context.Context, d time.Duration) error {
	r := l.root()
	if r.renewed {
		return &OptionError{Option: "Extend", Value: d, Reason: "the watchdog renews this lock; only a LeaseTime lock is extended by hand"}
	}
	if d < minTTL {
		return &OptionError{Option: "Extend", Value: d, Reason: "must be at least 10ms"}
	}
	// The lock's context also ends with the caller's; what matters here is whether the lock
	// itself is still ours.
	if cause := r.lossCause(); cause != nil {
		return fmt.Errorf("guard: extend %q: %w (%w)", r.name, ErrNotHeld, cause)
	}
	if r.isReleased() {
		return fmt.Errorf("guard: extend %q: %w", r.name, ErrNotHeld)
	}
	start := time.Now()
	errs := r.g.backend.Extend(ctx, []Lease{{Name: r.name, Token: r.token, TTL: d}})
	var err error
	if len(errs) != 1 {
		err = fmt.Errorf("backend extended %d leases, asked 1", len(errs))
	} else {
		err = errs[0]
	}
	switch {
	case err == nil:
		if !r.g.sched.SetDeadline(&r.lease, start, d) {
			// The deadline passed, or the lock was released, while the request was out: the
			// lock is not to be trusted any more, whatever the backend did.
			return fmt.Errorf("guard: extend %q: %w (%w)", r.name, ErrNotHeld, cmp.Or(r.lossCause(), error(ErrLeaseExpired)))
		}
		r.g.event(r, LockEvent{Kind: EventExtended, Deadline: r.Deadline()})
		return nil
	case isNotHeld(err):
		r.g.sched.Remove(&r.lease)
		cause := fmt.Errorf("%w: %q is no longer ours (found on extend)", ErrLockLost, r.name)
		r.g.event(r, LockEvent{Kind: EventLost, Err: cause})
		r.cancel(cause)
		return fmt.Errorf("guard: extend %q: %w", r.name, err)
	default:
		return fmt.Errorf("guard: extend %q: %w", r.name, err)
	}
}

// Release gives the lock up and ends its context with ErrReleased. With MinHold, the name
// stays locked until the window ends. Release is idempotent: calls after the first return nil.
// A reentrant handle's Release ends only that handle's context; the name stays held by the
// outer lock.
//
// It returns an error matching ErrNotHeld when the lock was no longer ours (then it also
// matches the cause, ErrLockLost or ErrLeaseExpired, when that is known), or the backend's
// error, wrapped — the lease then runs out on its own.
func (l *Lock) Release(ctx context.Context) error {
	if !l.markReleased() {
		return nil
	}
	if l.outer != nil {
		l.unlink()
		l.cancel(ErrReleased)
		return nil
	}
	return l.g.release(ctx, l, ErrReleased)
}

// releaseDetached releases with a context that ignores ctx's cancellation, bounded by the
// lease: after that the lock is gone anyway.
func (l *Lock) releaseDetached(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.root().ttl)
	defer cancel()
	return l.Release(rctx)
}

func (l *Lock) isReleased() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

func (l *Lock) markReleased() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return false
	}
	l.released = true
	return true
}

// root returns the lock that holds the name: l itself, or the one a reentrant handle entered.
func (l *Lock) root() *Lock {
	if l.outer != nil {
		return l.outer
	}
	return l
}

// lossCause returns the cause when the lock was lost or its lease ran out, else nil.
func (l *Lock) lossCause() error {
	r := l.root()
	if r.ctx == nil || r.ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(r.ctx)
	if isLoss(cause) {
		return cause
	}
	return nil
}

// reenter returns a handle on l for code that runs under l and asks for it again.
func (l *Lock) reenter(ctx context.Context) *Lock {
	h := &Lock{
		g: l.g, name: l.name, token: l.token, label: l.label, fence: l.fence,
		ttl: l.ttl, renewed: l.renewed, minHold: l.minHold, start: l.start, heldAt: l.heldAt,
		outer: l, prev: innermost(ctx),
	}
	h.ctx, h.cancel = context.WithCancelCause(context.WithValue(ctx, lockKey{}, h))
	h.unlink = context.AfterFunc(l.ctx, func() { h.cancel(context.Cause(l.ctx)) })
	return h
}

// leaseOwner is a Lock as the watchdog sees it: the owner of its lease. Its methods are the
// watchdog's callbacks, kept off Lock's own method set.
type leaseOwner Lock

// Renewed reports a renewal to the observer.
func (o *leaseOwner) Renewed(deadline time.Time) {
	l := (*Lock)(o)
	l.g.event(l, LockEvent{Kind: EventRenewed, Deadline: deadline})
}

// RenewFailed reports a failed renewal to the observer.
func (o *leaseOwner) RenewFailed(err error) {
	l := (*Lock)(o)
	l.g.event(l, LockEvent{Kind: EventRenewFailed, Err: err, Deadline: l.Deadline()})
}

// Ended ends the lock: the lease ended without a release.
func (o *leaseOwner) Ended(reason watchdog.EndReason, lastErr error) {
	l := (*Lock)(o)
	var cause error
	kind := EventLost
	switch {
	case reason == watchdog.Lost:
		cause = fmt.Errorf("%w: %q is held by another owner or free", ErrLockLost, l.name)
	case !l.renewed:
		kind = EventLeaseExpired
		cause = fmt.Errorf("%w: %q reached its lease time", ErrLeaseExpired, l.name)
	case lastErr != nil:
		cause = fmt.Errorf("%w: %q not renewed before its deadline: %w", ErrLockLost, l.name, lastErr)
	default:
		cause = fmt.Errorf("%w: %q not renewed before its deadline", ErrLockLost, l.name)
	}
	// Tell the observer first, so that the span records the loss before the work reacts to it.
	l.g.event(l, LockEvent{Kind: kind, Err: cause})
	l.cancel(cause)
}
