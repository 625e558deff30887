package sim

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

// server is the simulated backend's state: the semantics of the queueing stores (redisstore's
// scripts, memstore) — a lease per name measured by the server's own clock, a FIFO queue of
// waiters whose places lapse, hand-over of a freed name to the first live waiter, MinHold
// windows kept under no token, and fences floored by the server's clock so that they keep
// increasing across a restart that loses every key.
//
// Expiry is lazy, as in Redis: a lease that ran out is found when the name is next touched.
// The history still gets the true end of every tenure: the server converts its clock's expiry
// time back to simulated time.
type server struct {
	mu    sync.Mutex // protects everything below
	epoch time.Time  // simulated time at the start
	rate  float64    // how much faster the server's clock runs than simulated time
	names map[string]*nameState
	subs  map[*subscription]struct{}
	hist  *history
	// queueTimeout is the longest a place in a queue lasts; longPlaces is the control that
	// ignores the waiter's lease (a place that outlives the TTL its waiter asked for).
	queueTimeout time.Duration
	longPlaces   bool
	restarts     int
}

// nameState is what the server keeps of one name.
type nameState struct {
	holders []holding // an exclusive holder alone, or shared ones; kept windows included
	last    uint64    // the last fence given: lost with a restart, like the name
	queue   []place
}

// holding is one holder's grant, with its tenure in the history.
type holding struct {
	token    string // "" while kept for a MinHold window
	shared   bool
	fence    uint64
	expires  time.Time
	instance string
	value    string
	tenure   int // -1 for a kept window
}

// place is one waiter's place in a name's queue.
type place struct {
	token    string
	shared   bool
	limit    int
	ttl      time.Duration // the lease it asked for
	value    string
	length   time.Duration // how long a request keeps its place
	attempt  int           // the Request.Attempt that last refreshed it
	expires  time.Time
	instance string
}

func newServer(epoch time.Time, rate float64, queueTimeout time.Duration, longPlaces bool, hist *history) *server {
	return &server{
		epoch: epoch, rate: rate, names: make(map[string]*nameState), subs: make(map[*subscription]struct{}),
		hist: hist, queueTimeout: queueTimeout, longPlaces: longPlaces,
	}
}

// clock returns the server's time now.
func (s *server) clock() time.Time {
	d := time.Since(s.epoch)
	return s.epoch.Add(d + time.Duration(float64(d)*s.rate))
}

// simTime converts a time of the server's clock to simulated time.
func (s *server) simTime(t time.Time) time.Time {
	d := t.Sub(s.epoch)
	return s.epoch.Add(time.Duration(float64(d) / (1 + s.rate)))
}

// state returns name's state, ending the tenures of holders whose lease ran out. s.mu must be
// held.
func (s *server) state(name string, now time.Time) *nameState {
	n := s.names[name]
	if n == nil {
		n = &nameState{}
		s.names[name] = n
	}
	n.holders = slices.DeleteFunc(n.holders, func(h holding) bool {
		if now.Before(h.expires) {
			return false
		}
		s.endTenure(&h, s.simTime(h.expires), endExpired)
		return true
	})
	return n
}

// endTenure closes h's tenure in the history at simulated time at. s.mu must be held.
func (s *server) endTenure(h *holding, at time.Time, why endReason) {
	if h.tenure >= 0 {
		s.hist.endTenure(h.tenure, at, why)
		h.tenure = -1
	}
}

// holder returns the holder with token, or nil.
func (n *nameState) holder(token string) *holding {
	for i := range n.holders {
		if n.holders[i].token == token && token != "" {
			return &n.holders[i]
		}
	}
	return nil
}

// fits reports whether a request of that mode and limit could hold the name beside its
// holders.
func (n *nameState) fits(shared bool, limit int) bool {
	if !shared {
		return len(n.holders) == 0
	}
	for _, h := range n.holders {
		if !h.shared {
			return false
		}
	}
	return limit <= 0 || len(n.holders) < limit
}

// until returns how long the name stays unavailable to a request of that mode and limit.
func (n *nameState) until(shared bool, limit int, now time.Time) time.Duration {
	var last, first time.Duration
	for i, h := range n.holders {
		left := h.expires.Sub(now)
		if !h.shared && shared {
			return max(left, time.Millisecond)
		}
		last = max(last, left)
		if i == 0 || left < first {
			first = left
		}
	}
	switch {
	case !shared && len(n.holders) > 0:
		return max(last, time.Millisecond)
	case shared && limit > 0 && len(n.holders) >= limit:
		return max(first, time.Millisecond)
	}
	return 0
}

