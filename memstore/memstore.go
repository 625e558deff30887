package memstore

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Notifier  = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
	_ guard.Sharing   = (*Store)(nil)
	_ guard.Batcher   = (*Store)(nil)
)

// sweepEvery is how many acquisitions pass between two sweeps of expired names.
const sweepEvery = 1024

// QueueTimeout is how long a waiter keeps its place in a name's queue after its last request,
// at most: never longer than the lease it asked for (watchdog.Place).
const QueueTimeout = 5 * time.Second

// Store keeps locks in memory. Its zero value is not usable; call New. It is safe for
// concurrent use.
type Store struct {
	now func() time.Time

	mu     sync.Mutex // protects names, fence, ops, sweeps and subs
	names  map[string]*state
	fence  uint64 // the last fence given, for any name
	ops    int    // acquisitions since the last sweep
	subs   map[*subscription]struct{}
	sweeps int    // sweeps done, for tests
	spare  *state // the state of a name forgotten last, emptied, for the next name to be held
}

// state is what the Store keeps of one name: its holders and its queue. A name that nobody
// holds or waits for has none.
type state struct {
	holders []holder // an exclusive holder alone, or shared holders; kept windows included
	queue   []waiter // by arrival
}

// holder is one grant of a name.
type holder struct {
	token                  string // "" while kept for a MinHold window: no token matches
	shared                 bool
	fence                  uint64
	instance, label, value string
	acquired, expires      time.Time
}

// waiter is a place in a name's queue.
type waiter struct {
	token, instance, label, value string
	shared                        bool
	limit                         int
	ttl                           time.Duration // the lease it asked for
	place                         time.Duration // how long a request keeps its place
	attempt                       int           // the Request.Attempt that last refreshed it
	expires                       time.Time     // when it loses its place
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		now:   time.Now,
		names: make(map[string]*state),
		subs:  make(map[*subscription]struct{}),
	}
}

// SharedLocks tells that a Store grants shared holds (guard.Sharing).
func (*Store) SharedLocks() {}

// state returns the state of name with the holders whose lease ran out dropped, or nil when
// nobody holds it or waits for it. s.mu must be held.
func (s *Store) state(name string, now time.Time) *state {
	st := s.names[name]
	if st == nil {
		return nil
	}
	st.holders = slices.DeleteFunc(st.holders, func(h holder) bool { return !now.Before(h.expires) })
	st.first(now)
	if len(st.holders) == 0 && len(st.queue) == 0 {
		delete(s.names, name)
		if cap(st.holders) <= maxSpareHolders {
			// A name taken and given back again and again then costs no allocation here.
			clear(st.holders[:cap(st.holders)])
			*st = state{holders: st.holders[:0]}
			s.spare = st
		}
		return nil
	}
	return st
}

// maxSpareHolders is the most holders the state kept for reuse (Store.spare) has room for.
const maxSpareHolders = 4

// stateOf returns the state of name, made when there is none. s.mu must be held.
func (s *Store) stateOf(name string, now time.Time) *state {
	if st := s.state(name, now); st != nil {
		return st
	}
	st := s.spare
	if st != nil {
		s.spare = nil
	} else {
		st = &state{}
	}
	s.names[name] = st
	return st
}

// holder returns the holder with token, or nil.
func (st *state) holder(token string) *holder {
	for i := range st.holders {
		if st.holders[i].token == token && token != "" {
			return &st.holders[i]
		}
	}
	return nil
}

// fits reports whether a request of that mode and limit could hold the name now, as far as
// its holders go.
func (st *state) fits(shared bool, limit int) bool {
	if !shared {
		return len(st.holders) == 0
	}
	for _, h := range st.holders {
		if !h.shared {
			return false
		}
	}
	return limit <= 0 || len(st.holders) < limit
}

// until returns how long the name stays unavailable to a request of that mode and limit, as
// far as its holders go: until the last holder goes, for an exclusive request; until the
// exclusive holder goes, or, when the shared ones fill the limit, the first of them, for a
// shared one.
func (st *state) until(shared bool, limit int, now time.Time) time.Duration {
	var last, first time.Duration
	for i, h := range st.holders {
		left := h.expires.Sub(now)
		if !h.shared && shared {
			return left
		}
		last = max(last, left)
		if i == 0 || left < first {
			first = left
		}
	}
	switch {
	case !shared:
		return last
	case limit > 0 && len(st.holders) >= limit:
		return first
	}
	return 0
}

// first returns the first waiter whose place has not expired, dropping the expired ones
// before it.
func (st *state) first(now time.Time) (waiter, bool) {
	for len(st.queue) > 0 && !now.Before(st.queue[0].expires) {
		st.queue = st.queue[1:]
	}
	if len(st.queue) == 0 {
		return waiter{}, false
	}
	return st.queue[0], true
}

// leave takes token out of the queue and reports whether it was there.
func (st *state) leave(token string) bool {
	i := slices.IndexFunc(st.queue, func(w waiter) bool { return w.token == token })
	if i < 0 {
		return false
	}
	st.queue = slices.Delete(st.queue, i, i+1)
	return true
}

