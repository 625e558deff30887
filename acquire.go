package guard

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/guardlock/guard/watchdog"
)

// An acquisition makes its attempts in one loop, acquisition.run, by this protocol:
//
//  1. Attempt. Granted: done. Busy with a single attempt allowed: done, busy. A backend
//     failure: done, with the error — and, because the request may have taken the lock all
//     the same (its reply was lost, or came too late), a clean-up release of its token.
//  2. After the first busy answer the caller registers as a waiter (waiters.go), and the
//     Guard's subscription comes to watch the name. Attempt again at once: the holder may have
//     released before the registration.
//  3. Busy again: sleep until woken — by a release on this Guard, a backend's notice or a
//     hand-over — until the holder's lease would run out (a crashed holder never releases),
//     before the caller's place in the backend's queue lapses, or for a backoff while no
//     notices come; then attempt again. The caller's context, WaitTime and Close end the wait.
//
// A Guard's waiters for one name are woken in arrival order, one at a time: one attempt can
// win, and the others would each spend a round trip to learn that. A woken waiter that finds
// the lock taken sleeps again; one that leaves without the lock passes its wake-up on.
//
// A backend with a wait queue (Request.Wait) orders waiters across processes: it answers a
// waiter's busy attempt with its place (BusyError.Queued, never longer than the lease the
// waiter asked for: watchdog.Place), and hands a freed name straight to the first waiter,
// telling its Guard in a Notice. The waiter then holds the lock without another request; its
// lease counts from its last request, which the backend ran before the hand-over. A waiter
// that arrives while its Guard watches the name already registers before its first request,
// so that no hand-over can come before the Guard knows whom it is for, and skips step 2's
// second attempt. A waiter that gives up leaves the backend's queue (an owner-checked release
// of its token, which also gives back a lock handed to it too late).
//
// How the acquisition ended (Acquisition.Outcome) is decided once, from what run returned.

// Timings of waiting.
const (
	firstBackoff = 10 * time.Millisecond // the first re-try when no notice will come
	maxBackoff   = time.Second           // the backoff doubles up to this
	// maxJitter bounds the jitter added to a sleep until a holder's lease runs out, so that
	// many waiters do not ask in the same instant: at most 2% of the sleep, and this.
	maxJitter = 10 * time.Millisecond
)

// errLateGrant is the cause of an acquisition whose grant arrived after the lease it set.
var errLateGrant = errors.New("the backend's answer came after the lease it granted could have ended")

// acquisition is one call to Acquire, TryAcquire or Do. One allocation holds all of its state,
// the Acquisition the observer sees and the registry's waiter included.
type acquisition struct {
	g       *Guard
	a       Acquisition
	s       lockSettings
	ttl     time.Duration
	renewed bool      // no LeaseTime: the watchdog holds the lock
	giveUp  time.Time // zero: no WaitTime
	w       waiter    // the registry's part; w.token is the same for every attempt

	backoff time.Duration
	sent    time.Time     // when the last attempt was sent
	asks    int           // acquire requests sent (Request.Attempt of the last one)
	sends   [8]time.Time  // when the last asks were sent, by ask number modulo 8
	woken   bool          // a wake-up was taken and no attempt has answered since
	queued  bool          // the backend queued us at least once
	place   time.Duration // the backend's last BusyError.Queued
	busy    *BusyError    // the last busy answer
}

// acquisitions keeps acquisitions that nothing refers to any longer, for the next call: a
// TryAcquire, Do or decorated call that gets its lock at once then costs no allocation for
// its state, which is a few hundred bytes.
var acquisitions = sync.Pool{New: func() any { return new(acquisition) }}

// newAcquisition returns an acquisition on g, zero but for g.
func newAcquisition(g *Guard) *acquisition {
	q := acquisitions.Get().(*acquisition)
	q.g = g
	return q
}

// free gives q back for reuse, when nothing can refer to it any longer: no Observer saw its
// Acquisition (an observer may keep it), and it never registered as a waiter (the registry
// had it). q must not be used afterwards.
func (q *acquisition) free() {
	if q.g.obs != nil || q.w.wake != nil {
		return
	}
	*q = acquisition{}
	acquisitions.Put(q)
}

// grant is what a granted acquisition learned: the lease a request sent at start set, learned
// of at heldAt.
type grant struct {
	fence         uint64
	start, heldAt time.Time
	granted       time.Duration
}

