// Package lease is the one owner of the leases of a Guard's locks. A Lease is a state machine
// — grant, claim, renew, extend, keep, loss, release — and its Scheduler applies every
// transition under one mutex, in the order the transitions are decided, by the rules of
// package watchdog:
//
//   - Add grants a lease: its local deadline counts from the request that set it.
//   - A watchdog lease is renewed in batches; a fixed lease handed over with less than it
//     asked for claims the rest once. Renewals and claims are sent by the Scheduler's loop.
//   - Extend sets a fixed lease by hand. It waits for a renewal or claim of its lease that is
//     out, and no renewal or claim is sent while it is out, so that the requests of one lease
//     reach the server in the order they were decided: a claim can never undo an Extend. It
//     moves the local deadline before it sends a request that may shorten the lease, and never
//     asks the server for less than the rest of a MinHold window.
//   - A request whose answer never came may still be applied later: from then on the lease is
//     trusted for no longer than the shortest lease such a request asked for (its doubt).
//   - A renewal unanswered for a while is sent again (hedged) only when the backend looks stuck
//     for it — a batch sent after it came back, or none came back for as long — and not when
//     the backend is merely slow: answers to earlier batches still coming in mean it is working
//     through a queue, and a second copy of each request would only lengthen it (with 100,000
//     locks on a loaded host, hedges were half of all requests, and most locks were lost).
//   - The lease ends on its own — lost, expired, the host suspended — and the Owner is told, or
//     it is released; either way, no request is sent for it any more.
package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardlock/guard/internal/ilist"
	"github.com/guardlock/guard/watchdog"
)

// Result is the answer of the backend for one lease of a request.
type Result int

// The results of one renewal, claim or extension.
const (
	Renewed Result = iota // the lease was set
	NotHeld               // the name is free or held by another owner
	Failed                // the backend could not say (network, server down): the outcome is unknown
)

// Request asks the backend to set one lease to TTL from now, if Token still holds Name.
type Request struct {
	Name  string
	Token string
	TTL   time.Duration
}

// RenewFunc sends a batch of renewals and claims. It returns one Result per request, in order,
// and for Failed results the error. It must honour ctx: the scheduler cancels it at the
// latest deadline of the batch, when no answer can save any of its leases. Several calls may
// run at once.
type RenewFunc func(ctx context.Context, batch []Request) ([]Result, []error)

// EndReason says why a lease ended.
type EndReason int

// The reasons a lease ends on its own.
const (
	// Expired: the deadline passed. For a watchdog lease, renewals did not succeed in time.
	Expired EndReason = iota
	// Lost: the backend answered that another owner holds the name, or that it is free.
	Lost
	// Suspended: the host was suspended (its monotonic clock stopped) for longer than the
	// lease had left.
	Suspended
)

// Owner is told what happens to a Lease. The scheduler calls it holding no lock, from its own
// goroutine (one call at a time) or from Extend's caller: a method may call the Scheduler, but
// must return quickly and must not block, or every other lease's deadline waits for it. A call
// can still arrive shortly after Release has returned; an owner that was released ignores it.
type Owner interface {
	// Renewed is called after each successful renewal or claim with the new deadline.
	Renewed(deadline time.Time)
	// RenewFailed is called when a renewal or claim failed for now; the scheduler tries again.
	RenewFailed(err error)
	// Ended is called once, when the lease ends on its own; lastErr is the last renewal
	// failure, if any.
	Ended(reason EndReason, lastErr error)
}

// Grant is how a lease began: the backend granted a lock.
type Grant struct {
	// Start is read before the request that set the lease was sent: the lease runs from then
	// at the earliest.
	Start time.Time
	// HeldAt is when the grant was learned of.
	HeldAt time.Time
	// Granted is the lease that request set.
	Granted time.Duration
	// Renew, for a watchdog lease, is the lease each renewal sets; 0 for a fixed lease.
	Renew time.Duration
	// Fixed, for a fixed lease, is the lease asked for, counted from HeldAt. When Granted is
	// shorter (a hand-over), the rest is claimed after RenewAfter(Granted).
	Fixed time.Duration
	// MinHold keeps the name taken until HeldAt + MinHold: Extend never asks the server for
	// less, and Release says what is left of it; both add the drift a deadline allows for.
	MinHold time.Duration
}

