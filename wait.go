package guard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/guardlock/guard/watchdog"
)

// Waiting for a lock follows one protocol, in wait:
//
//  1. Attempt. Granted: done. Busy with a single attempt allowed: done, busy. A backend
//     failure: done, with the error — and, because the request may have taken the lock all
//     the same (its reply was lost, or came too late), a clean-up release of its token.
//  2. The first busy answer registers the caller as a waiter for the name: the Guard's
//     subscription watches it from then on. Attempt again at once: the holder may have
//     released the name before the watch was in place.
//  3. Busy again: sleep until woken — by a release on this Guard or a backend's notice —
//     until the holder's lease would run out (a crashed holder never releases), or for a
//     backoff when no notices come; then attempt again. The wait ends with the caller's
//     context, WaitTime, or Close.
//
// A Guard's waiters for one name queue in arrival order, and a wake-up goes to the first of
// them only: one attempt can win, and the others would each spend a round trip to learn that.
// A woken waiter that finds the lock taken keeps its place at the front, and one that leaves
// without the lock passes its wake-up on.

// Timings of waiting.
const (
	firstBackoff = 10 * time.Millisecond // the first re-try when no notice will come
	maxBackoff   = time.Second           // the backoff doubles up to this
	// watchTimeout bounds a Watch: a subscription that cannot confirm one by then leaves
	// its waiters re-trying with the backoff.
	watchTimeout = 5 * time.Second
)

// errLateGrant is the cause of an acquisition whose grant arrived after the lease it set.
var errLateGrant = errors.New("the backend's answer came after the lease it granted could have ended")

// waiting is the state of a Guard's waiting callers.
type waiting struct {
	wmu     sync.Mutex // protects waiters, seq, and the n, queue, echo and gone fields of each list; never held while calling out
	waiters map[string]*waitList
	seq     uint64 // arrival order of waiters

	subMu   sync.Mutex // protects sub and subDone; held to open or close the subscription, never during a Watch
	sub     Subscription
	subDone bool
}

// waitList is the set of callers of one Guard waiting for one name. The first waiter asks the
// subscription to watch the name; the last one to leave unwatches it. A list stays in the map
// while it is being unwatched (gone is then set), so that a new first waiter's Watch is always
// sent after the old Unwatch.
type waitList struct {
	n     int       // waiters registered
	queue []*waiter // the sleeping waiters and those with an attempt out, by arrival
	// ready is closed once the first waiter's Watch has returned; watched tells whether it
	// succeeded (notices will arrive) and is read only after ready.
	ready   chan struct{}
	watched bool
	// echo is the token of this Guard's last release of the name that woke a waiter here:
	// the backend's notice of that release is skipped.
	echo string
	gone chan struct{} // non-nil once the last waiter left; closed when Unwatch was sent
}

// waiter is one acquisition that may have to wait.
type waiter struct {
	g       *Guard
	a       *Acquisition
	s       *lockSettings
	ttl     time.Duration
	renewed bool      // no LeaseTime: the watchdog holds the lock
	token   string    // the same for every attempt, so that a retried request finds its own lock
	giveUp  time.Time // zero: no WaitTime

	list    *waitList     // nil until the first busy answer
	seq     uint64        // arrival order among the Guard's waiters
	wake    chan struct{} // a wake-up is handed over here; one at most
	woken   bool          // a wake-up was taken and no attempt has answered since
	backoff time.Duration
}

// wait runs the attempts of one acquisition and sets a.Outcome.
func (g *Guard) wait(ctx context.Context, a *Acquisition, s *lockSettings) (*Lock, error) {
	w := &waiter{g: g, a: a, s: s, ttl: s.leaseTime, token: rand.Text(), backoff: firstBackoff}
	if w.ttl == 0 {
		w.ttl, w.renewed = g.watchdogTTL, true
	}
	if s.waitTime > 0 {
		w.giveUp = a.Started.Add(s.waitTime)
	}
	defer w.leave()
	for {
		if ctx.Err() != nil {
			a.Outcome = OutcomeCanceled
			return nil, canceled(a.Name, ctx)
		}
		l, busy, err := w.attempt(ctx)
		switch {
		case l != nil:
			a.Outcome = OutcomeAcquired
			return l, nil
		case err != nil:
			return nil, err
		case s.waitTime == 0:
			a.Outcome = OutcomeBusy
			return nil, busy
		case w.list == nil:
			if err := w.register(ctx); err != nil {
				return nil, err
			}
			continue // at once: the holder may have released before the watch was in place
		}
		if err := w.sleep(ctx, busy); err != nil {
			return nil, err
		}
	}
}