// grant gives name to token for ttl and returns the fence: above the last one, and at least
// the server's clock in microseconds, which survives a restart. s.mu must be held.
func (s *server) grant(name string, n *nameState, token, instance, value string, shared bool, ttl time.Duration, now time.Time, handedOver bool) uint64 {
	fence := max(n.last+1, uint64(now.UnixMicro()))
	n.last = fence
	n.holders = append(n.holders, holding{token: token, shared: shared, fence: fence, expires: now.Add(ttl),
		instance: instance, value: value, tenure: s.hist.startTenure(name, token, fence, s.simTime(now), handedOver)})
	return fence
}

// inspect reports the newest holder of name.
func (s *server) inspect(name string) guard.LockInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	n := s.state(name, now)
	info := guard.LockInfo{Name: name, Waiting: len(n.queue)}
	for _, h := range n.holders {
		if h.fence > info.Fence {
			info = guard.LockInfo{Name: name, Held: true, Kept: h.token == "", Fence: h.fence, Instance: h.instance,
				Value: h.value, Shared: h.shared, Holders: len(n.holders), Remaining: h.expires.Sub(now),
				AcquiredAt: h.expires, Waiting: len(n.queue)}
		}
	}
	return info
}

// first returns the first waiter whose place has not lapsed, dropping those before it.
func (n *nameState) first(now time.Time) (place, bool) {
	for len(n.queue) > 0 && !now.Before(n.queue[0].expires) {
		n.queue = n.queue[1:]
	}
	if len(n.queue) == 0 {
		return place{}, false
	}
	return n.queue[0], true
}

func (n *nameState) leave(token string) bool {
	i := slices.IndexFunc(n.queue, func(p place) bool { return p.token == token })
	if i < 0 {
		return false
	}
	n.queue = slices.Delete(n.queue, i, i+1)
	return true
}

// acquire is acquire.lua.
func (s *server) acquire(r guard.Request) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	return s.try(s.state(r.Name, now), r, now, true)
}

// try makes one attempt for r: it grants it, or returns its busy answer after queueing it
// (when queue is set and r.Wait). s.mu must be held.
func (s *server) try(n *nameState, r guard.Request, now time.Time, queue bool) (uint64, error) {
	fence, err := s.try1(n, r, now, queue)
	s.hist.log(s.simTime(now), r.Name, r.Token, func() []string {
		var q []string
		for _, p := range n.queue {
			q = append(q, p.token)
		}
		return q
	}, func() string {
		var q strings.Builder
		for _, p := range n.queue {
			fmt.Fprintf(&q, " %.6s@%v", p.token, p.expires.Sub(now).Round(time.Millisecond))
		}
		return fmt.Sprintf("acquire %s %.6s wait=%t attempt=%d ttl=%v → %d %v; queue:%s", r.Instance, r.Token, r.Wait, r.Attempt, r.TTL, fence, err, q.String())
	})
	return fence, err
}

// try1 is try without the trail.
func (s *server) try1(n *nameState, r guard.Request, now time.Time, queue bool) (uint64, error) {
	if h := n.holder(r.Token); h != nil {
		h.expires = now.Add(r.TTL)
		return h.fence, nil
	}
	head, queued := n.first(now)
	if n.fits(r.Shared, r.Limit) && (!queued || head.token == r.Token) {
		n.leave(r.Token)
		return s.grant(r.Name, n, r.Token, r.Instance, r.Value, r.Shared, r.TTL, now, false), nil
	}
	busy := &guard.BusyError{Name: r.Name, Remaining: n.until(r.Shared, r.Limit, now)}
	if busy.Remaining == 0 && queued {
		busy.Remaining = max(head.expires.Sub(now), time.Millisecond)
	}
	if r.Wait && queue {
		length := watchdog.Place(s.queueTimeout, r.TTL)
		if s.longPlaces {
			length = s.queueTimeout
		}
		p := place{token: r.Token, shared: r.Shared, limit: r.Limit, ttl: r.TTL, value: r.Value, length: length,
			expires: now.Add(length), instance: r.Instance, attempt: r.Attempt}
		if i := slices.IndexFunc(n.queue, func(q place) bool { return q.token == r.Token }); i >= 0 {
			n.queue[i] = p
		} else {
			n.queue = append(n.queue, p)
		}
		busy.Queued = length
	}
	return 0, busy
}

// acquireAll is a Batcher's AcquireAll: every request granted, or none.
func (s *server) acquireAll(reqs []guard.Request) ([]uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	for _, r := range reqs {
		n := s.state(r.Name, now)
		if n.holder(r.Token) != nil {
			continue
		}
		head, queued := n.first(now)
		if !n.fits(r.Shared, r.Limit) || queued && head.token != r.Token {
			_, err := s.try(n, guard.Request{Name: r.Name, Token: r.Token, Shared: r.Shared, Limit: r.Limit}, now, false)
			return nil, err
		}
	}
	fences := make([]uint64, len(reqs))
	for i, r := range reqs {
		fences[i], _ = s.try(s.state(r.Name, now), r, now, false)
	}
	return fences, nil
}