// state is where a Lease is in its life.
type state uint8

const (
	idle     state = iota // not added yet
	live                  // watched by the scheduler
	ended                 // ended on its own: lost, expired, suspended
	released              // released by its owner (after living or ending)
)

// Lease is one lock's lease. Set Name, Token and Owner, then hand it to Scheduler.Add; from
// then on only the Scheduler changes it. A Lease can live inside its owner's own struct, so
// that watching a lock costs no allocation of its own.
type Lease struct {
	Name  string
	Token string
	// Owner hears about renewals, failures and the end of the lease; nil hears nothing.
	Owner Owner

	// Guarded by Scheduler.mu.
	state     state
	renew     time.Duration // the lease each renewal sets; 0: a fixed lease
	claimEnd  time.Time     // a fixed lease still to claim up to this end; zero: none
	keepUntil time.Time     // the end of its MinHold window; zero: none
	deadline  time.Time     // the local validity deadline (set with setDeadline)
	span      time.Duration // the lease the request that last moved deadline on set: a grant's, a renewal's, an Extend's
	next      time.Time     // the next renewal or claim; zero when none is due
	inFlight  int           // renewal or claim requests out for it
	sentAt    time.Time     // when the latest of them was sent (a step's clock reading, shared by its batches)
	lastErr   error
	doubt     time.Duration // the shortest lease asked by a request whose answer never came; 0: none
	extending bool          // an Extend is out: no renewal or claim is sent
	settled   chan struct{} // closed when inFlight falls to 0 (or the lease ends), for an Extend that waits

	links ilist.Links[Lease] // in the scheduler's list while live

	due atomic.Int64 // deadline, as time since epoch, for Due without the scheduler's lock
}

// epoch is what Lease.due counts from: a monotonic reading, so that Due ignores changes to the
// wall clock.
var epoch = time.Now()

// setDeadline sets l's local validity deadline. s.mu must be held.
func (l *Lease) setDeadline(t time.Time) {
	l.deadline = t
	l.due.Store(int64(t.Sub(epoch)))
}

// Due reports whether l's deadline has passed, whether or not the scheduler has ended l yet:
// its timer can fire late on a loaded host. It takes no lock.
func (l *Lease) Due() bool {
	d := l.due.Load()
	return d != 0 && int64(time.Since(epoch)) >= d
}

// Limits of concurrent renewal requests.
const (
	maxPerLease = 2  // requests out for one lease: the first and one hedge
	maxBatches  = 16 // batches out at once for a whole scheduler
	// maxBatchLen is the most requests in one batch. A Guard with many locks sends those that
	// are due in several batches, the nearest deadlines first, so that each answer comes back
	// soon (an unanswered batch is sent again after HedgeAfter) and, when more are due than
	// can be out at once, the leases that would run out first are not the ones that wait.
	maxBatchLen = 4096
)

// Suspension detection: the loop wakes at least every heartbeat while it holds leases, and a
// wall clock that ran ahead of the monotonic one by more than suspendSlack (plus 1% of the
// time between two looks, for a clock that is being slewed) means the host was away.
const (
	maxHeartbeat = time.Second
	minHeartbeat = 10 * time.Millisecond
	suspendSlack = 50 * time.Millisecond
)

// ErrEnded is Extend's error for a lease that ended or was released before or while its
// request was out.
var ErrEnded = errors.New("lease: ended")

