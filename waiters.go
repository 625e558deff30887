package guard

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// waiters is a Guard's registry of the callers that wait for names: who waits for what, in
// which order a wake-up goes to them, which names the Guard's one subscription watches, and to
// whom a backend's notice goes. acquire.go's per-call loop registers with it; it never blocks
// a caller.
//
// The watch of a name belongs to the registry, not to a caller: the first waiter asks for it,
// and the registry makes the Watch call on a goroutine of its own, bounded by watchTimeout and
// the Guard's life. A registering waiter waits for the Watch's answer within its own bounds,
// then attempts again (a release may have come before the watch was in place); one that gives
// up meanwhile decides nothing for the waiters after it. While no watch is confirmed, waiters
// re-try with a backoff; a Watch that failed is asked again by the next waiter that sleeps,
// after watchRetry, and when it succeeds the first sleeper is woken to attempt again. The last
// waiter to leave unwatches the name; Watch and Unwatch of a name are made one at a time, in
// the order they were asked for.
type waiters struct {
	g *Guard

	mu      sync.Mutex // protects names, byToken, seq, every queue, and the registry's fields of every waiter
	names   map[string]*queue
	count   atomic.Int32       // len(names), read without mu: a release with nobody waiting takes no lock
	byToken map[string]*waiter // the registered waiters, by token: hand-overs name them
	seq     uint64             // arrival order of waiters

	subMu   sync.Mutex // protects sub and subDone; held to open or close the subscription, never during a Watch
	sub     Subscription
	subDone bool
}

// Timings of watching.
const (
	// watchTimeout bounds a Watch: a subscription that cannot confirm one by then leaves its
	// waiters re-trying with the backoff.
	watchTimeout = 5 * time.Second
	// watchRetry is how long after a failed Watch the next waiter to sleep asks again.
	watchRetry = time.Second
)

// queue is a Guard's waiters for one name, and the state of the name's watch.
type queue struct {
	n        int       // waiters registered
	sleepers []*waiter // the waiters that a wake-up may go to, by arrival
	// The watch: want tells whether it should be on (someone waits), on whether the backend
	// confirmed it, syncing whether a Watch or Unwatch of the name is out.
	want, on, syncing bool
	failedAt          time.Time     // when the last Watch failed
	ready             chan struct{} // non-nil while a Watch is out; closed when it returns
	// echo is the token of this Guard's last release of the name that woke a waiter here:
	// the backend's notice of that release is skipped.
	echo string
	// fair is set once the backend queued one of the waiters (BusyError.Queued): it hands a
	// freed name over itself, and a release here wakes nobody.
	fair bool
	// recheck wakes the first sleeper when a lease the backend handed to another waiter could
	// run out, if it would sleep past that.
	recheck *time.Timer
}

// waiter is what the registry knows of one waiting acquisition.
type waiter struct {
	name  string
	token string        // the acquisition's current token; changed only under waiters.mu
	seq   uint64        // arrival order among the Guard's waiters
	q     *queue        // nil until registered
	wake  chan struct{} // a wake-up is handed over here; one at most
	until time.Time     // when its sleep ends, if it is not woken
	// A hand-over from the backend, set by a notice.
	handed  bool
	fence   uint64
	attempt int // Notice.Attempt
}

func (r *waiters) init(g *Guard) {
	r.g = g
	r.names = make(map[string]*queue)
	r.byToken = make(map[string]*waiter)
}

// register makes w a waiter for its name and has the name watched. It returns a channel that
// is closed when the Watch that is out for the name returns, or nil when none is out.
func (r *waiters) register(w *waiter) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queueOf(w.name)
	r.add(w, q)
	return q.ready
}

// join registers w before its first attempt when the Guard watches its name already: notices
// and hand-overs for it will come, so it needs no attempt after registering. It reports
// whether it did.
func (r *waiters) join(w *waiter) bool {
	if r.count.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.names[w.name]
	if q == nil || !q.on || !q.want {
		return false
	}
	r.add(w, q)
	return true
}

// queueOf returns the queue of name, made when nobody waits for it yet. r.mu must be held.
func (r *waiters) queueOf(name string) *queue {
	q := r.names[name]
	if q == nil {
		q = &queue{}
		r.names[name] = q
		r.count.Add(1)
	}
	return q
}

