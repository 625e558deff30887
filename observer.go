package guard

import (
	"context"
	"time"
)

// Observer receives every lifecycle event of the locks of a Guard: an acquisition starting
// and ending with its outcome, and then renewals, renewal failures, loss, lease end and
// release of the lock it gave. Package tracing implements it with OpenTelemetry spans and
// metrics. Methods are called synchronously from the Guard's goroutines and must return
// quickly. A Guard without an observer skips all of this at no cost.
type Observer interface {
	// AcquireStart is called before the first attempt of an acquisition. The context it
	// returns is used for the rest of the acquisition and passed to AcquireEnd.
	AcquireStart(ctx context.Context, a *Acquisition) context.Context
	// AcquireEnd is called once the acquisition ended: with a Lock, or with err. a.Outcome,
	// a.Waited, a.Attempts and a.Wakeups are final. When l is not nil the context it returns
	// becomes the parent of the Lock's context, so what it carries (a span of the locked
	// section) is seen by the code that runs under the lock.
	AcquireEnd(ctx context.Context, a *Acquisition, l *Lock, err error) context.Context
	// LockEvent reports what happened to a held lock.
	LockEvent(l *Lock, e LockEvent)
}

// Acquisition describes one call to Acquire, TryAcquire or Do, or to a primitive's.
type Acquisition struct {
	Name  string // the lock name
	Label string // the low-cardinality label given with the Label option, or ""
	Kind  Kind   // what is asked for: a mutex, a permit, a read or write side, a term
	// Permits is the Semaphore's number of permits when Kind is KindPermit, else 0.
	Permits int
	// Backend names the backend's package, such as "redisstore" or "memstore".
	Backend string
	// MaxWait is how long the caller was prepared to wait: 0 for one attempt, < 0 for as long
	// as its context allows.
	MaxWait time.Duration
	Started time.Time // when the acquisition began

	// Set when it ended.
	Outcome  Outcome
	Waited   time.Duration // from Started to the end
	Attempts int           // requests sent to the backend
	Wakeups  int           // release notifications that woke the waiter
}

// Outcome is how an acquisition ended.
type Outcome int

// The outcomes of an acquisition.
const (
	OutcomeAcquired Outcome = iota // the lock was taken
	OutcomeBusy                    // one attempt found it held
	OutcomeTimeout                 // WaitTime ran out while it was held
	OutcomeCanceled                // the caller's context ended the wait
	OutcomeError                   // the backend failed, or the name or an option was invalid
)

var outcomeNames = [...]string{"acquired", "busy", "timeout", "canceled", "error"}

// String returns the outcome in lower case, as telemetry records it.
func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return "unknown"
	}
	return outcomeNames[o]
}

// LockEvent is something that happened to a held lock.
type LockEvent struct {
	Kind EventKind // what happened
	At   time.Time // when
	// Deadline is the lock's local validity deadline after the event.
	Deadline time.Time
	// Err is the renewal failure, the cause of loss or lease end, or the release's error.
	Err error
	// Duration is how long the release call took (EventReleased).
	Duration time.Duration
}

// EventKind tells LockEvents apart.
type EventKind int

// The kinds of LockEvent.
const (
	EventRenewed      EventKind = iota // the watchdog extended the lease
	EventRenewFailed                   // a renewal failed for now; the watchdog tries again
	EventLost                          // ownership could not be confirmed; the lock's context was cancelled with ErrLockLost
	EventLeaseExpired                  // a LeaseTime lock reached its deadline; its context was cancelled with ErrLeaseExpired
	EventExtended                      // Lock.Extend pushed the lease back
	EventReleased                      // Release (or Guard.Close) gave the lock up
)

var eventNames = [...]string{"renewed", "renew_failed", "lost", "lease_expired", "extended", "released"}

// String returns the event kind in lower case, as telemetry records it.
func (k EventKind) String() string {
	if k < 0 || int(k) >= len(eventNames) {
		return "unknown"
	}
	return eventNames[k]
}

// Kind tells the primitives apart: what an acquisition asks for, and what a Lock holds.
type Kind int

// The kinds of locks.
const (
	KindMutex  Kind = iota // Guard.Acquire and TryAcquire, Do, AcquireAll's members
	KindPermit             // a Semaphore's permit: a shared hold with a limit
	KindRead               // an RWMutex's read side: a shared hold
	KindWrite              // an RWMutex's write side: an exclusive hold
	KindTerm               // an Election's term: an exclusive hold that publishes a value
)

var kindNames = [...]string{"mutex", "permit", "read", "write", "term"}

// String returns the kind in lower case, as telemetry records it.
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "unknown"
	}
	return kindNames[k]
}

// shared reports whether k is a shared hold.
func (k Kind) shared() bool { return k == KindPermit || k == KindRead }