// Scheduler owns the leases of one Guard. Its zero value is not usable; call New.
type Scheduler struct {
	renew     RenewFunc
	partition func(name string) string

	mu      sync.Mutex // protects leases, the fields of every Lease, batches, wakeAt and the clock fields
	leases  ilist.List[Lease]
	batches int // renewal batches out
	// pending: the last look left renewals due unsent, because maxBatches were out; the loop
	// looks again as soon as one comes back.
	pending bool
	wakeAt  time.Time // when timer fires; zero when it is stopped
	// answeredSent is when the latest batch that came back was sent, and answeredAt when the
	// latest came back: whether the backend is stuck for a lease or working through a queue
	// (stuck). hedgeWait is the earliest send time of the leases that are due a hedge but wait
	// because the backend is not stuck; zero: none. A batch sent after it that comes back
	// makes the loop look again.
	answeredSent, answeredAt time.Time
	hedgeWait                time.Time
	// quietUntil: no lease needs a look before then — no renewal, hedge or deadline is due —
	// so the loop only looks at the clocks when it wakes sooner (zero: it looks at every
	// lease). beat is how often it looks at the clocks.
	quietUntil time.Time
	beat       time.Duration
	// The clocks at the loop's last look, to notice a suspended host, and the total time it
	// was found away.
	lastMono, lastWall time.Time
	awaySum            time.Duration
	// wallOffset is added to the wall clock; tests move it to fake a suspension.
	wallOffset func() time.Duration

	// timer wakes the loop when the next lease is due. Add arms it directly, under mu, so
	// that taking a lock never wakes the loop's goroutine.
	timer *time.Timer

	results chan batchResult // buffered for maxBatches: a renewal never blocks on the loop
	stop    context.CancelFunc
	done    chan struct{}
}

type batchResult struct {
	sent    time.Time // the step's clock reading when it was sent (Lease.sentAt)
	start   time.Time
	away    time.Duration // Scheduler.awaySum when the batch was sent
	leases  []*Lease
	ttls    []time.Duration // the lease each request asked for
	results []Result
	errs    []error
}

// New starts a scheduler that renews leases with renew. partition, when not nil, names the
// server each lease lives on: the leases of different partitions are renewed in separate calls
// of renew, so that a slow server delays only its own. Stop the scheduler with Close.
func New(renew RenewFunc, partition func(name string) string) *Scheduler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scheduler{
		leases:     ilist.New(func(l *Lease) *ilist.Links[Lease] { return &l.links }),
		renew:      renew,
		partition:  partition,
		wallOffset: func() time.Duration { return 0 },
		timer:      time.NewTimer(time.Hour),
		results:    make(chan batchResult, maxBatches),
		stop:       cancel,
		done:       make(chan struct{}),
	}
	s.timer.Stop()
	go s.loop(ctx)
	return s
}

// Add starts owning l, granted as g says.
func (s *Scheduler) Add(l *Lease, g Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.state, l.renew, l.inFlight, l.lastErr, l.doubt, l.extending = live, g.Renew, 0, nil, 0, false
	l.setDeadline(watchdog.Deadline(g.Start, g.Granted))
	l.span = g.Granted
	l.claimEnd, l.keepUntil, l.next = time.Time{}, time.Time{}, time.Time{}
	if g.MinHold > 0 {
		l.keepUntil = g.HeldAt.Add(g.MinHold)
	}
	switch {
	case g.Renew > 0:
		// As a renewal of the lease it was granted: a hand-over's shorter lease is claimed
		// sooner, and a lock released soon needs no claim at all.
		l.next = g.Start.Add(watchdog.RenewAfter(min(g.Granted, g.Renew)))
	case g.Fixed > g.Granted:
		l.claimEnd = g.HeldAt.Add(g.Fixed)
		l.next = g.Start.Add(watchdog.RenewAfter(g.Granted))
	}
	s.leases.Push(l)
	if !l.next.IsZero() && l.next.Before(l.deadline) {
		s.arm(l.next)
	} else {
		s.arm(l.deadline)
	}
	// The loop looks at the clocks at least every heartbeat while it holds leases (a
	// suspended host): it may have gone to sleep with none.
	held := g.HeldAt // read as the grant came back: one clock reading less per lock
	if held.IsZero() {
		held = time.Now()
	}
	s.arm(held.Add(heartbeat(l.deadline.Sub(g.Start))))
}

