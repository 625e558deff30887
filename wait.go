package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
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
//
// A backend with a wait queue (Request.Wait) orders waiters across processes: it answers a
// waiter's busy attempt with its place (BusyError.Queued), and hands a freed name straight to
// the first waiter, telling its Guard in a Notice. The waiter then holds the lock without
// another request; its lease counts from its last request, which the backend ran before the
// hand-over. A waiter that already watches the name when it first asks (its Guard's
// subscription does, for another waiter) is registered before that request, so that no
// hand-over can come before the Guard knows whom it is for, and skips step 2's second attempt.
// A waiter that gives up leaves the backend's queue (an owner-checked release of its token,
// which also gives back a lock handed to it too late).

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
	wmu     sync.Mutex // protects waiters, byToken, seq, the n, queue, echo, fair and gone fields of each list, and each waiter's handed and fence; never held while calling out
	waiters map[string]*waitList
	lists   atomic.Int32       // len(waiters), read without wmu: a release with nobody waiting here takes no lock
	byToken map[string]*waiter // the registered waiters, by token: hand-overs name them
	seq     uint64             // arrival order of waiters

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
	// fair is set once the backend queued one of the waiters (BusyError.Queued): it hands the
	// name over itself, and a release here wakes nobody.
	fair bool
	gone chan struct{} // non-nil once the last waiter left; closed when Unwatch was sent
}

// waiter is one acquisition that may have to wait. One allocation holds all of its state,
// the Acquisition the observer sees included.
type waiter struct {
	g       *Guard
	a       Acquisition
	s       lockSettings
	ttl     time.Duration
	renewed bool      // no LeaseTime: the watchdog holds the lock
	token   string    // the same for every attempt, so that a retried request finds its own lock
	giveUp  time.Time // zero: no WaitTime

	list    *waitList     // nil until registered: before the first attempt, or after its busy answer
	seq     uint64        // arrival order among the Guard's waiters
	wake    chan struct{} // a wake-up is handed over here; one at most
	woken   bool          // a wake-up was taken and no attempt has answered since
	backoff time.Duration
	recheck bool          // attempt again at once after registering (step 2)
	sent    time.Time     // when the last attempt was sent
	queued  bool          // the backend queued us at least once
	place   time.Duration // the backend's last BusyError.Queued

	// A hand-over from the backend, set by the Guard's notice under wmu.
	handed bool
	fence  uint64
}

// start readies w, whose settings are resolved, to acquire name from now.
func (w *waiter) start(name string) {
	g, s := w.g, &w.s
	w.ttl, w.token, w.backoff, w.recheck = s.leaseTime, g.tokens.next(), firstBackoff, true
	w.a = Acquisition{Name: name, Label: s.label, Backend: g.backendName, MaxWait: s.waitTime, Started: time.Now()}
	if w.ttl == 0 {
		w.ttl, w.renewed = g.watchdogTTL, true
	}
	if s.waitTime > 0 {
		w.giveUp = w.a.Started.Add(s.waitTime)
	}
}

