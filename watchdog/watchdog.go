// Package watchdog keeps leases alive and enforces their local validity deadlines.
//
// A Guard owns one Scheduler. Every lock it holds is a Lease in the scheduler: a lock taken
// without a lease time is renewed every TTL/3, and a lock with a fixed lease is only watched.
// One goroutine serves all leases: it sends the renewals that are due in one batch (one
// backend call, which a backend turns into one round trip per node), and it ends every lease
// whose deadline passes without a confirmed renewal — even when the backend never answers,
// because renewals run on a separate goroutine while the scheduler keeps time.
//
// The deadline of a lease is start + TTL − Drift(TTL), where start is read before the request
// that set the lease was sent. The lease on the server cannot have run out before that moment,
// as long as clocks run at about the same rate; that is the promise the Guard builds its
// lock contexts on.
package watchdog

import (
	"context"
	"sync"
	"time"
)

// Drift is the safety margin subtracted from a lease's TTL to get its local deadline: 1% of
// the TTL for clock rate differences, plus 2 ms for timer and scheduling lag.
func Drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// Deadline returns the local validity deadline of a lease of ttl set by a request sent at start.
func Deadline(start time.Time, ttl time.Duration) time.Time {
	return start.Add(ttl - Drift(ttl))
}

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
// earliest deadline of the batch.
type RenewFunc func(ctx context.Context, batch []*Lease) ([]Result, []error)

// EndReason says why a lease ended.
type EndReason int

// The reasons a lease ends on its own.
const (
	// Expired: the deadline passed. For a renewed lease, renewals did not succeed in time.
	Expired EndReason = iota
	// Lost: the backend answered that another owner holds the name, or that it is free.
	Lost
)

// Owner is told what happens to a Lease. The scheduler calls it from its own goroutine,
// never two calls at once, and never after Remove has returned; it must return quickly and
// must not call Remove.
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
	// Owner hears about renewals, failures and the end of the lease; nil hears nothing.
	Owner Owner

	// Guarded by Scheduler.mu.
	deadline time.Time
	next     time.Time // next renewal; zero when not renewed
	inFlight bool
	lastErr  error
	removed  bool // no longer in the scheduler
	dropped  bool // removed by Remove: its callbacks must not run
}

// Scheduler renews and watches the leases of one Guard. Its zero value is not usable; call New.
type Scheduler struct {
	renew RenewFunc

	mu     sync.Mutex // protects leases and the fields of every Lease in it, batch and wakeAt
	leases map[*Lease]struct{}
	batch  bool      // a renewal batch is in flight
	wakeAt time.Time // when timer fires; zero when it is stopped

	// timer wakes the loop when the next lease is due. Add arms it directly, under mu, so
	// that taking a lock never wakes the loop's goroutine.
	timer *time.Timer

	// cbMu is held while callbacks run, so that Remove can wait for a callback in progress.
	cbMu sync.Mutex

	results chan batchResult
	stop    context.CancelFunc
	done    chan struct{}
}

type batchResult struct {
	start   time.Time
	leases  []*Lease
	results []Result
	errs    []error
}

// New starts a scheduler that renews leases with renew. Stop it with Close.
func New(renew RenewFunc) *Scheduler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scheduler{
		renew:   renew,
		leases:  make(map[*Lease]struct{}),
		timer:   time.NewTimer(time.Hour),
		results: make(chan batchResult, 1),
		stop:    cancel,
		done:    make(chan struct{}),
	}
	s.timer.Stop()
	go s.loop(ctx)
	return s
}

// Add starts watching l, whose lease was set by a request sent at start.
func (s *Scheduler) Add(l *Lease, start time.Time, ttl time.Duration) {
	s.mu.Lock()
	l.deadline = Deadline(start, ttl)
	if l.TTL > 0 {
		l.next = start.Add(l.TTL / 3)
	}
	s.leases[l] = struct{}{}
	if l.TTL > 0 && l.next.Before(l.deadline) {
		s.arm(l.next)
	} else {
		s.arm(l.deadline)
	}
	s.mu.Unlock()
}