// add registers w in q. r.mu must be held.
func (r *waiters) add(w *waiter, q *queue) {
	q.n++
	r.seq++
	w.seq, w.q = r.seq, q
	w.wake = make(chan struct{}, 1)
	r.byToken[w.token] = w
	q.want = true
	r.sync(w.name, q)
}

// unregister takes w out of the waiters for its name; the last one has the name unwatched.
func (r *waiters) unregister(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := w.q
	if r.byToken[w.token] == w {
		delete(r.byToken, w.token)
	}
	q.remove(w)
	w.q = nil
	if q.n--; q.n > 0 {
		return
	}
	q.want = false
	r.sync(w.name, q)
}

// sync starts making the name's watch what q wants, unless that is under way or done, and
// forgets q when nobody waits and nothing is watched. r.mu must be held.
func (r *waiters) sync(name string, q *queue) {
	switch {
	case q.syncing:
	case q.want && !q.on:
		if !q.failedAt.IsZero() && time.Since(q.failedAt) < watchRetry {
			return // waiters poll meanwhile; one that sleeps later asks again
		}
		if q.syncing = r.g.spawn(func() { r.syncLoop(name, q) }); q.syncing {
			q.ready = make(chan struct{})
		}
	case !q.want && q.on:
		// Once the Guard closes, its subscription goes, and with it every watch.
		q.syncing = r.g.spawn(func() { r.syncLoop(name, q) })
	case !q.want && q.n == 0:
		r.forget(name, q)
	}
}

// syncLoop makes the Watch and Unwatch calls of name, one at a time, until the watch is what
// q wants or a Watch fails.
func (r *waiters) syncLoop(name string, q *queue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for q.want != q.on {
		want := q.want
		if want && q.ready == nil {
			q.ready = make(chan struct{})
		}
		r.mu.Unlock()
		ok := true
		if want {
			ok = r.watch(name)
		} else {
			r.unwatch(name)
		}
		r.mu.Lock()
		if want {
			close(q.ready)
			q.ready = nil
		}
		if !ok {
			q.failedAt = time.Now()
			break
		}
		q.on = want
		if want {
			q.failedAt = time.Time{}
			// A release may have come before the watch was in place.
			q.wakeFirst()
		}
	}
	q.syncing = false
	if !q.want && q.n == 0 && !q.on {
		r.forget(name, q)
	}
}

// forget drops q, which nobody waits on and nothing watches. r.mu must be held.
func (r *waiters) forget(name string, q *queue) {
	if q.recheck != nil {
		q.recheck.Stop()
	}
	delete(r.names, name)
	r.count.Add(-1)
}

// watch asks the backend to report releases of name, and reports whether it will. It gives
// up when the Guard closes or watchTimeout passes.
func (r *waiters) watch(name string) bool {
	if r.g.notifier == nil {
		return false
	}
	r.subMu.Lock()
	if r.sub == nil && !r.subDone {
		if sub, err := r.g.notifier.Subscribe(r.notice); err == nil {
			r.sub = sub
		}
	}
	sub := r.sub
	r.subMu.Unlock()
	if sub == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(r.g.life, watchTimeout)
	defer cancel()
	return sub.Watch(ctx, name) == nil
}

// unwatch stops the reports of releases of name.
func (r *waiters) unwatch(name string) {
	r.subMu.Lock()
	sub := r.sub
	r.subMu.Unlock()
	if sub != nil {
		sub.Unwatch(name)
	}
}

// closeSubscription closes the Guard's subscription, if it has one, and keeps it from opening
// another.
func (r *waiters) closeSubscription() error {
	r.subMu.Lock()
	sub := r.sub
	r.sub, r.subDone = nil, true
	r.subMu.Unlock()
	if sub == nil {
		return nil
	}
	if err := sub.Close(); err != nil {
		return fmt.Errorf("guard: close subscription: %w", err)
	}
	return nil
}

// sleeping puts w among the waiters a wake-up may go to, at its arrival place, before an
// attempt or a sleep (until then, or zero), so that a release meanwhile still wakes it. It
// reports whether the name is watched, and asks again for a watch that failed a while ago.
func (r *waiters) sleeping(w *waiter, until time.Time) (watched bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.until = until
	q := w.q
	i, found := slices.BinarySearchFunc(q.sleepers, w.seq, func(x *waiter, seq uint64) int {
		return cmp.Compare(x.seq, seq)
	})
	if !found {
		q.sleepers = slices.Insert(q.sleepers, i, w)
	}
	if !q.on {
		r.sync(w.name, q)
	}
	return q.on
}

