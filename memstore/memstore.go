// Package memstore is the in-process lock backend: the embedded default when no server is
// configured. Several Guards sharing one Store behave like service instances sharing a Redis:
// mutual exclusion, fences, leases and release notifications all hold between them. Nothing
// leaves the process, so it serves tests, examples and single-process deployments; use
// redisstore or mongostore to coordinate separate processes.
package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/guardlock/guard"
)

var (
	_ guard.Backend  = (*Store)(nil)
	_ guard.Notifier = (*Store)(nil)
)

// Store keeps locks in memory. Its zero value is not usable; call New. It is safe for
// concurrent use.
type Store struct {
	now func() time.Time

	mu     sync.Mutex // protects locks, fences and subs
	locks  map[string]entry
	fences map[string]uint64 // never deleted: fences survive release
	subs   map[*subscription]struct{}
}

type entry struct {
	token   string
	expires time.Time
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		now:    time.Now,
		locks:  make(map[string]entry),
		fences: make(map[string]uint64),
		subs:   make(map[*subscription]struct{}),
	}
}

// held returns the live entry of name. s.mu must be held.
func (s *Store) held(name string, now time.Time) (entry, bool) {
	e, ok := s.locks[name]
	if ok && !now.Before(e.expires) {
		delete(s.locks, name)
		return entry{}, false
	}
	return e, ok
}

// Acquire takes name for token when it is free or its lease ran out, and returns the next
// fence. When it is held it returns a *guard.BusyError with the holder's remaining lease.
func (s *Store) Acquire(ctx context.Context, name, token string, ttl time.Duration) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if e, ok := s.held(name, now); ok {
		return 0, &guard.BusyError{Name: name, Remaining: e.expires.Sub(now)}
	}
	s.fences[name]++
	s.locks[name] = entry{token: token, expires: now.Add(ttl)}
	return s.fences[name], nil
}

// Extend sets each lease that its token still holds to its TTL from now.
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for i, l := range leases {
		e, ok := s.held(l.Name, now)
		if !ok || e.token != l.Token {
			errs[i] = notHeld(l.Name)
			continue
		}
		e.expires = now.Add(l.TTL)
		s.locks[l.Name] = e
	}
	return errs
}

// Release frees name if token holds it, or with keep > 0 sets its lease to keep. A release that
// frees the name notifies the subscriptions watching it.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	e, ok := s.held(name, now)
	if !ok || e.token != token {
		s.mu.Unlock()
		return notHeld(name)
	}
	if keep > 0 {
		e.expires = now.Add(keep)
		s.locks[name] = e
		s.mu.Unlock()
		return nil
	}
	delete(s.locks, name)
	var notify []func(string)
	for sub := range s.subs {
		if sub.watches(name) {
			notify = append(notify, sub.released)
		}
	}
	s.mu.Unlock()
	for _, f := range notify {
		f(name)
	}
	return nil
}

func notHeld(name string) error {
	return fmt.Errorf("guard/memstore: %q: %w", name, guard.ErrNotHeld)
}

// Subscribe opens a subscription to releases of the names it watches.
func (s *Store) Subscribe(released func(name string)) (guard.Subscription, error) {
	sub := &subscription{s: s, released: released, names: make(map[string]struct{})}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return sub, nil
}

type subscription struct {
	s        *Store
	released func(string)

	mu    sync.Mutex // protects names
	names map[string]struct{}
}

func (sub *subscription) watches(name string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	_, ok := sub.names[name]
	return ok
}

// Watch starts reporting releases of name; it is in effect when Watch returns.
func (sub *subscription) Watch(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sub.mu.Lock()
	sub.names[name] = struct{}{}
	sub.mu.Unlock()
	return nil
}

// Unwatch stops reporting releases of name.
func (sub *subscription) Unwatch(name string) {
	sub.mu.Lock()
	delete(sub.names, name)
	sub.mu.Unlock()
}

// Close ends the subscription.
func (sub *subscription) Close() error {
	sub.s.mu.Lock()
	delete(sub.s.subs, sub)
	sub.s.mu.Unlock()
	return nil
}
