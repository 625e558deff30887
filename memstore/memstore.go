// Package memstore is the in-process lock backend: the embedded default when no server is
// configured. Several Guards sharing one Store behave like service instances sharing a Redis:
// mutual exclusion, fences, leases and release notifications all hold between them. Nothing
// leaves the process, so it serves tests, examples and single-process deployments; use a
// server backend (redisstore, mongostore, pgstore, mysqlstore) to coordinate processes.
//
// A Store keeps a wait queue per name, as redisstore does: a free name goes to the caller
// that has waited longest (a release hands it over at once), and a newcomer does not take it
// past waiting callers.
//
// A Store keeps state only for names that are held or waited for: a release forgets the
// name, and names whose lease ran out are swept as the Store is used, so a service that locks
// one name per request does not grow. Fences come from one counter for the whole Store, so
// they strictly increase per name although nothing is kept per name.
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

// QueueTimeout is how long a waiter keeps its place in a name's queue after its last request.
const QueueTimeout = 5 * time.Second

// Store keeps locks in memory. Its zero value is not usable; call New. It is safe for
// concurrent use.
type Store struct {
	now func() time.Time

	mu     sync.Mutex // protects locks, queues, fence, ops and subs
	locks  map[string]entry
	queues map[string][]waiter // by name, in arrival order
	fence  uint64              // the last fence given, for any name
	ops    int                 // acquisitions since the last sweep
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

// waiter is a place in a name's queue.
type waiter struct {
	token, instance, label string
	ttl                    time.Duration // the lease it asked for
	expires                time.Time     // when it loses its place
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		now:    time.Now,
		locks:  make(map[string]entry),
		queues: make(map[string][]waiter),
		subs:   make(map[*subscription]struct{}),
	}
}

// held returns the live entry of name, forgetting it when its lease ran out. s.mu must be
// held; a change to the entry is kept with s.locks[name] = e.
func (s *Store) held(name string, now time.Time) (entry, bool) {
	e, ok := s.locks[name]
	if ok && !now.Before(e.expires) {
		delete(s.locks, name)
		return entry{}, false
	}
	return e, ok
}

// Acquire takes r.Name for r.Token when it is free and no live waiter came first, and returns
// the next fence; when r.Token holds it already, it sets the lease again and returns the same
// fence. Otherwise it returns a *guard.BusyError with the time the name stays taken — after
// queueing r.Token when r.Wait is set.
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
	e, held := s.held(r.Name, now)
	if held && e.token == r.Token {
		e.expires = now.Add(r.TTL)
		s.locks[r.Name] = e
		return e.fence, nil
	}
	if !held {
		if head, ok := s.first(r.Name, now); !ok || head.token == r.Token {
			s.leave(r.Name, r.Token)
			return s.grant(r.Name, r.Token, r.Instance, r.Label, r.TTL, now), nil
		}
	}
	busy := &guard.BusyError{Name: r.Name}
	if held {
		busy.Remaining = e.expires.Sub(now)
	}
	if r.Wait {
		s.queue(r, now)
		busy.Queued = QueueTimeout
	}
	return 0, busy
}

// grant gives name to token and returns its fence. s.mu must be held.
func (s *Store) grant(name, token, instance, label string, ttl time.Duration, now time.Time) uint64 {
	s.fence++
	s.locks[name] = entry{
		token: token, fence: s.fence, instance: instance, label: label,
		acquired: now, expires: now.Add(ttl),
	}
	return s.fence
}

// first returns the first waiter for name whose place has not expired, dropping the expired
// ones before it. s.mu must be held.
func (s *Store) first(name string, now time.Time) (waiter, bool) {
	q := s.queues[name]
	for len(q) > 0 && !now.Before(q[0].expires) {
		q = q[1:]
	}
	if len(q) == 0 {
		delete(s.queues, name)
		return waiter{}, false
	}
	s.queues[name] = q
	return q[0], true
}

// queue puts r.Token at the end of r.Name's queue, or refreshes its place. s.mu must be held.
func (s *Store) queue(r guard.Request, now time.Time) {
	w := waiter{token: r.Token, instance: r.Instance, label: r.Label, ttl: r.TTL, expires: now.Add(QueueTimeout)}
	q := s.queues[r.Name]
	if i := slices.IndexFunc(q, func(w waiter) bool { return w.token == r.Token }); i >= 0 {
		q[i] = w
		return
	}
	s.queues[r.Name] = append(q, w)
}

// leave takes token out of name's queue and reports whether it was there. s.mu must be held.
func (s *Store) leave(name, token string) bool {
	q := s.queues[name]
	i := slices.IndexFunc(q, func(w waiter) bool { return w.token == token })
	if i < 0 {
		return false
	}
	q = slices.Delete(q, i, i+1)
	if len(q) == 0 {
		delete(s.queues, name)
	} else {
		s.queues[name] = q
	}
	return true
}

// handOver gives the free name to its first live waiter, if any, and tells the subscriptions
// that the release of token (empty for a forced one) did so — or, when nobody queued, that the
// name is free. s.mu must be held; handOver lets go of it.
func (s *Store) handOver(name, token string, now time.Time) {
	w, ok := s.first(name, now)
	if !ok {
		s.notifyLocked(guard.Notice{Name: name, Token: token}) // to waiters that did not queue
		return
	}
	s.leave(name, w.token)
	// No longer than its place: a live waiter claims the rest of its lease at once.
	fence := s.grant(name, w.token, w.instance, w.label, min(w.ttl, QueueTimeout), now)
	s.notifyLocked(guard.Notice{Name: name, Token: token, Next: w.token, Fence: fence})
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
	for name, q := range s.queues {
		q = slices.DeleteFunc(q, func(w waiter) bool { return !now.Before(w.expires) })
		if len(q) == 0 {
			delete(s.queues, name)
		} else {
			s.queues[name] = q
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
		s.locks[l.Name] = e
	}
	return errs
}

// Release frees name if token holds it and hands it to the first live waiter, or with keep > 0
// keeps it taken for keep under no token; either way it tells the subscriptions watching name.
// A token that waits for name instead of holding it leaves the queue.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	e, held := s.held(name, now)
	if !held || e.token != token {
		if s.leave(name, token) && !held {
			// A waiter gave up while the name was free: the next one may take it now.
			s.handOver(name, "", now)
			return guard.ErrNotHeld
		}
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	if keep > 0 {
		e.token = ""
		e.expires = now.Add(keep)
		s.locks[name] = e
		s.notifyLocked(guard.Notice{Name: name, Token: token}) // waiters learn when the window ends
		return nil
	}
	delete(s.locks, name)
	s.handOver(name, token, now)
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
		return guard.LockInfo{Name: name, Waiting: len(s.queues[name])}, nil
	}
	info := info(name, e, now)
	info.Waiting = len(s.queues[name])
	return info, nil
}

func info(name string, e entry, now time.Time) guard.LockInfo {
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
	now := s.now()
	if _, ok := s.held(name, now); !ok {
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	delete(s.locks, name)
	// No token: the holder's Guard did not release it, and must not take the notice for its
	// own release.
	s.handOver(name, "", now)
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