// attempt sends one acquire request. It returns the lock, or the busy answer, or an error
// that ends the acquisition (a.Outcome is then set).
func (w *waiter) attempt(ctx context.Context) (*Lock, *BusyError, error) {
	g, name := w.g, w.a.Name
	if w.list != nil {
		// Queue before the attempt, so that a release while it is out still wakes us.
		g.enqueue(w)
	}
	start := time.Now()
	w.a.Attempts++
	fence, err := g.backend.Acquire(ctx, Request{
		Name: name, Token: w.token, TTL: w.ttl, Instance: g.instance, Label: w.s.label,
	})
	if err == nil {
		w.woken = false
		answered := time.Now()
		if answered.Before(watchdog.Deadline(start, w.ttl)) {
			return &Lock{
				g: g, name: name, token: w.token, label: w.s.label, fence: fence,
				ttl: w.ttl, renewed: w.renewed, minHold: w.s.minHold,
				start: start, heldAt: answered, prev: innermost(ctx),
			}, nil, nil
		}
		// The grant came so late that its lease could have ended: someone else may hold the
		// name by now. Give it back, and try again under a new token.
		g.cleanup(name, w.token)
		w.token = rand.Text()
		if w.s.waitTime == 0 {
			w.a.Outcome = OutcomeError
			return nil, nil, &OpError{Op: "acquire", Name: name, Err: errLateGrant}
		}
		return nil, &BusyError{Name: name}, nil
	}
	var busy *BusyError
	if errors.As(err, &busy) {
		w.woken = false // the wake-up is used: someone else holds the lock, and its release wakes us
		return nil, busy, nil
	}
	// The request may have reached the backend and taken the lock although we got no answer.
	// A wake-up that this attempt did not use is passed on when we leave.
	g.cleanup(name, w.token)
	if ctx.Err() != nil {
		w.a.Outcome = OutcomeCanceled
		return nil, nil, canceled(name, ctx)
	}
	w.a.Outcome = OutcomeError
	return nil, nil, &OpError{Op: "acquire", Name: name, Err: err}
}

// register makes w a waiter for its name, within its WaitTime.
func (w *waiter) register(ctx context.Context) error {
	rctx := ctx
	if !w.giveUp.IsZero() {
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(ctx, w.giveUp)
		defer cancel()
	}
	w.wake = make(chan struct{}, 1)
	err := w.g.register(rctx, w)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrClosed):
		w.a.Outcome = OutcomeError
		return err
	case ctx.Err() != nil:
		w.a.Outcome = OutcomeCanceled
		return canceled(w.a.Name, ctx)
	default: // WaitTime ran out while the watch was being set up
		w.a.Outcome = OutcomeTimeout
		return &BusyError{Name: w.a.Name, Waited: time.Since(w.a.Started)}
	}
}

// sleep waits until w is woken or should try again. It returns an error, and sets a.Outcome,
// when the wait is over.
func (w *waiter) sleep(ctx context.Context, busy *BusyError) error {
	d := w.delay(busy)
	if !w.giveUp.IsZero() {
		left := time.Until(w.giveUp)
		if left <= 0 {
			w.a.Outcome = OutcomeTimeout
			return &BusyError{Name: w.a.Name, Remaining: busy.Remaining, Waited: time.Since(w.a.Started)}
		}
		d = min(d, left)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
		w.a.Wakeups++
		w.woken = true
	case <-t.C:
	case <-ctx.Done(): // the loop says why
	case <-w.g.life.Done():
		w.a.Outcome = OutcomeError
		return ErrClosed
	}
	return nil
}

// delay returns how long to sleep after busy: until the holder's lease would run out, when a
// release will be announced; otherwise a jittered backoff, never past the holder's expiry.
func (w *waiter) delay(busy *BusyError) time.Duration {
	d := busy.Remaining
	if d <= 0 || !w.list.watched {
		d = jitter(w.backoff, d)
		w.backoff = min(2*w.backoff, maxBackoff)
		return d
	}
	// A little jitter, so that many waiters do not hit the backend in step.
	return d + time.Duration(mrand.Int64N(int64(d/50)+int64(time.Millisecond)))
}

// jitter returns a delay between half of and all of backoff, but no later than limit when
// limit is positive.
func jitter(backoff, limit time.Duration) time.Duration {
	d := backoff/2 + time.Duration(mrand.Int64N(int64(backoff/2)+1))
	if limit > 0 {
		d = min(d, limit)
	}
	return d
}

// leave takes w out of its name's waiters when the acquisition ends.
func (w *waiter) leave() {
	if w.list == nil {
		return
	}
	g := w.g
	g.dequeue(w)
	if w.a.Outcome != OutcomeAcquired && (w.woken || len(w.wake) > 0) {
		// A release woke us, but we leave without the lock: wake the next waiter instead,
		// or it would sleep until its fallback.
		g.wake(w.a.Name)
	}
	g.unregister(w.a.Name)
}