// begin readies q, whose settings are resolved, to acquire name from now.
func (q *acquisition) begin(name string) {
	g, s := q.g, &q.s
	q.ttl, q.backoff = s.leaseTime, firstBackoff
	q.w.name, q.w.token = name, g.tokens.next()
	q.a = Acquisition{Name: name, Label: s.label, Kind: s.kind, Permits: s.limit, Backend: g.backendName, MaxWait: s.waitTime, Started: time.Now()}
	if q.ttl == 0 {
		q.ttl, q.renewed = g.watchdogTTL, true
	}
	if s.waitTime > 0 {
		q.giveUp = q.a.Started.Add(s.waitTime)
	}
}

// run makes the attempts of the acquisition by the protocol above. It returns the grant, or
// why there is none: a *BusyError, the end of ctx, ErrClosed, or the backend's error.
func (q *acquisition) run(ctx context.Context) (gr grant, err error) {
	g := q.g
	if q.s.waitTime != 0 {
		g.waiters.join(&q.w)
	}
	defer func() { q.leave(err == nil) }()
	for {
		if err := q.over(ctx); err != nil {
			return grant{}, err
		}
		gr, busy, err := q.attempt(ctx)
		switch {
		case err != nil:
			return grant{}, err
		case busy == nil:
			return gr, nil
		case q.s.waitTime == 0:
			return grant{}, busy
		}
		q.busy = busy
		if q.w.q == nil {
			if err := q.register(ctx); err != nil {
				return grant{}, err
			}
			continue // at once: the holder may have released before the watch was in place
		}
		if gr, ok, err := q.sleep(ctx); ok || err != nil {
			return gr, err
		}
	}
}

// register makes q a waiter for its name, and waits, within its bounds, for the Watch of the
// name that is out to answer.
func (q *acquisition) register(ctx context.Context) error {
	g := q.g
	ready := g.waiters.register(&q.w)
	if q.queued {
		g.waiters.markFair(&q.w)
	}
	if ready == nil {
		return nil
	}
	var giveUp <-chan time.Time
	if !q.giveUp.IsZero() {
		t := time.NewTimer(time.Until(q.giveUp))
		defer t.Stop()
		giveUp = t.C
	}
	select {
	case <-ready:
	case <-giveUp:
	case <-ctx.Done():
	case <-g.life.Done():
	}
	return q.over(ctx)
}

// over returns why the wait is over, or nil: the caller's context ended, the Guard closed, or
// WaitTime ran out.
func (q *acquisition) over(ctx context.Context) error {
	switch {
	case ctx.Err() != nil:
		return canceled(q.a.Name, ctx)
	case q.g.life.Err() != nil:
		return ErrClosed
	case !q.giveUp.IsZero() && !time.Now().Before(q.giveUp):
		b := &BusyError{Name: q.a.Name, Waited: time.Since(q.a.Started)}
		if q.busy != nil {
			b.Remaining, b.Queued = q.busy.Remaining, q.busy.Queued
		}
		return b
	}
	return nil
}

// attempt sends one acquire request. It returns the grant, or the busy answer, or an error
// that ends the acquisition.
func (q *acquisition) attempt(ctx context.Context) (grant, *BusyError, error) {
	g, name := q.g, q.a.Name
	if q.w.q != nil {
		// Among the sleepers before the attempt, so that a release while it is out still
		// wakes us.
		g.waiters.sleeping(&q.w, time.Time{})
	}
	if q.a.Attempts == 0 {
		q.sent = q.a.Started // read just before: one clock reading less on the common path
	} else {
		q.sent = time.Now()
	}
	q.a.Attempts++
	q.asks++
	q.sends[q.asks%len(q.sends)] = q.sent
	fence, err := g.backend.Acquire(ctx, Request{
		Name: name, Token: q.w.token, TTL: q.ttl, Instance: g.instance, Label: q.s.label,
		Wait: q.s.waitTime != 0, Attempt: q.asks,
		Shared: q.s.kind.shared(), Limit: q.s.limit, Value: q.s.value,
	})
	if err == nil {
		q.woken = false
		answered := time.Now()
		if answered.Before(watchdog.Deadline(q.sent, q.ttl)) {
			return grant{fence: fence, start: q.sent, heldAt: answered, granted: q.ttl}, nil, nil
		}
		// The grant came so late that its lease could have ended: someone else may hold the
		// name by now. Give it back, and try again under a new token.
		g.cleanup(name, q.w.token)
		g.waiters.retoken(&q.w, g.tokens.next())
		if q.s.waitTime == 0 {
			return grant{}, nil, &OpError{Op: "acquire", Name: name, Err: errLateGrant}
		}
		return grant{}, &BusyError{Name: name}, nil
	}
	var busy *BusyError
	if errors.As(err, &busy) {
		q.woken = false // the wake-up is used: someone else holds the lock, and its release wakes us
		if busy.Queued > 0 {
			q.queued, q.place = true, busy.Queued
			if q.w.q != nil {
				g.waiters.markFair(&q.w)
			}
		}
		return grant{}, busy, nil
	}
	// The request may have reached the backend and taken the lock although we got no answer,
	// or may reach it later still. A wake-up that this attempt did not use is passed on when
	// we leave.
	g.cleanupInDoubt(name, q.w.token)
	if ctx.Err() != nil {
		return grant{}, nil, canceled(name, ctx)
	}
	return grant{}, nil, &OpError{Op: "acquire", Name: name, Err: err}
}

