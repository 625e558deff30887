// Package lease is the watchdog's scheduler: it renews and watches the leases of one Guard,
// as package watchdog describes.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/guardlock/guard/internal/ilist"
	"github.com/guardlock/guard/watchdog"
)

// Result is the answer of the backend for one lease of a renewal batch.
type Result int

// The results of one renewal.
const (
	Renewed Result = iota // the lease was extended
	NotHeld               // the name is free or held by another owner
	Failed                // the backend could not say (network, server down); try again
)

// RenewFunc extends every lease of batch to its TTL. It returns one Result per lease, in order,
// and for Failed results the error. It must honour ctx: the scheduler cancels it at the
// earliest deadline of the batch. Several calls may run at once.
type RenewFunc func(ctx context.Context, batch []*Lease) ([]Result, []error)

// EndReason says why a lease ended.
type EndReason int

// The reasons a lease ends on its own.
const (
	// Expired: the deadline passed. For a renewed lease, renewals did not succeed in time.
	Expired EndReason = iota
	// Lost: the backend answered that another owner holds the name, or that it is free.
	Lost
	// Suspended: the host was suspended (its monotonic clock stopped) for longer than the
	// lease had left.
	Suspended
)

// Owner is told what happens to a Lease. The scheduler calls it from its own goroutine, one
// call at a time, holding no lock: a method may call the Scheduler, but must return quickly
// and must not block, or every other lease's deadline waits for it. A call can still arrive
// shortly after Remove has returned; an owner that was removed ignores it.
type Owner interface {
	// Renewed is called after each successful renewal with the new deadline.
	Renewed(deadline time.Time)
	// RenewFailed is called when a renewal failed for now; the scheduler tries again.
	RenewFailed(err error)
	// Ended is called once, when the lease ends on its own; lastErr is the last renewal
	// failure, if any.
	Ended(reason EndReason, lastErr error)
}

// Lease is one lock watched by a Scheduler. Fill the exported fields before Add. A Lease can
// live inside its owner's own struct, so that watching a lock costs no allocation of its own.
type Lease struct {
	Name  string
	Token string
	// TTL is the lease that each renewal sets. Zero means the lease is not renewed, only
	// watched until its deadline.
	TTL time.Duration
	// Claim, when set, is a lease to set once, before TTL takes over: for a lock granted with
	// a shorter lease than its own, which claims the rest when a third of the granted lease
	// has passed, as a renewal would. The RenewFunc extends each lease to its RenewTTL.
	Claim time.Duration
	// Owner hears about renewals, failures and the end of the lease; nil hears nothing.
	Owner Owner

	// Guarded by Scheduler.mu.
	deadline time.Time
	next     time.Time // next renewal; zero when not renewed
	inFlight int       // renewal requests out for it
	sentAt   time.Time // when the latest of them was sent
	lastErr  error
	removed  bool // no longer in the scheduler

	links ilist.Links[Lease] // in the scheduler's list
}

// Limits of concurrent renewal requests.
const (
	maxPerLease = 2  // requests out for one lease: the first and one hedge
	maxBatches  = 16 // batches out at once for a whole scheduler
)

// hedgeAfter is how long a lease's renewal may stay unanswered before it is sent again.
func hedgeAfter(ttl time.Duration) time.Duration { return ttl / 6 }

// retryAfter is how soon a failed renewal is tried again: a tenth of the TTL, at most a second.
func retryAfter(ttl time.Duration) time.Duration { return min(ttl/10, time.Second) }

// Suspension detection: the loop wakes at least every heartbeat while it holds leases, and a
// wall clock that ran ahead of the monotonic one by more than suspendSlack (plus 1% of the
// time between two looks, for a clock that is being slewed) means the host was away.
const (
	maxHeartbeat = time.Second
	minHeartbeat = 10 * time.Millisecond
	suspendSlack = 50 * time.Millisecond
)