// Acquire takes r.Name for r.Token when r fits beside its holders (see guard.Request.Shared)
// and no live waiter came first, and returns the next fence; when r.Token holds it already,
// it sets the lease again and returns the same fence. Otherwise it returns a
// *guard.BusyError with the time the name stays unavailable to r — after queueing r.Token
// when r.Wait is set.
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
	st := s.stateOf(r.Name, now)
	if h := st.holder(r.Token); h != nil {
		h.expires = now.Add(r.TTL)
		return h.fence, nil
	}
	head, queued := st.first(now)
	if st.fits(r.Shared, r.Limit) && (!queued || head.token == r.Token) {
		st.leave(r.Token)
		return s.grant(st, r.Token, r.Instance, r.Label, r.Value, r.Shared, r.TTL, now), nil
	}
	busy := &guard.BusyError{Name: r.Name, Remaining: st.until(r.Shared, r.Limit, now)}
	if busy.Remaining <= 0 && queued {
		// Free for it, but another waiter comes first: it is ours no sooner than that
		// waiter takes it, or loses its place.
		busy.Remaining = head.expires.Sub(now)
	}
	if r.Wait {
		busy.Queued = st.queue1(r, now)
	}
	return 0, busy
}

// AcquireAll takes every request's name at once, or none: it returns their fences, or the
// first busy answer. It queues nobody.
func (s *Store) AcquireAll(ctx context.Context, reqs []guard.Request) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, r := range reqs {
		st := s.stateOf(r.Name, now)
		if st.holder(r.Token) != nil {
			continue
		}
		head, queued := st.first(now)
		if !st.fits(r.Shared, r.Limit) || queued && head.token != r.Token {
			busy := &guard.BusyError{Name: r.Name, Remaining: st.until(r.Shared, r.Limit, now)}
			if busy.Remaining <= 0 && queued {
				busy.Remaining = head.expires.Sub(now)
			}
			for _, r := range reqs {
				s.state(r.Name, now) // forgets the states made for nothing
			}
			return nil, busy
		}
	}
	fences := make([]uint64, len(reqs))
	for i, r := range reqs {
		st := s.stateOf(r.Name, now)
		if h := st.holder(r.Token); h != nil {
			h.expires = now.Add(r.TTL)
			fences[i] = h.fence
			continue
		}
		st.leave(r.Token)
		fences[i] = s.grant(st, r.Token, r.Instance, r.Label, r.Value, r.Shared, r.TTL, now)
	}
	return fences, nil
}

// grant gives the name to token and returns its fence. s.mu must be held.
func (s *Store) grant(st *state, token, instance, label, value string, shared bool, ttl time.Duration, now time.Time) uint64 {
	s.fence++
	st.holders = append(st.holders, holder{
		token: token, shared: shared, fence: s.fence, instance: instance, label: label, value: value,
		acquired: now, expires: now.Add(ttl),
	})
	return s.fence
}

// queue1 puts r.Token at the end of the queue, or refreshes its place, and returns how long it
// keeps it.
func (st *state) queue1(r guard.Request, now time.Time) time.Duration {
	place := watchdog.Place(QueueTimeout, r.TTL)
	w := waiter{token: r.Token, instance: r.Instance, label: r.Label, value: r.Value,
		shared: r.Shared, limit: r.Limit, ttl: r.TTL, place: place, attempt: r.Attempt, expires: now.Add(place)}
	if i := slices.IndexFunc(st.queue, func(w waiter) bool { return w.token == r.Token }); i >= 0 {
		st.queue[i] = w
		return place
	}
	st.queue = append(st.queue, w)
	return place
}

// handOver gives the name to its first live waiters while they fit — one, or several shared
// ones — and returns the notices that tell the subscriptions: one per waiter it granted, or,
// when it granted none, that the name may be free. released is the token whose release freed
// the name ("" for a forced release or a waiter that left). It appends them to notices, whose
// room a caller can give on its stack. s.mu must be held.
func (s *Store) handOver(name string, st *state, released string, now time.Time, notices []guard.Notice) []guard.Notice {
	for {
		w, ok := st.first(now)
		if !ok || !st.fits(w.shared, w.limit) {
			break
		}
		st.leave(w.token)
		// No longer than its place: a live waiter claims the rest of its lease.
		lease := min(w.ttl, w.place)
		fence := s.grant(st, w.token, w.instance, w.label, w.value, w.shared, lease, now)
		notices = append(notices, guard.Notice{Name: name, Token: released, Next: w.token, Fence: fence,
			Lease: lease, Attempt: w.attempt})
	}
	if len(notices) == 0 {
		notices = append(notices, guard.Notice{Name: name, Token: released}) // to waiters that did not queue
	}
	return notices
}

// sweep forgets every name whose holders' leases and waiters' places all ran out. s.mu must be
// held.
func (s *Store) sweep(now time.Time) {
	s.ops = 0
	s.sweeps++
	for name := range s.names {
		s.state(name, now)
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
		var h *holder
		if st := s.state(l.Name, now); st != nil {
			h = st.holder(l.Token)
		}
		if h == nil {
			errs[i] = guard.ErrNotHeld
			continue
		}
		h.expires = now.Add(l.TTL)
	}
	return errs
}