// heartbeat is how often the loop looks at the clocks while it holds a lease of about ttl.
func heartbeat(ttl time.Duration) time.Duration {
	return min(max(ttl/10, minHeartbeat), maxHeartbeat)
}

// Extend sets a fixed lease to d from now with one request, sent by send with the lease the
// server is to set (never less than the rest of the MinHold window), and returns its result.
// It first waits, within ctx, for a renewal or claim of l that is out. The local deadline
// moves before the request is sent when d shortens the lease, and to the new lease once the
// backend confirms it. NotHeld ends the lease (the Owner hears Lost). Extend returns ErrEnded
// when the lease ended or was released before its request was sent or while it was out.
func (s *Scheduler) Extend(ctx context.Context, l *Lease, d time.Duration, send func(ctx context.Context, ttl time.Duration) (Result, error)) (Result, error) {
	s.mu.Lock()
	for l.state == live && l.inFlight > 0 && !control {
		if l.settled == nil {
			l.settled = make(chan struct{})
		}
		settled := l.settled
		s.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			return Failed, ctx.Err()
		}
		s.mu.Lock()
	}
	if l.state != live {
		s.mu.Unlock()
		return NotHeld, ErrEnded
	}
	start := time.Now()
	ttl := max(d, l.keep(start))
	// It sets the lease: a claim still to come would undo it.
	if !control {
		l.extending, l.claimEnd, l.next = true, time.Time{}, time.Time{}
	}
	s.lower(l, watchdog.Deadline(start, d))
	s.mu.Unlock()

	res, err := send(ctx, ttl)

	s.mu.Lock()
	l.extending = false
	var cb callback
	switch {
	case l.state != live:
		res, err = NotHeld, ErrEnded
	case res == Renewed:
		l.setDeadline(watchdog.Deadline(start, l.trust(d)))
		l.span = l.trust(d)
		if now := time.Now(); !now.Before(l.deadline) {
			// The answer came after the lease it set could have ended.
			cb = s.end(l, Expired)
			res, err = NotHeld, ErrEnded
		} else {
			s.arm(l.deadline)
		}
	case res == NotHeld:
		cb = s.end(l, Lost)
	default:
		l.distrust(ttl)
	}
	s.mu.Unlock()
	s.run([]callback{cb})
	return res, err
}

// Release ends l for good: no request is sent for it any more. It reports whether this call
// released it (false when it was released already), and what is left of its MinHold window:
// how long the server must keep the name taken.
func (s *Scheduler) Release(l *Lease) (keep time.Duration, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state == released {
		return 0, false
	}
	if l.state == live {
		s.leases.Remove(l)
	}
	l.state = released
	l.wake()
	if l.keepUntil.IsZero() {
		return 0, true // no window: no clock reading
	}
	return l.keep(time.Now()), true
}

// keep returns how long from now the server must keep l's name taken for the rest of its
// MinHold window to pass by our clock: the rest, plus the drift a lease's deadline allows for
// (watchdog.Drift), so that a server clock that runs up to 1 % fast does not end the window
// early. Zero when there is no window or it is over.
func (l *Lease) keep(now time.Time) time.Duration {
	if l.keepUntil.IsZero() {
		return 0
	}
	rest := l.keepUntil.Sub(now)
	if rest <= 0 {
		return 0
	}
	return rest + watchdog.Drift(rest)
}

// Deadline returns the current local validity deadline of l.
func (s *Scheduler) Deadline(l *Lease) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.deadline
}

// Span returns the lease the request that last set l's deadline asked for and was granted: a
// grant's (a hand-over's may be shorter than a renewal's), then each renewal's or Extend's.
// How much of it is left says whether renewals keep up: a healthy watchdog lease never has less
// than two thirds of it left, less the round trip.
func (s *Scheduler) Span(l *Lease) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.span
}

