package guard

import (
	"cmp"
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
// A Lock is safe for concurrent use.
type Lock struct {
	g       *Guard
	name    string
	token   string
	label   string
	fence   uint64
	ttl     time.Duration // lease set by each acquisition or renewal
	granted time.Duration // lease the grant set: ttl, or less for a hand-over that claims the rest
	renewed bool          // held by the watchdog (no LeaseTime)
	minHold time.Duration
	start   time.Time // read before the acquire request was sent
	heldAt  time.Time // read when its answer came back

	outer *Lock // for a reentrant handle: the lock it re-entered
	prev  *Lock // the lock the acquiring context ran under, if any

	lease  lease.Lease // in the Guard's scheduler while held; unused by a reentrant handle
	lctx   lockContext // ctx, for a lock that the Guard holds
	ctx    context.Context
	cancel context.CancelCauseFunc
	unlink func() bool // for a reentrant handle: stops following outer's context

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

// Extend sets the remaining lease of a lock taken with LeaseTime to d, measured from now.
// Concurrent calls are sent one after the other, so the last one to return set the lease.
// A d shorter than what is left shortens the lease, and the deadline moves before the request
// is sent: the backend may apply it even if its answer is lost.
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
	r.extendMu.Lock()
	defer r.extendMu.Unlock()
	// The lock's context also ends with the caller's; what matters here is whether the lock
	// itself is still ours.
	if cause := r.lossCause(); cause != nil {
		return &OpError{Op: "extend", Name: r.name, Err: because(ErrNotHeld, cause)}
	}
	if r.isReleased() {
		return &OpError{Op: "extend", Name: r.name, Err: ErrNotHeld}
	}
	start := time.Now()
	// The backend may apply an extension whose answer is lost: one that shortens the lease
	// must count from now on, not once it has answered.
	r.g.sched.Shorten(&r.lease, start, d)
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
			return &OpError{Op: "extend", Name: r.name, Err: because(ErrNotHeld, cmp.Or(r.lossCause(), error(ErrLeaseExpired)))}
		}
		r.g.event(r, LockEvent{Kind: EventExtended, Deadline: r.Deadline()})
		return nil
	case errors.Is(err, ErrNotHeld):
		r.g.sched.Remove(&r.lease)
		r.g.forget(r)
		cause := fmt.Errorf("%w: no longer ours (found on extend)", ErrLockLost)
		r.g.event(r, LockEvent{Kind: EventLost, Err: cause})
		r.cancel(cause)
		return &OpError{Op: "extend", Name: r.name, Err: err}
	default:
		return &OpError{Op: "extend", Name: r.name, Err: err}
	}
}

// Release gives the lock up and ends its context with ErrReleased. With MinHold, the name
// stays locked until the window ends. Release is idempotent: calls after the first return nil.
// A reentrant handle's Release ends only that handle's context; the name stays held by the
// outer lock.
//
// The release reaches the backend even when ctx is already cancelled — a handler whose
// request ended still frees its lock — bounded by a few seconds; ctx's values are kept.
//
// It returns an error matching ErrNotHeld when the lock was no longer ours (then it also
// matches the cause, ErrLockLost or ErrLeaseExpired, when that is known), or an *OpError that
// wraps the backend's error — the lease then runs out on its own.
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
		ttl: l.ttl, granted: l.granted, renewed: l.renewed, minHold: l.minHold, start: l.start,
		heldAt: l.heldAt, outer: l, prev: innermost(ctx),
	}
	h.ctx, h.cancel = context.WithCancelCause(context.WithValue(ctx, lockKey{}, h))
	h.unlink = context.AfterFunc(l.ctx, func() { h.cancel(context.Cause(l.ctx)) })
	return h
}

// leaseOwner is a Lock as the watchdog sees it: the owner of its lease. Its methods are the
// watchdog's callbacks, kept off Lock's own method set. They run on the watchdog's goroutine
// and never block: observer events go out on a goroutine of their own.
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
	var cause error
	kind := EventLost
	switch {
	case reason == lease.Lost:
		cause = fmt.Errorf("%w: held by another owner or free", ErrLockLost)
	case reason == lease.Suspended:
		cause = fmt.Errorf("%w: not confirmed before its deadline: %w", ErrLockLost, lastErr)
	case !l.renewed:
		kind = EventLeaseExpired
		cause = fmt.Errorf("%w: reached its lease time", ErrLeaseExpired)
	case lastErr != nil:
		cause = fmt.Errorf("%w: not renewed before its deadline: %w", ErrLockLost, lastErr)
	default:
		cause = fmt.Errorf("%w: not renewed before its deadline", ErrLockLost)
	}
	l.g.forget(l)
	// Queue the event first, so that the observer hears of the loss before it hears of the
	// release that the work's reaction to it may bring.
	l.g.eventAsync(l, LockEvent{Kind: kind, Err: cause})
	l.cancel(cause)
}