// Scheduler renews and watches the leases of one Guard. Its zero value is not usable; call New.
type Scheduler struct {
	renew     RenewFunc
	partition func(name string) string

	mu      sync.Mutex // protects leases, the fields of every Lease in it, batches, wakeAt and the clock fields
	leases  ilist.List[Lease]
	batches int       // renewal batches out
	wakeAt  time.Time // when timer fires; zero when it is stopped
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
	start   time.Time
	away    time.Duration // Scheduler.awaySum when the batch was sent
	leases  []*Lease
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

// Add starts watching l, whose lease was set by a request sent at start.
func (s *Scheduler) Add(l *Lease, start time.Time, ttl time.Duration) {
	s.mu.Lock()
	l.deadline = watchdog.Deadline(start, ttl)
	l.removed, l.inFlight, l.lastErr = false, 0, nil
	switch {
	case l.Claim > 0:
		l.next = start.Add(ttl / 3) // as a renewal of the lease it was granted: a lock released soon needs no claim
	case l.TTL > 0:
		l.next = start.Add(l.TTL / 3)
	}
	s.leases.Push(l)
	if (l.TTL > 0 || l.Claim > 0) && l.next.Before(l.deadline) {
		s.arm(l.next)
	} else {
		s.arm(l.deadline)
	}
	s.mu.Unlock()
}

// SetDeadline moves the deadline of a watched lease after the caller extended it by a request
// sent at start. It reports false when the lease already ended, or when the new deadline has
// passed already (the lease then ends at once).
func (s *Scheduler) SetDeadline(l *Lease, start time.Time, ttl time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.removed {
		return false
	}
	l.deadline = watchdog.Deadline(start, ttl)
	s.arm(l.deadline)
	return time.Now().Before(l.deadline)
}

// Shorten moves the deadline of a watched lease earlier, to the one an extension sent at
// start for ttl would set, when that one is earlier. A caller about to send an extension that
// may shorten the lease calls it first: the backend may apply the request even when its
// answer never arrives. Nothing happens to a lease that already ended.
func (s *Scheduler) Shorten(l *Lease, start time.Time, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := watchdog.Deadline(start, ttl); !l.removed && d.Before(l.deadline) {
		l.deadline = d
		s.arm(d)
	}
}

// Deadline returns the current deadline of l.
func (s *Scheduler) Deadline(l *Lease) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.deadline
}

// Remove stops watching l. It does not wait: an owner callback already on its way may still
// arrive (see Owner).
func (s *Scheduler) Remove(l *Lease) {
	s.mu.Lock()
	l.removed = true
	s.leases.Remove(l)
	s.mu.Unlock()
}

// Len returns the number of leases watched.
func (s *Scheduler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leases.Len()
}

// Close stops the scheduler and waits for its goroutines, including renewals in flight. The
// leases still watched end without callbacks.
func (s *Scheduler) Close() {
	s.stop()
	<-s.done
}

// arm makes the timer fire by t, unless it already fires sooner. s.mu must be held.
func (s *Scheduler) arm(t time.Time) {
	if s.wakeAt.IsZero() || t.Before(s.wakeAt) {
		s.wakeAt = t
		s.timer.Reset(time.Until(t))
	}
}

// callback is one call the loop makes for a lease after letting go of mu.
type callback struct {
	l *Lease
	f func()
}

func (s *Scheduler) loop(ctx context.Context) {
	defer close(s.done)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	defer s.timer.Stop()
	for {
		s.run(s.step(ctx, &inflight))
		select {
		case <-ctx.Done():
			return
		case <-s.timer.C:
		case r := <-s.results:
			s.run(s.settle(r))
		}
	}
}