// Len returns the number of leases live.
func (s *Scheduler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leases.Len()
}

// Stall holds the scheduler's lock until resume is called, so that its loop ends no lease in
// the meantime: for tests of what a late timer does.
func (s *Scheduler) Stall() (resume func()) {
	s.mu.Lock()
	return s.mu.Unlock
}

// Close stops the scheduler and waits for its goroutines, including renewals in flight. The
// leases still live end without callbacks.
func (s *Scheduler) Close() {
	s.stop()
	<-s.done
}

// lower moves l's deadline back to d, if d is earlier. s.mu must be held.
func (s *Scheduler) lower(l *Lease, d time.Time) {
	if d.Before(l.deadline) {
		l.setDeadline(d)
		s.arm(d)
	}
}

// trust returns how long a confirmed request that asked for ttl keeps l: ttl, but no longer
// than a request whose answer never came asked for, since that one may still be applied after
// it.
func (l *Lease) trust(ttl time.Duration) time.Duration {
	if l.doubt > 0 {
		return min(ttl, l.doubt)
	}
	return ttl
}

// distrust records a request for ttl whose answer never came.
func (l *Lease) distrust(ttl time.Duration) {
	if l.doubt == 0 || ttl < l.doubt {
		l.doubt = ttl
	}
}

// wake lets an Extend that waits for l's requests go on. Scheduler.mu must be held.
func (l *Lease) wake() {
	if l.settled != nil {
		close(l.settled)
		l.settled = nil
	}
}

// arm makes the timer fire by t, unless it already fires sooner. s.mu must be held.
func (s *Scheduler) arm(t time.Time) {
	if t.Before(s.quietUntil) {
		s.quietUntil = t
	}
	if s.wakeAt.IsZero() || t.Before(s.wakeAt) {
		s.wakeAt = t
		s.timer.Reset(time.Until(t))
	}
}

// callback is one call the scheduler makes to a lease's Owner after letting go of mu: a
// value, not a closure, so that telling 100,000 owners of their renewals allocates nothing.
type callback struct {
	owner    Owner // nil: no call
	kind     callbackKind
	deadline time.Time // Renewed's
	reason   EndReason // Ended's
	err      error     // RenewFailed's, or Ended's last error
}

type callbackKind uint8

const (
	renewedCall callbackKind = iota
	failedCall
	endedCall
)

func (s *Scheduler) loop(ctx context.Context) {
	defer close(s.done)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	defer s.timer.Stop()
	look := true
	var cbs []callback // settle's, reused: a batch of 4,096 renewals tells as many owners
	for {
		if look {
			s.run(s.step(ctx, &inflight))
		}
		select {
		case <-ctx.Done():
			return
		case <-s.timer.C:
			look = true
		case r := <-s.results:
			cbs = s.settle(r, cbs[:0])
			s.run(cbs)
			clear(cbs) // let go of the owners
			// Unless renewals wait for a batch to come back, the timer knows when the next
			// one is due: a Guard with many leases does not look at all of them per answer.
			look = s.mustLook()
		}
	}
}

// mustLook reports whether renewals were left unsent for want of a free batch and half of the
// batches are free again, or a batch sent after a request that waits for a hedge came back
// (the backend is stuck for that one), so that the loop looks again. It does not look each time one batch
// comes back: each look goes over every lease, and an overloaded Guard would spend its time
// looking rather than sending.
func (s *Scheduler) mustLook() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending && s.batches <= maxBatches/2 ||
		!s.hedgeWait.IsZero() && s.answeredSent.After(s.hedgeWait) // a wait for a hedge is over
}