// SetDeadline moves the deadline of a watched lease after the caller extended it by a request
// sent at start. It reports false when the lease already ended.
func (s *Scheduler) SetDeadline(l *Lease, start time.Time, ttl time.Duration) bool {
	s.mu.Lock()
	_, ok := s.leases[l]
	if ok {
		l.deadline = Deadline(start, ttl)
		s.arm(l.deadline)
	}
	s.mu.Unlock()
	return ok
}

// Deadline returns the current deadline of l.
func (s *Scheduler) Deadline(l *Lease) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.deadline
}

// Remove stops watching l. No callback of l runs after Remove returns.
func (s *Scheduler) Remove(l *Lease) {
	s.mu.Lock()
	l.removed, l.dropped = true, true
	delete(s.leases, l)
	s.mu.Unlock()
	// Wait for a callback that may be running for l right now; later ones see dropped.
	s.cbMu.Lock()
	s.cbMu.Unlock() //nolint:staticcheck // an empty critical section is the point: a barrier
}

// Len returns the number of leases watched.
func (s *Scheduler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}

// Close stops the scheduler and waits for its goroutines, including a renewal in flight. The
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

// step ends the leases past their deadline, starts a renewal batch when one is due, and
// arms the timer for when the loop must look again.
func (s *Scheduler) step(ctx context.Context, inflight *sync.WaitGroup) []callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var cbs []callback
	var next time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	due := false
	for l := range s.leases {
		if !now.Before(l.deadline) {
			cbs = append(cbs, s.end(l, Expired))
			continue
		}
		earlier(l.deadline)
		if l.TTL > 0 && !l.inFlight && !now.Before(l.next) {
			due = true
		}
	}
	if due && !s.batch {
		// Renew every lease that is due now or would be due soon, so that leases taken at
		// different moments share round trips instead of each paying its own.
		var batch []*Lease
		var first time.Time // earliest deadline in the batch
		for l := range s.leases {
			if l.TTL > 0 && !l.inFlight && now.Add(l.TTL/6).After(l.next) {
				l.inFlight = true
				batch = append(batch, l)
				if first.IsZero() || l.deadline.Before(first) {
					first = l.deadline
				}
			}
		}
		s.batch = true
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			rctx, cancel := context.WithDeadline(ctx, first)
			defer cancel()
			start := time.Now()
			res, errs := s.renew(rctx, batch)
			select {
			case s.results <- batchResult{start: start, leases: batch, results: res, errs: errs}:
			case <-ctx.Done():
			}
		}()
	}
	for l := range s.leases {
		if l.TTL > 0 && !l.inFlight && !s.batch {
			earlier(l.next)
		}
	}
	s.wakeAt = next
	if next.IsZero() {
		s.timer.Stop()
	} else {
		s.timer.Reset(time.Until(next))
	}
	return cbs
}

// settle applies the answers of a renewal batch.
func (s *Scheduler) settle(r batchResult) []callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batch = false
	now := time.Now()
	var cbs []callback
	for i, l := range r.leases {
		l.inFlight = false
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
			l.deadline = Deadline(r.start, l.TTL)
			l.next = r.start.Add(l.TTL / 3)
			l.lastErr = nil
			if o, d := l.Owner, l.deadline; o != nil {
				cbs = append(cbs, callback{l, func() { o.Renewed(d) }})
			}
		case NotHeld:
			cbs = append(cbs, s.end(l, Lost))
		default:
			l.lastErr = err
			// Try again soon, but not in a tight loop: a tenth of the TTL, at most a second.
			l.next = now.Add(min(l.TTL/10, time.Second))
			if o := l.Owner; o != nil {
				cbs = append(cbs, callback{l, func() { o.RenewFailed(err) }})
			}
		}
	}
	return cbs
}

// end removes l and returns its Ended call. s.mu must be held.
func (s *Scheduler) end(l *Lease, reason EndReason) callback {
	delete(s.leases, l)
	l.removed = true
	o, err := l.Owner, l.lastErr
	if o == nil {
		return callback{}
	}
	return callback{l, func() { o.Ended(reason, err) }}
}

// run makes the callbacks, one at a time, under cbMu.
func (s *Scheduler) run(cbs []callback) {
	if len(cbs) == 0 {
		return
	}
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	for _, cb := range cbs {
		if cb.f == nil {
			continue
		}
		s.mu.Lock()
		dropped := cb.l.dropped
		s.mu.Unlock()
		if !dropped {
			cb.f()
		}
	}
}