// register adds w to the waiters for its name and makes sure the Guard's subscription watches
// the name.
func (g *Guard) register(ctx context.Context, w *waiter) error {
	name := w.a.Name
	for {
		g.wmu.Lock()
		wl := g.waiters[name]
		if wl != nil && wl.gone != nil {
			// The last waiter is unwatching the name: watch it again only after that.
			gone := wl.gone
			g.wmu.Unlock()
			select {
			case <-gone:
				continue
			case <-ctx.Done():
				return ctx.Err()
			case <-g.life.Done():
				return ErrClosed
			}
		}
		first := wl == nil
		if first {
			wl = &waitList{ready: make(chan struct{})}
			g.waiters[name] = wl
		}
		wl.n++
		g.seq++
		w.seq, w.list = g.seq, wl
		g.wmu.Unlock()

		if first {
			wl.watched = g.watch(ctx, name)
			close(wl.ready)
			return nil
		}
		select {
		case <-wl.ready:
			return nil
		case <-ctx.Done():
			w.list = nil
			g.unregister(name)
			return ctx.Err()
		case <-g.life.Done():
			w.list = nil
			g.unregister(name)
			return ErrClosed
		}
	}
}

// watch asks the backend to report releases of name; it reports whether it will. It gives up
// when ctx ends, the Guard closes, or watchTimeout passes.
func (g *Guard) watch(ctx context.Context, name string) bool {
	if g.notifier == nil {
		return false
	}
	g.subMu.Lock()
	if g.sub == nil && !g.subDone {
		if sub, err := g.notifier.Subscribe(g.notice); err == nil {
			g.sub = sub
		}
	}
	sub := g.sub
	g.subMu.Unlock()
	if sub == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, watchTimeout)
	defer cancel()
	stop := context.AfterFunc(g.life, cancel)
	defer stop()
	return sub.Watch(ctx, name) == nil
}

// unregister removes a waiter for name; the last one unwatches the name.
func (g *Guard) unregister(name string) {
	g.wmu.Lock()
	wl := g.waiters[name]
	wl.n--
	if wl.n > 0 {
		g.wmu.Unlock()
		return
	}
	// The last waiter: the first one's Watch has returned (it is counted until then).
	wl.gone = make(chan struct{})
	g.wmu.Unlock()

	if wl.watched {
		g.subMu.Lock()
		sub := g.sub
		g.subMu.Unlock()
		if sub != nil {
			sub.Unwatch(name)
		}
	}
	g.wmu.Lock()
	delete(g.waiters, name)
	g.wmu.Unlock()
	close(wl.gone)
}

// closeSubscription closes the Guard's subscription, if it has one, and keeps it from opening
// another.
func (g *Guard) closeSubscription() error {
	g.subMu.Lock()
	sub := g.sub
	g.sub, g.subDone = nil, true
	g.subMu.Unlock()
	if sub == nil {
		return nil
	}
	if err := sub.Close(); err != nil {
		return fmt.Errorf("guard: close subscription: %w", err)
	}
	return nil
}

// enqueue puts w in its list's queue at its arrival place, unless it is queued.
func (g *Guard) enqueue(w *waiter) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	q := w.list.queue
	i, found := slices.BinarySearchFunc(q, w.seq, func(x *waiter, seq uint64) int {
		return cmpUint(x.seq, seq)
	})
	if !found {
		w.list.queue = slices.Insert(q, i, w)
	}
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// dequeue takes w out of its list's queue.
func (g *Guard) dequeue(w *waiter) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if i := slices.Index(w.list.queue, w); i >= 0 {
		w.list.queue = slices.Delete(w.list.queue, i, i+1)
	}
}

// notice is the subscription's callback: a name may have become free.
func (g *Guard) notice(n Notice) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	wl := g.waiters[n.Name]
	if wl == nil {
		return
	}
	if n.Token != "" && n.Token == wl.echo {
		wl.echo = "" // our own release, whose waiter we woke already
		return
	}
	wl.wakeFirst()
}

// expectEcho is called before this Guard releases token's lock on name: the backend's notice
// of that release is to be skipped, because the Guard wakes one of its own waiters itself
// (wake, once the release succeeded) — and a notice can arrive before the release returns.
func (g *Guard) expectEcho(name, token string) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	wl := g.waiters[name]
	if wl == nil {
		return
	}
	select {
	case <-wl.ready:
		if wl.watched {
			wl.echo = token
		}
	default: // the Watch is not in place yet: no notice will come
	}
}

// wake wakes the waiter of this Guard that has waited longest for name.
func (g *Guard) wake(name string) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if wl := g.waiters[name]; wl != nil {
		wl.wakeFirst()
	}
}

// wakeFirst hands a wake-up to the first waiter of the queue and takes it out of the queue. The
// Guard's wmu must be held.
func (wl *waitList) wakeFirst() {
	if len(wl.queue) == 0 {
		return
	}
	w := wl.queue[0]
	wl.queue = slices.Delete(wl.queue, 0, 1)
	select {
	case w.wake <- struct{}{}:
	default: // it has a wake-up it has not taken yet
	}
}