// watched reports whether the Guard's subscription watches w's name.
func (r *waiters) watched(w *waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.q.on
}

// markFair records that the backend queues the waiters of w's name.
func (r *waiters) markFair(w *waiter) {
	r.mu.Lock()
	w.q.fair = true
	r.mu.Unlock()
}

// retoken gives w a new token, for attempts after one whose lock is being given back.
func (r *waiters) retoken(w *waiter, token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byToken[w.token] == w {
		delete(r.byToken, w.token)
		r.byToken[token] = w
	}
	w.token = token
}

// handedOver reports the fence and the attempt of a hand-over to w, if one came, and forgets
// it.
func (r *waiters) handedOver(w *waiter) (uint64, int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !w.handed {
		return 0, 0, false
	}
	w.handed = false
	return w.fence, w.attempt, true
}

// notice is the subscription's callback: a name may have become free, or was handed over.
func (r *waiters) notice(n Notice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n.Next != "" {
		// Handed to one waiter, maybe of this Guard; everyone else sleeps on — but asks
		// again by the time the lease it was given could run out.
		if w := r.byToken[n.Next]; w != nil && w.name == n.Name {
			w.handed, w.fence, w.attempt = true, n.Fence, n.Attempt
			w.q.remove(w)
			w.signal()
		} else if q := r.names[n.Name]; q != nil && n.Lease > 0 {
			r.recheckAt(n.Name, q, time.Now().Add(n.Lease))
		}
		return
	}
	q := r.names[n.Name]
	if q == nil {
		return
	}
	if n.Token != "" && n.Token == q.echo {
		q.echo = "" // our own release, whose waiter we woke already
		return
	}
	if q.fair {
		// The backend hands a freed name over itself: a notice without a hand-over means
		// that the name is kept for the rest of a MinHold window, or that something may have
		// changed. Every waiter asks, to learn when its turn can come: the first of the
		// backend's queue may be any of them.
		q.wakeAll()
		return
	}
	q.wakeFirst()
}

// releasing is called before this Guard releases token's lock on name: the backend's notice of
// that release is to be skipped, because the Guard wakes one of its own waiters itself
// (released) — and a notice can arrive before the release returns.
func (r *waiters) releasing(name, token string) {
	if r.count.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.names[name]; q != nil && q.on {
		q.echo = token
	}
}

// released wakes waiters of this Guard after this Guard released name. A release that frees
// the name wakes one unless the backend queues waiters (it handed the name over itself, to
// whoever came first); one that keeps the name for the rest of a MinHold window wakes waiters
// to learn when the window ends: all of them where the backend queues them (see notice).
func (r *waiters) released(name string, kept bool) {
	if r.count.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch q := r.names[name]; {
	case q == nil:
	case kept && q.fair:
		q.wakeAll() // as for a kept window's notice: see notice
	case kept || !q.fair:
		q.wakeFirst()
	}
}

// wakeNext wakes the first waiter for name: one that was woken left without the lock.
func (r *waiters) wakeNext(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.names[name]; q != nil {
		q.wakeFirst()
	}
}

// recheckAt wakes the first sleeper of q at t, unless it wakes by then anyway. r.mu must be
// held.
func (r *waiters) recheckAt(name string, q *queue, t time.Time) {
	if len(q.sleepers) == 0 || !q.sleepers[0].until.After(t) {
		return
	}
	if q.recheck != nil {
		q.recheck.Stop()
	}
	q.recheck = time.AfterFunc(time.Until(t), func() { r.wakeNext(name) })
}

// wakeFirst hands a wake-up to the first sleeper and takes it out of the sleepers. The
// registry's mu must be held.
func (q *queue) wakeFirst() {
	if len(q.sleepers) == 0 {
		return
	}
	w := q.sleepers[0]
	q.sleepers = slices.Delete(q.sleepers, 0, 1)
	w.signal()
}

// wakeAll wakes every sleeper. The registry's mu must be held.
func (q *queue) wakeAll() {
	for _, w := range q.sleepers {
		w.signal()
	}
	q.sleepers = q.sleepers[:0]
}

// remove takes w out of the sleepers. The registry's mu must be held.
func (q *queue) remove(w *waiter) {
	if i := slices.Index(q.sleepers, w); i >= 0 {
		q.sleepers = slices.Delete(q.sleepers, i, i+1)
	}
}

// signal hands w a wake-up, unless it has one it has not taken yet.
func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
