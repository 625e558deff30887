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
)

// BusyError is returned when a lock is held by another owner. It matches ErrNotAcquired.
type BusyError struct {
	// Name is the lock name.
	Name string
	// Remaining is the holder's remaining lease as the backend reported it, or 0 when unknown.
	Remaining time.Duration
}

// Error describes the busy lock.
func (e *BusyError) Error() string {
	if e.Remaining > 0 {
		return fmt.Sprintf("guard: lock %q is held (for %v more)", e.Name, e.Remaining)
	}
	return fmt.Sprintf("guard: lock %q is held", e.Name)
}

// Is reports whether target is ErrNotAcquired.
func (e *BusyError) Is(target error) bool { return target == ErrNotAcquired }

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
	return fmt.Sprintf("guard: invalid option %s(%v): %s", e.Option, e.Value, e.Reason)
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

func isNotHeld(err error) bool { return errors.Is(err, ErrNotHeld) }

func isLoss(err error) bool { return errors.Is(err, ErrLockLost) || errors.Is(err, ErrLeaseExpired) }