// step notices a suspension, ends the leases past their deadline, sends the renewals and
// claims that are due, and arms the timer for when the loop must look again.
func (s *Scheduler) step(ctx context.Context, inflight *sync.WaitGroup) []callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var cbs []callback
	away := s.away(now)
	if away == 0 && !s.pending && now.Before(s.quietUntil) {
		// Nothing is due: the loop woke to look at the clocks, and they agree.
		next := now.Add(s.beat)
		if s.quietUntil.Before(next) {
			next = s.quietUntil
		}
		s.wakeAt = next
		s.timer.Reset(time.Until(next))
		return nil
	}
	if away > 0 {
		s.awaySum += away
		for l, after := s.leases.Front(), (*Lease)(nil); l != nil; l = after {
			after = s.leases.Next(l) // l may leave the list
			l.setDeadline(l.deadline.Add(-away))
			if !now.Before(l.deadline) {
				l.lastErr = fmt.Errorf("%w for %v", watchdog.ErrSuspended, away.Round(time.Millisecond))
				cbs = append(cbs, s.end(l, Suspended))
				continue
			}
			if !l.next.IsZero() {
				l.next = now // confirm it at once
			}
		}
	}

	var next time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	due := false
	var soon []*Lease
	minTTL := time.Duration(0)
	for l, after := s.leases.Front(), (*Lease)(nil); l != nil; l = after {
		after = s.leases.Next(l) // l may leave the list
		if !now.Before(l.deadline) {
			cbs = append(cbs, s.end(l, Expired))
			continue
		}
		earlier(l.deadline)
		ttl := l.renew
		if ttl == 0 {
			ttl = l.deadline.Sub(now)
		}
		if minTTL == 0 || ttl < minTTL {
			minTTL = ttl
		}
		// A lease due soon joins a batch that goes now, to share its round trip.
		if s.renewable(l, now, watchdog.BatchWindow(l.requestTTL(now))) {
			soon = append(soon, l)
			due = due || s.renewable(l, now, 0)
		}
	}
	s.pending = due
	if due && s.batches < maxBatches {
		s.pending = s.send(ctx, inflight, now, soon)
	}
	full := s.batches >= maxBatches // nothing can be sent before a batch comes back, which wakes the loop
	s.hedgeWait = time.Time{}
	for l := s.leases.Front(); l != nil; l = s.leases.Next(l) {
		if l.renew == 0 && !l.next.IsZero() && !l.claimEnd.After(l.deadline) {
			l.claimEnd, l.next = time.Time{}, time.Time{} // nothing left to claim
		}
		if l.next.IsZero() || l.extending {
			continue
		}
		var due time.Time
		switch {
		case l.inFlight == 0:
			due = l.next
		case l.inFlight < maxPerLease:
			hedge := watchdog.HedgeAfter(l.requestTTL(l.sentAt))
			due = l.sentAt.Add(hedge)
			if !due.After(now) && !s.stuck(l, now) {
				// Due a hedge, but the backend is busy, not stuck: look again when it has
				// been silent as long, or when a batch sent after l's comes back (loop).
				due = s.answeredAt.Add(hedge)
				if s.hedgeWait.IsZero() || l.sentAt.Before(s.hedgeWait) {
					s.hedgeWait = l.sentAt
				}
			}
		}
		if !due.IsZero() && (due.After(now) || !full) {
			earlier(due)
		}
	}
	s.quietUntil = next
	if s.leases.Len() > 0 {
		s.beat = heartbeat(minTTL)
		earlier(now.Add(s.beat))
	}
	s.wakeAt = next
	if next.IsZero() {
		s.timer.Stop()
	} else {
		s.timer.Reset(time.Until(next))
	}
	return cbs
}

// away returns how long the host was suspended since the loop's last look, or 0. s.mu must be
// held.
func (s *Scheduler) away(now time.Time) time.Duration {
	wall := now.Round(0).Add(s.wallOffset())
	lastMono, lastWall := s.lastMono, s.lastWall
	s.lastMono, s.lastWall = now, wall
	if lastMono.IsZero() {
		return 0
	}
	mono := now.Sub(lastMono)
	if gap := wall.Sub(lastWall) - mono; gap > suspendSlack+mono/100 {
		return gap
	}
	return 0
}

