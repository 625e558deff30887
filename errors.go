package guard

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors. Match them with errors.Is: the errors returned by this package and its
// backends wrap them with detail.
var (
	// ErrNotAcquired reports that the lock is held by someone else: a single attempt found it
	// busy, the wait ran out, or the caller's context ended the wait (then the error also
	// matches ctx.Err()).
	ErrNotAcquired = errors.New("guard: lock not acquired")
	// ErrLockLost is the cause of a Lock's context when ownership could not be confirmed:
	// another owner took the name, the key disappeared, or renewal did not succeed before
	// the local validity deadline.
	ErrLockLost = errors.New("guard: lock lost")
	// ErrLeaseExpired is the cause of a Lock's context when a lock taken with LeaseTime
	// reaches the end of its lease.
	ErrLeaseExpired = errors.New("guard: lease expired")
	// ErrNotHeld reports an Extend or Release by a token that does not hold the lock.
	ErrNotHeld = errors.New("guard: lock not held")
	// ErrReleased is the cause of a Lock's context after Release.
	ErrReleased = errors.New("guard: lock released")
	// ErrClosed reports use of a closed Guard; it is also the cause of the context of each
	// lock that Close released.
	ErrClosed = errors.New("guard: guard closed")
	// ErrInvalidName is matched by every *NameError.
	ErrInvalidName = errors.New("guard: invalid lock name")
	// ErrInvalidOption is matched by every *OptionError.
	ErrInvalidOption = errors.New("guard: invalid option")
	// ErrNotExtendable reports Lock.Extend on a lock that the watchdog renews: only a lock
	// taken with LeaseTime is extended by hand.
	ErrNotExtendable = errors.New("guard: the watchdog renews this lock; only a LeaseTime lock is extended by hand")
	// ErrUnsupported reports a primitive that the Guard's backend cannot provide: a
	// Semaphore or an RWMutex on a backend without Sharing, an Election on one without
	// Inspector.
	ErrUnsupported = errors.New("guard: the backend does not support this")
	// ErrUpgrade reports an exclusive acquisition under a context that holds the name
	// shared (a read lock, a permit): it would wait for itself. Release the shared hold
	// first.
	ErrUpgrade = errors.New("guard: a shared hold cannot be upgraded to an exclusive one")
	// ErrChangedHands is matched by every *ChangedHandsError: an Inspector.ForceRelease that
	// released nothing because the name is held under another fence than the one given.
	ErrChangedHands = errors.New("guard: lock changed hands")
)

// ChangedHandsError reports an Inspector.ForceRelease that released nothing: name is held
// with another fence than the one the caller saw, so it changed hands since the caller looked.
// It matches ErrChangedHands.
type ChangedHandsError struct {
	Name  string // the lock name
	Fence uint64 // the fence the caller gave: the holder it meant to break
	Found uint64 // the fence the name is held with now
}

// Error says which fence was asked for and which one holds the name.
func (e *ChangedHandsError) Error() string {
	return fmt.Sprintf("guard: lock %q changed hands: it is held with fence %d, not %d", e.Name, e.Found, e.Fence)
}

// Is reports whether target is ErrChangedHands.
func (e *ChangedHandsError) Is(target error) bool { return target == ErrChangedHands }

// BusyError is returned when a lock is held by another owner: one attempt found it taken, or
// a wait ran out. It matches ErrNotAcquired.
type BusyError struct {
	// Name is the lock name.
	Name string
	// Kind is what was asked for: KindPermit when a Semaphore's permits were all taken,
	// KindRead or KindWrite for a side of an RWMutex, KindTerm for an Election's term,
	// KindMutex for a lock.
	Kind Kind
	// Remaining is how long the name stays taken as the backend reported it — the holder's
	// lease, or the rest of a MinHold window — or 0 when unknown.
	Remaining time.Duration
	// Waited is how long the acquisition waited before it gave up: 0 for a single attempt.
	Waited time.Duration
	// Queued is set by a backend with a wait queue (Request.Wait): the caller has a place in
	// the name's queue, which it keeps for this long after its request. A waiter asks again
	// within that time, or loses its place.
	Queued time.Duration
}