// sleep waits until q is woken or should try again. It reports a grant when the backend
// handed the lock over meanwhile.
func (q *acquisition) sleep(ctx context.Context) (grant, bool, error) {
	d := q.delay(q.busy, q.g.waiters.watched(&q.w))
	if !q.giveUp.IsZero() {
		d = min(d, time.Until(q.giveUp))
	}
	q.g.waiters.sleeping(&q.w, time.Now().Add(d))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-q.w.wake:
		q.a.Wakeups++
		q.woken = true
		if fence, attempt, ok := q.g.waiters.handedOver(&q.w); ok {
			gr, ok := q.take(fence, attempt)
			return gr, ok, nil
		}
	case <-t.C:
	case <-ctx.Done(): // run says why
	case <-q.g.life.Done():
	}
	return grant{}, false, nil
}

// delay returns how long to sleep after busy: until the holder's lease would run out, when a
// release will be announced; otherwise a jittered backoff, never past the holder's expiry.
// A queued waiter asks again before it loses its place.
func (q *acquisition) delay(busy *BusyError, watched bool) time.Duration {
	d := busy.Remaining
	if watched && d > 0 {
		// A little jitter, so that many waiters do not hit the backend in step.
		d += time.Duration(mrand.Int64N(int64(min(d/50, maxJitter)) + int64(time.Millisecond)))
	} else {
		d = jitter(q.backoff, d)
		q.backoff = min(2*q.backoff, maxBackoff)
	}
	if busy.Queued > 0 {
		d = min(d, busy.Queued/2)
	}
	return d
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

// take turns a hand-over into a grant, or reports that there is none yet. The backend set
// the lease when it handed the name over, after the request whose place it handed over
// (attempt) was sent: counting from that request is safe, and good enough while it is recent.
// The lease is our TTL or our place in the queue, whichever is shorter; the lease's owner
// claims the rest after a third of it, unless the lock is released sooner. When that request
// is long past — a notice that came late — or unknown, the next attempt asks: a request with
// our token finds the lock ours, if it still is, with its fence as it is now.
func (q *acquisition) take(fence uint64, attempt int) (grant, bool) {
	now := time.Now()
	granted := q.ttl
	if q.place > 0 {
		granted = min(granted, q.place)
	}
	if sent, ok := q.sentAt(attempt); ok && now.Sub(sent) < granted/2 {
		return grant{fence: fence, start: sent, heldAt: now, granted: granted}, true
	}
	return grant{}, false
}

// sentAt returns when the acquire request numbered attempt was sent, if it is among the last
// few.
func (q *acquisition) sentAt(attempt int) (time.Time, bool) {
	if attempt <= 0 || attempt > q.asks || q.asks-attempt >= len(q.sends) {
		return time.Time{}, false
	}
	return q.sends[attempt%len(q.sends)], true
}

// leave ends the acquisition: it takes q out of the backend's queue and the Guard's waiters.
func (q *acquisition) leave(acquired bool) {
	g := q.g
	if q.queued && !acquired {
		// Out of the backend's queue, and give back a lock handed over too late.
		g.cleanup(q.a.Name, q.w.token)
	}
	if q.w.q == nil {
		return
	}
	woken := q.woken || len(q.w.wake) > 0
	g.waiters.unregister(&q.w)
	if !acquired && woken {
		// A release woke us, but we leave without the lock: wake the next waiter instead, or
		// it would sleep until its fallback.
		g.waiters.wakeNext(q.a.Name)
	}
}

// outcome returns how an acquisition that returned err ended; single tells whether it made
// one attempt only.
func outcome(ctx context.Context, err error, single bool) Outcome {
	switch {
	case err == nil:
		return OutcomeAcquired
	case isBusy(err) && single:
		return OutcomeBusy
	case isBusy(err):
		return OutcomeTimeout
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return OutcomeCanceled
	default:
		return OutcomeError
	}
}

func isBusy(err error) bool {
	var busy *BusyError
	return errors.As(err, &busy)
}

func canceled(name string, ctx context.Context) error {
	return &OpError{Op: "acquire", Name: name, Err: fmt.Errorf("%w: %w", ErrNotAcquired, ctx.Err())}
}