// requestTTL is the lease a renewal or claim of l sent at now asks for: the watchdog's TTL, or
// the rest of a fixed lease to claim. s.mu must be held.
func (l *Lease) requestTTL(now time.Time) time.Duration {
	if l.renew > 0 {
		return l.renew
	}
	return l.claimEnd.Sub(now)
}

// renewable reports whether l should go into a batch sent at now: a renewal or claim is due
// within early (and nothing is out for it), or its request is out for so long that it is sent
// again — and no Extend is out for it. s.mu must be held.
func (s *Scheduler) renewable(l *Lease, now time.Time, early time.Duration) bool {
	if l.next.IsZero() || l.extending {
		return false
	}
	if l.renew == 0 && !l.claimEnd.After(l.deadline) {
		return false // nothing left to claim: the lease it has lasts as long
	}
	switch {
	case l.inFlight == 0:
		return !now.Add(early).Before(l.next)
	case l.inFlight < maxPerLease:
		return !now.Before(l.sentAt.Add(watchdog.HedgeAfter(l.requestTTL(l.sentAt)))) && s.stuck(l, now)
	}
	return false
}

// stuck reports whether the backend looks stuck for l's request that is out: a batch sent
// after it came back, or none came back for as long as a hedge waits. Otherwise the backend is
// answering older batches — busy, not stuck — and a copy of l's request would only queue
// behind its first. s.mu must be held.
func (s *Scheduler) stuck(l *Lease, now time.Time) bool {
	if control {
		return true // the engine before issue 21 hedged every renewal unanswered for a while
	}
	return s.answeredSent.After(l.sentAt) || !now.Before(s.answeredAt.Add(watchdog.HedgeAfter(l.requestTTL(l.sentAt))))
}

// send starts batches per partition with the leases due, which are due now or would be due soon,
// so that leases taken at different moments share round trips. Leases sent again because
// their request went unanswered go in batches of their own: whatever holds their first request
// up may hold this one too, and it must not hold up healthy leases with it. A batch holds at
// most maxBatchLen leases; the leases nearest their deadline go first, in the first batches,
// and when maxBatches are out the rest wait for one to come back: send reports whether any
// does. s.mu must be held.
func (s *Scheduler) send(ctx context.Context, inflight *sync.WaitGroup, now time.Time, due []*Lease) (left bool) {
	slices.SortStableFunc(due, func(a, b *Lease) int { return a.deadline.Compare(b.deadline) })
	type group struct {
		partition string
		hedge     bool
	}
	// The batches in the order of their nearest deadline: a group's open batch is the last
	// one it started.
	var batches [][]*Lease
	open := make(map[group]int)
	for _, l := range due {
		g := group{hedge: l.inFlight > 0}
		if s.partition != nil {
			g.partition = s.partition(l.Name)
		}
		at, ok := open[g]
		if !ok || len(batches[at]) == maxBatchLen {
			at = len(batches)
			open[g] = at
			batches = append(batches, make([]*Lease, 0, min(len(due), maxBatchLen)))
		}
		batches[at] = append(batches[at], l)
	}
	for _, batch := range batches {
		if s.batches >= maxBatches {
			return true // the rest go when a batch comes back
		}
		reqs := make([]Request, len(batch))
		ttls := make([]time.Duration, len(batch))
		// The batch is cancelled when the last of its leases runs out, not the first: a
		// Guard that is behind sends the leases nearest their deadline first, and a batch cut
		// at its most urgent lease's deadline failed as a whole — thousands of leases with
		// time left — for the sake of one that would have ended anyway (the loop ends a lease
		// at its deadline whatever its request's fate; a stuck request is hedged).
		var last time.Time
		for i, l := range batch {
			ttls[i] = l.requestTTL(now)
			reqs[i] = Request{Name: l.Name, Token: l.Token, TTL: ttls[i]}
			l.inFlight++
			l.sentAt = now
			if l.deadline.After(last) {
				last = l.deadline
			}
		}
		s.batches++
		inflight.Add(1)
		away := s.awaySum
		go func() {
			defer inflight.Done()
			rctx, cancel := context.WithDeadline(ctx, last)
			defer cancel()
			start := time.Now()
			res, errs := s.renew(rctx, reqs)
			// Never blocks: at most maxBatches are out, and the channel holds that many.
			s.results <- batchResult{sent: now, start: start, away: away, leases: batch, ttls: ttls, results: res, errs: errs}
		}()
	}
	return false
}

