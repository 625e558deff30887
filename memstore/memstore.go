// Package memstore is the in-process lock backend: the embedded default when no server is
// configured. Several Guards sharing one Store behave like service instances sharing a Redis:
// mutual exclusion, fences, leases and release notifications all hold between them. Nothing
// leaves the process, so it serves tests, examples and single-process deployments; use a
// server backend (redisstore, mongostore, pgstore, mysqlstore) to coordinate processes.
//
// A Store keeps state only for names that are held: a release forgets the name, and names
// whose lease ran out are swept as the Store is used, so a service that locks one name per
// request does not grow. Fences come from one counter for the whole Store, so they strictly
// increase per name although nothing is kept per name.
package memstore

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/guardlock/guard"
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Notifier  = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
)

// sweepEvery is how many acquisitions pass between two sweeps of expired names.
const sweepEvery = 1024

// Store keeps locks in memory. Its zero value is not usable; call New. It is safe for
// concurrent use.
type Store struct {
	now func() time.Time

	mu     sync.Mutex // protects locks, fence, ops and subs
	locks  map[string]*entry
	fence  uint64 // the last fence given, for any name
	ops    int    // acquisitions since the last sweep
	subs   map[*subscription]struct{}
	sweeps int // sweeps done, for tests
}

type entry struct {
	token    string // "" while kept for a MinHold window: no token matches
	fence    uint64
	instance string
	label    string
	acquired time.Time
	expires  time.Time
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		now:   time.Now,
		locks: make(map[string]*entry),
		subs:  make(map[*subscription]struct{}),
	}
}

// held returns the live entry of name, forgetting it when its lease ran out. s.mu must be
// held.
func (s *Store) held(name string, now time.Time) (*entry, bool) {
	e, ok := s.locks[name]
	if ok && !now.Before(e.expires) {
		delete(s.locks, name)
		return nil, false
	}
	return e, ok
}

// Acquire takes r.Name for r.Token when it is free or its lease ran out, and returns the next
// fence; when r.Token holds it already, it sets the lease again and returns the same fence.
// When it is held by another token it returns a *guard.BusyError with the time the name stays
// taken.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.ops++; s.ops >= sweepEvery {
		s.sweep(now)
	}
	if e, ok := s.held(r.Name, now); ok {
		if e.token != r.Token {
			return 0, &guard.BusyError{Name: r.Name, Remaining: e.expires.Sub(now)}
		}
		e.expires = now.Add(r.TTL)
		return e.fence, nil
	}
	s.fence++
	s.locks[r.Name] = &entry{
		token: r.Token, fence: s.fence, instance: r.Instance, label: r.Label,
		acquired: now, expires: now.Add(r.TTL),
	}
	return s.fence, nil
}

// sweep forgets every name whose lease ran out. s.mu must be held.
func (s *Store) sweep(now time.Time) {
	s.ops = 0
	s.sweeps++
	for name, e := range s.locks {
		if !now.Before(e.expires) {
			delete(s.locks, name)
		}
	}
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
			errs[i] = guard.ErrNotHeld
			continue
		}
		e.expires = now.Add(l.TTL)
	}
	return errs
}

// Release frees name if token holds it, or with keep > 0 keeps it taken for keep under no
// token. Either way it notifies the subscriptions watching name.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	e, ok := s.held(name, now)
	if !ok || e.token != token {
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	if keep > 0 {
		e.token = ""
		e.expires = now.Add(keep)
	} else {
		delete(s.locks, name)
	}
	s.notifyLocked(guard.Notice{Name: name, Token: token})
	return nil
}

// notifyLocked tells the subscriptions watching n.Name, after letting go of s.mu, which must
// be held.
func (s *Store) notifyLocked(n guard.Notice) {
	var notify []func(guard.Notice)
	for sub := range s.subs {
		if sub.watches(n.Name) {
			notify = append(notify, sub.notify)
		}
	}
	s.mu.Unlock()
	for _, f := range notify {
		f(n)
	}
}

// Inspect reports name's holder. A free name's last fence is not kept: Fence is then 0.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	if err := ctx.Err(); err != nil {
		return guard.LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, ok := s.held(name, now)
	if !ok {
		return guard.LockInfo{Name: name}, nil
	}
	return info(name, e, now), nil
}

func info(name string, e *entry, now time.Time) guard.LockInfo {
	return guard.LockInfo{
		Name: name, Held: true, Kept: e.token == "", Fence: e.fence,
		Instance: e.instance, Label: e.label, AcquiredAt: e.acquired, Remaining: e.expires.Sub(now),
	}
}

// List returns the held locks whose names start with prefix, in name order, after the name
// cursor.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	limit = max(limit, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var page []guard.LockInfo
	for name, e := range s.locks {
		if strings.HasPrefix(name, prefix) && name > cursor && now.Before(e.expires) {
			page = append(page, info(name, e, now))
		}
	}
	slices.SortFunc(page, func(a, b guard.LockInfo) int { return cmp.Compare(a.Name, b.Name) })
	if len(page) <= limit {
		return page, "", nil
	}
	page = page[:limit]
	return page, page[limit-1].Name, nil
}

// ForceRelease frees name whoever holds it and notifies the subscriptions watching it.
func (s *Store) ForceRelease(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if _, ok := s.held(name, s.now()); !ok {
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	delete(s.locks, name)
	// No token: the holder's Guard did not release it, and must wake its waiters too.
	s.notifyLocked(guard.Notice{Name: name})
	return nil
}

// Subscribe opens a subscription to releases of the names it watches.
func (s *Store) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	sub := &subscription{s: s, notify: notify, names: make(map[string]struct{})}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return sub, nil
}

type subscription struct {
	s      *Store
	notify func(guard.Notice)

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
