package guard

import (
	"context"
	"fmt"
)

// Semaphore admits up to a number of holders of one name at once, across processes: "at most
// 3 imports per tenant", "at most 10 calls into a partner API". Each permit is a Lock of its
// own — its own token, fence and context, held by the watchdog or for a LeaseTime, with
// MinHold, Extend and Release — so everything a Lock promises holds for a permit: a permit
// whose holder died returns when its lease ends, and its holder's context ends before its
// lease can run out.
//
// Permits are counted per name by the backend, when each is asked for: a Semaphore asks for
// a permit while fewer holders than its own count hold the name. Semaphores of one name with
// different counts therefore each see their own limit, and lowering the count takes no
// permit away — new ones wait until the holders are fewer than it. Waiters are served first
// come, first served where the backend keeps a queue. A Mutex on the same name (Guard.Acquire)
// is exclusive with every permit of it.
type Semaphore struct {
	g       *Guard
	name    string
	permits int
}

// Semaphore returns a semaphore of permits on name. It returns an error matching
// ErrUnsupported when the Guard's backend cannot grant shared holds (it does not implement
// Sharing), an *OptionError for permits < 1, and a *NameError for a bad name.
func (g *Guard) Semaphore(name string, permits int) (*Semaphore, error) {
	if err := g.sharing("Semaphore"); err != nil {
		return nil, err
	}
	if permits < 1 {
		return nil, &OptionError{Option: "Semaphore", Value: permits, Reason: "must be at least 1"}
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	return &Semaphore{g: g, name: name, permits: permits}, nil
}

// Name returns the semaphore's lock name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns how many holders the semaphore admits at once.
func (s *Semaphore) Permits() int { return s.permits }

// Acquire takes a permit, waiting as Guard.Acquire does: until ctx is done, or up to
// WaitTime. It returns the permit as a Lock, and the errors Guard.Acquire returns.
func (s *Semaphore) Acquire(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return s.g.acquire(ctx, s.name, -1, withKind(opts, kindOf(KindPermit, s.permits, "")))
}

// TryAcquire is Acquire with one attempt by default.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return s.g.acquire(ctx, s.name, 0, withKind(opts, kindOf(KindPermit, s.permits, "")))
}

// Do runs fn under a permit, as Guard.Do runs it under a lock.
func (s *Semaphore) Do(ctx context.Context, fn func(context.Context) error, opts ...LockOption) error {
	return s.g.do(ctx, s.name, fn, withKind(opts, kindOf(KindPermit, s.permits, "")))
}

// RWMutex is a read-write lock on one name, across processes: many readers at once, or one
// writer. Each side is a Lock of its own — readers are renewed one by one, each by its own
// lease — and a waiting writer is not passed by readers that come after it, so a stream of
// readers does not starve it. A Mutex on the same name (Guard.Acquire) is a writer.
type RWMutex struct {
	g    *Guard
	name string
}

// RWMutex returns a read-write lock on name. It returns an error matching ErrUnsupported when
// the Guard's backend cannot grant shared holds (it does not implement Sharing), and a
// *NameError for a bad name.
func (g *Guard) RWMutex(name string) (*RWMutex, error) {
	if err := g.sharing("RWMutex"); err != nil {
		return nil, err
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	return &RWMutex{g: g, name: name}, nil
}

// Name returns the lock name.
func (m *RWMutex) Name() string { return m.name }

// RLock takes the read side, waiting as Guard.Acquire does (WaitTime(0) makes one attempt).
// Code that runs under a read lock and asks for the write side with its context gets an error
// matching ErrUpgrade: it would wait for itself.
func (m *RWMutex) RLock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return m.g.acquire(ctx, m.name, -1, withKind(opts, kindOf(KindRead, 0, "")))
}

// Lock takes the write side, waiting as Guard.Acquire does (WaitTime(0) makes one attempt).
func (m *RWMutex) Lock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return m.g.acquire(ctx, m.name, -1, withKind(opts, kindOf(KindWrite, 0, "")))
}

// sharing reports whether the Guard's backend grants shared holds, for the primitive named.
func (g *Guard) sharing(primitive string) error {
	if _, ok := g.backend.(Sharing); !ok {
		return fmt.Errorf("%w: %s needs shared locks, which %s does not grant (guard.Sharing)", ErrUnsupported, primitive, g.backendName)
	}
	return nil
}