// settle applies the answers of a batch and appends the calls to make to cbs. A watchdog
// lease renewed by two requests keeps the later deadline: whatever order the server ran them
// in, its lease ends no sooner than the later start plus the TTL. A batch that was out while the host was found suspended counts
// from a start moved back by the time away: its start was read on the stopped clock.
func (s *Scheduler) settle(r batchResult, cbs []callback) []callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches--
	now := time.Now()
	if r.sent.After(s.answeredSent) {
		s.answeredSent = r.sent
	}
	s.answeredAt = now
	r.start = r.start.Add(-(s.awaySum - r.away))
	for i, l := range r.leases {
		l.inFlight--
		if l.state == live {
			res, err := Failed, error(nil)
			if i < len(r.results) {
				res = r.results[i]
			}
			if i < len(r.errs) {
				err = r.errs[i]
			}
			cbs = s.apply(l, res, err, r.ttls[i], r.start, now, cbs)
		}
		if l.inFlight == 0 {
			l.wake() // after the answer is applied; not deferred, which allocates per lease
		}
	}
	return cbs
}

// apply applies the answer res (err) to a request for ttl of live lease l, sent at start and
// answered by now, and appends the call to make to cbs. s.mu must be held.
func (s *Scheduler) apply(l *Lease, res Result, err error, ttl time.Duration, start, now time.Time, cbs []callback) []callback {
	switch res {
	case Renewed:
		if d := watchdog.Deadline(start, l.trust(ttl)); d.After(l.deadline) {
			l.setDeadline(d)
			l.span = l.trust(ttl)
		}
		if l.renew > 0 {
			if n := start.Add(watchdog.RenewAfter(l.renew)); n.After(l.next) {
				l.next = n
			}
		} else {
			l.claimEnd, l.next = time.Time{}, time.Time{} // claimed
		}
		l.lastErr = nil
		if l.Owner != nil {
			cbs = append(cbs, callback{owner: l.Owner, kind: renewedCall, deadline: l.deadline})
		}
	case NotHeld:
		cbs = append(cbs, s.end(l, Lost))
	default:
		if err == nil {
			err = errors.New("watchdog: no answer for this lease")
		}
		l.lastErr = err
		l.distrust(ttl)
		if l.inFlight == 0 {
			l.next = now.Add(watchdog.RetryAfter(max(l.requestTTL(now), 0)))
			s.arm(l.next)
		}
		if l.Owner != nil {
			cbs = append(cbs, callback{owner: l.Owner, kind: failedCall, err: err})
		}
	}
	return cbs
}

// end ends l on its own and returns its Ended call. s.mu must be held.
func (s *Scheduler) end(l *Lease, reason EndReason) callback {
	s.leases.Remove(l)
	l.state = ended
	l.wake()
	return callback{owner: l.Owner, kind: endedCall, reason: reason, err: l.lastErr}
}

// run makes the callbacks, one at a time, holding no lock.
func (s *Scheduler) run(cbs []callback) {
	for _, cb := range cbs {
		switch o := cb.owner; {
		case o == nil:
		case cb.kind == renewedCall:
			o.Renewed(cb.deadline)
		case cb.kind == failedCall:
			o.RenewFailed(cb.err)
		default:
			o.Ended(cb.reason, cb.err)
		}
	}
}