// Error describes the busy lock.
func (e *BusyError) Error() string {
	s := fmt.Sprintf("guard: lock %q is held", e.Name)
	if e.Remaining > 0 {
		s += fmt.Sprintf(" (for %v more)", e.Remaining)
	}
	if e.Waited > 0 {
		s += fmt.Sprintf("; gave up after waiting %v", e.Waited.Round(time.Millisecond))
	}
	return s
}

// Is reports whether target is ErrNotAcquired.
func (e *BusyError) Is(target error) bool { return target == ErrNotAcquired }

// OpError reports a failed operation on a named lock — acquire, extend, release — with its
// cause, which errors.Is and errors.As see through. The Guard adds the operation and the name
// once; backends return bare causes.
type OpError struct {
	Op   string // "acquire", "extend" or "release"
	Name string // the lock name
	Err  error  // the cause
}

// Error says the operation, the name and the cause, in that order.
func (e *OpError) Error() string {
	return fmt.Sprintf("guard: %s %q: %s", e.Op, e.Name, bare(e.Err))
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// bare returns err's message without this package's "guard: " prefix, for a message that
// already starts with it.
func bare(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.TrimPrefix(err.Error(), "guard: ")
}

// because wraps err and its cause into one error that matches both and says the cause in
// parentheses: "lock not held (lock lost: …)".
func because(err, cause error) error { return &causedError{err: err, cause: cause} }

type causedError struct{ err, cause error }

func (e *causedError) Error() string   { return e.err.Error() + " (" + bare(e.cause) + ")" }
func (e *causedError) Unwrap() []error { return []error{e.err, e.cause} }

// NameError reports a lock name that cannot be used. It matches ErrInvalidName.
type NameError struct {
	Name   string // the name, or the template it was to be rendered from
	Reason string // what is wrong with it
}

// Error describes the bad name.
func (e *NameError) Error() string {
	return fmt.Sprintf("guard: invalid lock name %.64q: %s", e.Name, e.Reason)
}

// Is reports whether target is ErrInvalidName.
func (e *NameError) Is(target error) bool { return target == ErrInvalidName }

// OptionError reports an option value that cannot be used. It matches ErrInvalidOption.
type OptionError struct {
	Option string // the option's name, such as "LeaseTime"
	Value  any    // the value it was given
	Reason string // what is wrong with it
}

// Error describes the bad option.
func (e *OptionError) Error() string {
	v := fmt.Sprint(e.Value)
	if s, ok := e.Value.(string); ok {
		v = fmt.Sprintf("%.64q", s) // a value can be long, or hold what the caller would not print
	}
	return fmt.Sprintf("guard: invalid option %s(%s): %s", e.Option, v, e.Reason)
}

// Is reports whether target is ErrInvalidOption.
func (e *OptionError) Is(target error) bool { return target == ErrInvalidOption }

// MaxNameLen is the longest lock name, in bytes, that a Guard accepts.
const MaxNameLen = 1024

// CheckName reports whether name can be used as a lock name: not empty, valid UTF-8, no NUL
// byte, and at most MaxNameLen bytes. It returns a *NameError otherwise.
func CheckName(name string) error {
	switch {
	case name == "":
		return &NameError{Name: name, Reason: "empty"}
	case len(name) > MaxNameLen:
		return &NameError{Name: name, Reason: fmt.Sprintf("%d bytes, more than %d", len(name), MaxNameLen)}
	case !utf8.ValidString(name):
		return &NameError{Name: name, Reason: "not valid UTF-8"}
	case strings.IndexByte(name, 0) >= 0:
		return &NameError{Name: name, Reason: "contains a NUL byte"}
	}
	return nil
}

func isLoss(err error) bool { return errors.Is(err, ErrLockLost) || errors.Is(err, ErrLeaseExpired) }