// wait runs the attempts of the acquisition and sets a.Outcome.
func (w *waiter) wait(ctx context.Context) (*Lock, error) {
	g, a, s := w.g, &w.a, &w.s
	if s.waitTime != 0 {
		g.join(w)
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
		}
		if w.list == nil {
			if err := w.register(ctx); err != nil {
				return nil, err
			}
		}
		if w.recheck {
			// At once: the holder may have released before the watch was in place.
			w.recheck = false
			continue
		}
		if l, err := w.sleep(ctx, busy); l != nil || err != nil {
			if l != nil {
				a.Outcome = OutcomeAcquired
			}
			return l, err
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
	if w.a.Attempts == 0 {
		w.sent = w.a.Started // read just before: one clock reading less on the common path
	} else {
		w.sent = time.Now()
	}
	w.a.Attempts++
	fence, err := g.backend.Acquire(ctx, Request{
		Name: name, Token: w.token, TTL: w.ttl, Instance: g.instance, Label: w.s.label,
		Wait: w.s.waitTime != 0,
	})
	if err == nil {
		w.woken = false
		answered := time.Now()
		if answered.Before(watchdog.Deadline(w.sent, w.ttl)) {
			return w.lock(ctx, fence, w.sent, answered, w.ttl), nil, nil
		}
		// The grant came so late that its lease could have ended: someone else may hold the
		// name by now. Give it back, and try again under a new token.
		g.cleanup(name, w.token)
		g.retoken(w, g.tokens.next())
		if w.s.waitTime == 0 {
			w.a.Outcome = OutcomeError
			return nil, nil, &OpError{Op: "acquire", Name: name, Err: errLateGrant}
		}
		return nil, &BusyError{Name: name}, nil
	}
	var busy *BusyError
	if errors.As(err, &busy) {
		w.woken = false // the wake-up is used: someone else holds the lock, and its release wakes us
		if busy.Queued > 0 {
			w.queued, w.place = true, busy.Queued
			if w.list != nil {
				g.markFair(w.list)
			}
		}
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

// lock returns the Lock of a grant: its lease of granted was set by a request sent at start,
// and its grant learned of at heldAt.
func (w *waiter) lock(ctx context.Context, fence uint64, start, heldAt time.Time, granted time.Duration) *Lock {
	return &Lock{
		g: w.g, name: w.a.Name, token: w.token, label: w.s.label, fence: fence,
		ttl: w.ttl, granted: granted, renewed: w.renewed, minHold: w.s.minHold,
		start: start, heldAt: heldAt, prev: innermost(ctx),
	}
}

// take turns a hand-over into the Lock, or reports that there is none after all. The backend
// set the lease when it handed the name over, after our last request was sent: counting from
// that request is safe, and good enough while it is recent. The lease is our TTL or our place
// in the queue, whichever is shorter; the watchdog claims the rest when a third of it has
// passed, unless the lock is released sooner. After a long wait it claims a full lease first,
// one round trip.
func (w *waiter) take(ctx context.Context, fence uint64) (*Lock, error) {
	now := time.Now()
	granted := w.ttl
	if w.place > 0 {
		granted = min(granted, w.place)
	}
	if now.Sub(w.sent) < granted/2 {
		return w.lock(ctx, fence, w.sent, now, granted), nil
	}
	w.a.Attempts++
	errs := w.g.backend.Extend(ctx, []Lease{{Name: w.a.Name, Token: w.token, TTL: w.ttl}})
	switch {
	case len(errs) == 1 && errs[0] == nil:
		return w.lock(ctx, fence, now, time.Now(), w.ttl), nil
	case len(errs) == 1 && errors.Is(errs[0], ErrNotHeld):
		return nil, nil // taken away meanwhile (a forced release): wait on
	}
	w.g.cleanup(w.a.Name, w.token)
	if ctx.Err() != nil {
		w.a.Outcome = OutcomeCanceled
		return nil, canceled(w.a.Name, ctx)
	}
	w.a.Outcome = OutcomeError
	err := fmt.Errorf("backend extended %d leases, asked 1", len(errs))
	if len(errs) == 1 {
		err = errs[0]
	}
	return nil, &OpError{Op: "acquire", Name: w.a.Name, Err: err}
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
		if w.queued {
			w.g.markFair(w.list)
		}
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

// sleep waits until w is woken or should try again. It returns the lock when the backend
// handed it over meanwhile, and an error, setting a.Outcome, when the wait is over.
func (w *waiter) sleep(ctx context.Context, busy *BusyError) (*Lock, error) {
	d := w.delay(busy)
	if !w.giveUp.IsZero() {
		left := time.Until(w.giveUp)
		if left <= 0 {
			w.a.Outcome = OutcomeTimeout
			return nil, &BusyError{Name: w.a.Name, Remaining: busy.Remaining, Waited: time.Since(w.a.Started), Queued: busy.Queued}
		}
		d = min(d, left)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
		w.a.Wakeups++
		w.woken = true
		if fence, ok := w.g.handedOver(w); ok {
			return w.take(ctx, fence)
		}
	case <-t.C:
	case <-ctx.Done(): // the loop says why
	case <-w.g.life.Done():
		w.a.Outcome = OutcomeError
		return nil, ErrClosed
	}
	return nil, nil
}

// delay returns how long to sleep after busy: until the holder's lease would run out, when a
// release will be announced; otherwise a jittered backoff, never past the holder's expiry.
//
// A queued waiter asks again before it loses its place, and, when the name is free but others
// come first, it sleeps until its turn is announced.
func (w *waiter) delay(busy *BusyError) time.Duration {
	d := busy.Remaining
	switch {
	case busy.Queued > 0 && w.list.watched:
		if d <= 0 {
			d = busy.Queued / 2
		}
	case d <= 0 || !w.list.watched:
		d = jitter(w.backoff, d)
		w.backoff = min(2*w.backoff, maxBackoff)
		if busy.Queued > 0 {
			d = min(d, busy.Queued/2)
		}
		return d
	}
	if busy.Queued > 0 {
		d = min(d, busy.Queued/2)
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
	g := w.g
	if w.queued && w.a.Outcome != OutcomeAcquired {
		// Out of the backend's queue, and give back a lock handed over too late.
		g.cleanup(w.a.Name, w.token)
	}
	if w.list == nil {
		return
	}
	g.dequeue(w)
	if w.a.Outcome != OutcomeAcquired && (w.woken || len(w.wake) > 0) {
		// A release woke us, but we leave without the lock: wake the next waiter instead,
		// or it would sleep until its fallback.
		g.wake(w.a.Name)
	}
	g.unregister(w)
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
			g.lists.Add(1)
		}
		wl.n++
		g.seq++
		w.seq, w.list = g.seq, wl
		g.byToken[w.token] = w
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
			g.unregister(w)
			w.list = nil
			return ctx.Err()
		case <-g.life.Done():
			g.unregister(w)
			w.list = nil
			return ErrClosed
		}
	}
}

// join registers w, before its first attempt, as a waiter for a name that the Guard's
// subscription watches already: notices and hand-overs for it will come, so it needs no
// second attempt after registering. It does nothing when nobody waits for the name here.
func (g *Guard) join(w *waiter) {
	if g.lists.Load() == 0 {
		return
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	wl := g.waiters[w.a.Name]
	if wl == nil || wl.gone != nil {
		return
	}
	select {
	case <-wl.ready:
	default:
		return // the Watch is not confirmed yet
	}
	if !wl.watched {
		return
	}
	wl.n++
	g.seq++
	w.seq, w.list, w.recheck = g.seq, wl, false
	w.wake = make(chan struct{}, 1)
	g.byToken[w.token] = w
}

// retoken gives w a new token, for attempts after one whose lock is being given back.
func (g *Guard) retoken(w *waiter, token string) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.byToken[w.token] == w {
		delete(g.byToken, w.token)
		g.byToken[token] = w
	}
	w.token = token
}

// markFair records that the backend queues the waiters of wl.
func (g *Guard) markFair(wl *waitList) {
	g.wmu.Lock()
	wl.fair = true
	g.wmu.Unlock()
}

// handedOver reports the fence of a hand-over to w, if one came, and forgets it.
func (g *Guard) handedOver(w *waiter) (uint64, bool) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if !w.handed {
		return 0, false
	}
	w.handed = false
	return w.fence, true
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

// unregister removes w from the waiters for its name; the last one unwatches the name.
func (g *Guard) unregister(w *waiter) {
	name := w.a.Name
	g.wmu.Lock()
	if g.byToken[w.token] == w {
		delete(g.byToken, w.token)
	}
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
	g.lists.Add(-1)
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
		return cmp.Compare(x.seq, seq)
	})
	if !found {
		w.list.queue = slices.Insert(q, i, w)
	}
}

// dequeue takes w out of its list's queue.
func (g *Guard) dequeue(w *waiter) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	w.list.dequeue(w)
}

// dequeue takes w out of the queue. The Guard's wmu must be held.
func (wl *waitList) dequeue(w *waiter) {
	if i := slices.Index(wl.queue, w); i >= 0 {
		wl.queue = slices.Delete(wl.queue, i, i+1)
	}
}

// notice is the subscription's callback: a name may have become free, or was handed over.
func (g *Guard) notice(n Notice) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if n.Next != "" {
		// Handed to one waiter, maybe of this Guard; everyone else sleeps on.
		if w := g.byToken[n.Next]; w != nil && w.a.Name == n.Name {
			w.handed, w.fence = true, n.Fence
			w.list.dequeue(w)
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
		return
	}
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
	if g.lists.Load() == 0 {
		return
	}
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

// wakeAfterRelease wakes a waiter of this Guard after this Guard released name — unless the
// backend queues waiters: it handed the name over itself, to whoever came first.
func (g *Guard) wakeAfterRelease(name string) {
	if g.lists.Load() == 0 {
		return
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if wl := g.waiters[name]; wl != nil && !wl.fair {
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