// extend is extend.lua, for each lease.
func (s *server) extend(leases []guard.Lease) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	errs := make([]error, len(leases))
	for i, l := range leases {
		h := s.state(l.Name, now).holder(l.Token)
		if h == nil {
			errs[i] = guard.ErrNotHeld
			continue
		}
		h.expires = now.Add(l.TTL)
	}
	return errs
}

// release is release.lua.
func (s *server) release(name, token string, keep time.Duration) error {
	s.mu.Lock()
	now := s.clock()
	s.hist.log(s.simTime(now), name, token, nil, func() string { return fmt.Sprintf("release %.6s keep %v", token, keep) })
	n := s.state(name, now)
	h := n.holder(token)
	if h == nil {
		if n.leave(token) {
			s.handOver(name, n, "", now) // a waiter gave up: the next ones may fit now
			return guard.ErrNotHeld
		}
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	s.endTenure(h, s.simTime(now), endReleased)
	if keep > 0 {
		h.token, h.expires = "", now.Add(keep)
		s.hist.keep(name, s.simTime(now), s.simTime(h.expires))
		s.publish([]guard.Notice{{Name: name, Token: token}})
		return nil
	}
	n.holders = slices.DeleteFunc(n.holders, func(x holding) bool { return x.token == token })
	s.handOver(name, n, token, now)
	return nil
}

// force is an operator's ForceRelease of every holder of name.
func (s *server) force(name string) error {
	s.mu.Lock()
	now := s.clock()
	n := s.state(name, now)
	if len(n.holders) == 0 {
		s.mu.Unlock()
		return guard.ErrNotHeld
	}
	for i := range n.holders {
		s.endTenure(&n.holders[i], s.simTime(now), endForced)
	}
	n.holders = nil
	s.handOver(name, n, "", now)
	return nil
}

// handOver gives what is free of the name to its first live waiters while they fit, and tells
// the subscriptions; it lets go of s.mu, which must be held.
func (s *server) handOver(name string, n *nameState, released string, now time.Time) {
	var notices []guard.Notice
	for {
		w, ok := n.first(now)
		if !ok || !n.fits(w.shared, w.limit) {
			break
		}
		n.leave(w.token)
		lease := min(w.ttl, w.length)
		fence := s.grant(name, n, w.token, w.instance, w.value, w.shared, lease, now, true)
		notices = append(notices, guard.Notice{Name: name, Token: released, Next: w.token, Fence: fence, Lease: lease, Attempt: w.attempt})
		s.hist.log(s.simTime(now), name, w.token, nil, func() string { return fmt.Sprintf("hand over to %s %.6s", w.instance, w.token) })
	}
	if len(notices) == 0 {
		notices = append(notices, guard.Notice{Name: name, Token: released})
	}
	s.publish(notices)
}

// restart loses every name, as a server restarted without persistence does.
func (s *server) restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	at := s.simTime(now)
	for _, n := range s.names {
		for i := range n.holders {
			h := &n.holders[i]
			if !now.Before(h.expires) {
				s.endTenure(h, s.simTime(h.expires), endExpired)
			}
			s.endTenure(h, at, endRestart)
		}
	}
	s.names = make(map[string]*nameState)
	s.restarts++
	s.hist.restart(at)
}

// publish sends the notices to the subscriptions that watch their name, after letting go of
// s.mu, which must be held.
func (s *server) publish(notices []guard.Notice) {
	type send struct {
		sub *subscription
		n   guard.Notice
	}
	var sends []send
	for _, n := range notices {
		for sub := range s.subs {
			if sub.watches(n.Name) {
				sends = append(sends, send{sub, n})
			}
		}
	}
	s.mu.Unlock()
	for _, x := range sends {
		x.sub.deliver(x.n)
	}
}

// finish ends, at simulated time at, the tenures still open: by their expiry if it came.
func (s *server) finish(at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	for _, n := range s.names {
		for i := range n.holders {
			h := &n.holders[i]
			if !now.Before(h.expires) {
				s.endTenure(h, s.simTime(h.expires), endExpired)
			} else {
				s.endTenure(h, at, endOpen)
			}
		}
	}
}

// ownsInstance reports whether the server keeps anything of the process inst — a lease, or a
// place in a queue that has not lapsed — and for which name.
func (s *server) ownsInstance(inst string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	for name := range s.names {
		n := s.state(name, now)
		for _, h := range n.holders {
			if h.token != "" && h.instance == inst {
				return name, true
			}
		}
		for _, p := range n.queue {
			if now.Before(p.expires) && p.instance == inst {
				return name, true
			}
		}
	}
	return "", false
}
