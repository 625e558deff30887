package guard

import (
	"context"
	"time"
)

// Backend is the storage contract every lock backend implements. It is deliberately small:
// one attempt to take a name, a batched extension, and an owner-checked release. Everything
// else — waiting, the watchdog, reentrancy, contexts, telemetry — lives in the Guard.
//
// Every method acts only for the owner identified by token: Extend and Release never touch a
// lock held under another token. Each uncontended call is expected to be one network round
// trip.
type Backend interface {
	// Acquire makes one attempt to take name for token, for ttl. On success it returns the
	// fence: a number that strictly increases with every successful acquisition of name on
	// this backend and is never reset, not even by Release.
	//
	// When another owner holds name, Acquire returns a *BusyError (which matches
	// ErrNotAcquired) carrying the holder's remaining lease when the backend knows it.
	// Any other error is a backend failure and must not match ErrNotAcquired.
	Acquire(ctx context.Context, name, token string, ttl time.Duration) (fence uint64, err error)

	// Extend sets the lease of each lock in leases to its TTL, measured from now, if the lock
	// is still held by its token. It returns one error per lease, in order: nil when
	// extended, an error matching ErrNotHeld when the name is free or held by another token,
	// or a backend failure. A backend should send the whole batch in as few round trips as
	// it can (the watchdog renews every lock of a Guard with one call per tick).
	Extend(ctx context.Context, leases []Lease) []error

	// Release gives name up if token still holds it. With keep > 0 the lock is not freed
	// but its lease is set to keep (the rest of a MinHold window), so that nobody takes the
	// name before the window ends. It returns an error matching ErrNotHeld when token does
	// not hold name. A release that frees the name should wake waiters in other processes
	// (see Notifier).
	Release(ctx context.Context, name, token string, keep time.Duration) error
}

// Lease names one held lock to extend.
type Lease struct {
	Name  string        // the lock name
	Token string        // the owner token the lock must still hold
	TTL   time.Duration // the new lease, from now
}

// Notifier is implemented by backends that can tell waiters, in this process and others,
// that a name was released. A Guard opens one Subscription the first time one of its
// callers waits, shares it between all its waiters, and closes it in Close. Backends without
// it are still correct: waiters then re-try with a jittered backoff (10 ms doubling up to 1 s),
// never later than the holder's expiry.
type Notifier interface {
	// Subscribe opens a subscription that calls released with the name of each watched lock
	// that is released. released must not block; it may be called from any goroutine.
	Subscribe(released func(name string)) (Subscription, error)
}

// Subscription is a live stream of release notifications for a set of names.
type Subscription interface {
	// Watch adds name to the watched set. It returns once the backend confirms the watch,
	// so that a release that happens after Watch returns is reported.
	Watch(ctx context.Context, name string) error
	// Unwatch removes name from the watched set.
	Unwatch(name string)
	// Close ends the subscription and waits for its goroutines.
	Close() error
}