// step notices a suspension, ends the leases past their deadline, sends the renewals that are
// due, and arms the timer for when the loop must look again.
func (s *Scheduler) step(ctx context.Context, inflight *sync.WaitGroup) []callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var cbs []callback
	if away := s.away(now); away > 0 {
		s.awaySum += away
		for l, after := s.leases.Front(), (*Lease)(nil); l != nil; l = after {
			after = s.leases.Next(l) // l may leave the list
			l.deadline = l.deadline.Add(-away)
			if !now.Before(l.deadline) {
				l.lastErr = fmt.Errorf("%w for %v", watchdog.ErrSuspended, away.Round(time.Millisecond))
				cbs = append(cbs, s.end(l, Suspended))
				continue
			}
			if l.TTL > 0 {
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
	minTTL := time.Duration(0)
	for l, after := s.leases.Front(), (*Lease)(nil); l != nil; l = after {
		after = s.leases.Next(l) // l may leave the list
		if !now.Before(l.deadline) {
			cbs = append(cbs, s.end(l, Expired))
			continue
		}
		earlier(l.deadline)
		ttl := l.TTL
		if ttl == 0 {
			ttl = l.deadline.Sub(now)
		}
		if minTTL == 0 || ttl < minTTL {
			minTTL = ttl
		}
		if s.renewable(l, now, 0) {
			due = true
		}
	}
	if due && s.batches < maxBatches {
		s.send(ctx, inflight, now)
	}
	for l, after := s.leases.Front(), (*Lease)(nil); l != nil; l = after {
		after = s.leases.Next(l) // l may leave the list
		if l.TTL == 0 && l.Claim == 0 {
			continue
		}
		switch {
		case l.inFlight == 0:
			earlier(l.next)
		case l.inFlight < maxPerLease:
			earlier(l.sentAt.Add(hedgeAfter(l.renewTTL())))
		}
	}
	if s.leases.Len() > 0 {
		earlier(now.Add(min(max(minTTL/10, minHeartbeat), maxHeartbeat)))
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

// renewable reports whether l should go into a batch sent at now: it is renewed, not past its
// deadline, and either due within early (and nothing is out for it) or out for so long that it
// is sent again. s.mu must be held.
func (s *Scheduler) renewable(l *Lease, now time.Time, early time.Duration) bool {
	if l.TTL == 0 && l.Claim == 0 {
		return false
	}
	switch {
	case l.inFlight == 0:
		return now.Add(early).After(l.next) || now.Equal(l.next)
	case l.inFlight < maxPerLease:
		return !now.Before(l.sentAt.Add(hedgeAfter(l.renewTTL())))
	}
	return false
}

// RenewTTL is the lease the next renewal of l asks for: its Claim, or its TTL.
func (l *Lease) RenewTTL() time.Duration { return l.renewTTL() }

func (l *Lease) renewTTL() time.Duration {
	if l.Claim > 0 {
		return l.Claim
	}
	return l.TTL
}

// send starts one renewal batch per partition with every lease that is due now or would be due
// soon, so that leases taken at different moments share round trips. Leases sent again because
// their renewal went unanswered go in batches of their own: whatever holds their first request
// up may hold this one too, and it must not hold up healthy leases with it. s.mu must be held.
func (s *Scheduler) send(ctx context.Context, inflight *sync.WaitGroup, now time.Time) {
	type group struct {
		partition string
		hedge     bool
	}
	var order []group
	groups := make(map[group][]*Lease)
	for l, after := s.leases.Front(), (*Lease)(nil); l != nil; l = after {
		after = s.leases.Next(l) // l may leave the list
		if !s.renewable(l, now, l.renewTTL()/6) {
			continue
		}
		g := group{hedge: l.inFlight > 0}
		if s.partition != nil {
			g.partition = s.partition(l.Name)
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], l)
	}
	for _, g := range order {
		if s.batches >= maxBatches {
			return // the rest go when a batch comes back
		}
		batch := groups[g]
		var first time.Time // earliest deadline in the batch
		for _, l := range batch {
			l.inFlight++
			l.sentAt = now
			if first.IsZero() || l.deadline.Before(first) {
				first = l.deadline
			}
		}
		s.batches++
		inflight.Add(1)
		away := s.awaySum
		go func() {
			defer inflight.Done()
			rctx, cancel := context.WithDeadline(ctx, first)
			defer cancel()
			start := time.Now()
			res, errs := s.renew(rctx, batch)
			// Never blocks: at most maxBatches are out, and the channel holds that many.
			s.results <- batchResult{start: start, away: away, leases: batch, results: res, errs: errs}
		}()
	}
}

// settle applies the answers of a renewal batch. A lease renewed by two requests keeps the
// later deadline: whatever order the server ran them in, its lease ends no sooner than the
// later start plus the TTL. A batch that was out while the host was found suspended counts
// from a start moved back by the time away: its start was read on the stopped clock.
func (s *Scheduler) settle(r batchResult) []callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches--
	now := time.Now()
	r.start = r.start.Add(-(s.awaySum - r.away))
	var cbs []callback
	for i, l := range r.leases {
		l.inFlight--
		if l.removed {
			continue
		}
		res, err := Failed, error(nil)
		if i < len(r.results) {
			res = r.results[i]
		}
		if i < len(r.errs) {
			err = r.errs[i]
		}
		switch res {
		case Renewed:
			if d := watchdog.Deadline(r.start, l.renewTTL()); d.After(l.deadline) {
				l.deadline = d
				l.next = r.start.Add(l.TTL / 3)
			}
			l.Claim = 0 // claimed: renewals from now on are the TTL's, if any
			l.lastErr = nil
			if o, d := l.Owner, l.deadline; o != nil {
				cbs = append(cbs, callback{l, func() { o.Renewed(d) }})
			}
		case NotHeld:
			cbs = append(cbs, s.end(l, Lost))
		default:
			if err == nil {
				err = errors.New("watchdog: no answer for this lease")
			}
			l.lastErr = err
			if l.inFlight == 0 {
				l.next = now.Add(retryAfter(l.renewTTL()))
			}
			if o := l.Owner; o != nil {
				cbs = append(cbs, callback{l, func() { o.RenewFailed(err) }})
			}
		}
	}
	return cbs
}

// end removes l and returns its Ended call. s.mu must be held.
func (s *Scheduler) end(l *Lease, reason EndReason) callback {
	s.leases.Remove(l)
	l.removed = true
	o, err := l.Owner, l.lastErr
	if o == nil {
		return callback{}
	}
	return callback{l, func() { o.Ended(reason, err) }}
}

// run makes the callbacks, one at a time, holding no lock.
func (s *Scheduler) run(cbs []callback) {
	for _, cb := range cbs {
		if cb.f != nil {
			cb.f()
		}
	}
}