// Release frees token's hold on name and hands what it frees to the first live waiters that
// fit, or with keep > 0 keeps its place taken for keep under no token; either way it tells
// the subscriptions watching name. A token that waits for name instead of holding it leaves
// the queue.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	st := s.state(name, now)
	var h *holder
	if st != nil {
		h = st.holder(token)
	}
	switch {
	case h == nil && st != nil && st.leave(token):
		// A waiter gave up: the next ones may fit now.
		var room [1]guard.Notice
		notices := s.handOver(name, st, "", now, room[:0])
		s.state(name, now)
		s.notifyLocked(notices)
		return guard.ErrNotHeld
	case h == nil:
		s.mu.Unlock()
		return guard.ErrNotHeld
	case keep > 0:
		h.token, h.expires = "", now.Add(keep)
		s.notifyLocked([]guard.Notice{{Name: name, Token: token}}) // waiters learn when the window ends
		return nil
	}
	st.holders = slices.DeleteFunc(st.holders, func(x holder) bool { return x.token == token })
	var room [1]guard.Notice
	notices := s.handOver(name, st, token, now, room[:0])
	s.state(name, now) // forgets a name nobody holds or waits for
	s.notifyLocked(notices)
	return nil
}

// notifyLocked tells the subscriptions watching the notices' names, after letting go of s.mu,
// which must be held.
func (s *Store) notifyLocked(notices []guard.Notice) {
	type call struct {
		f func(guard.Notice)
		n guard.Notice
	}
	var calls []call
	for _, n := range notices {
		for sub := range s.subs {
			if sub.watches(n.Name) {
				calls = append(calls, call{sub.notify, n})
			}
		}
	}
	s.mu.Unlock()
	for _, c := range calls {
		c.f(c.n)
	}
}

// Inspect reports name's newest holder and how many hold it. A free name's last fence is not
// kept: Fence is then 0.
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	if err := ctx.Err(); err != nil {
		return guard.LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	st := s.state(name, now)
	if st == nil {
		return guard.LockInfo{Name: name}, nil
	}
	info := guard.LockInfo{Name: name, Waiting: len(st.queue)}
	if len(st.holders) > 0 {
		newest := slices.MaxFunc(st.holders, func(a, b holder) int { return cmp.Compare(a.fence, b.fence) })
		info = lockInfo(name, newest, len(st.holders), now)
		info.Waiting = len(st.queue)
	}
	return info, nil
}

func lockInfo(name string, h holder, holders int, now time.Time) guard.LockInfo {
	return guard.LockInfo{
		Name: name, Held: true, Kept: h.token == "", Fence: h.fence, Instance: h.instance,
		Label: h.label, Value: h.value, Shared: h.shared, Holders: holders,
		AcquiredAt: h.acquired, Remaining: h.expires.Sub(now),
	}
}

// List returns the holders of the names that start with prefix, one entry each, in name and
// fence order, after cursor: the last entry's name and fence, from the previous page.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	limit = max(limit, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var page []guard.LockInfo
	for name := range s.names {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		st := s.state(name, now)
		if st == nil {
			continue
		}
		for _, h := range st.holders {
			if info := lockInfo(name, h, len(st.holders), now); cursorKey(info) > cursor {
				page = append(page, info)
			}
		}
	}
	slices.SortFunc(page, func(a, b guard.LockInfo) int { return cmp.Compare(cursorKey(a), cursorKey(b)) })
	if len(page) <= limit {
		return page, "", nil
	}
	page = page[:limit]
	return page, cursorKey(page[limit-1]), nil
}

// cursorKey orders List's entries: by name, then by fence. NUL sorts before every byte of a
// name, so a name's entries come before those of the names it prefixes.
func cursorKey(info guard.LockInfo) string {
	var fence [8]byte
	for i := range fence {
		fence[i] = byte(info.Fence >> (56 - 8*i))
	}
	return info.Name + "\x00" + string(fence[:])
}

// ForceRelease frees name's holder with fence — every holder when fence is 0 — hands what it
// frees to the first live waiters, and notifies the subscriptions watching it. It returns
// guard.ErrNotHeld when name is free, and a *guard.ChangedHandsError when no holder has fence.
func (s *Store) ForceRelease(ctx context.Context, name string, fence uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	now := s.now()
	st := s.state(name, now)
	if st == nil || len(st.holders) == 0 {
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	if fence != 0 && !slices.ContainsFunc(st.holders, func(h holder) bool { return h.fence == fence }) {
		newest := slices.MaxFunc(st.holders, func(a, b holder) int { return cmp.Compare(a.fence, b.fence) })
		s.mu.Unlock()
		return &guard.ChangedHandsError{Name: name, Fence: fence, Found: newest.fence}
	}
	st.holders = slices.DeleteFunc(st.holders, func(h holder) bool { return fence == 0 || h.fence == fence })
	// No token: the holder's Guard did not release it, and must not take the notice for its
	// own release.
	var room [1]guard.Notice
	notices := s.handOver(name, st, "", now, room[:0])
	s.state(name, now)
	s.notifyLocked(notices)
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
