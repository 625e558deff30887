package sim

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/guardlock/guard"
)

// worker is one goroutine of a process: it takes a random name in one of the ways a Guard
// offers, holds it for a while — extending it, re-entering it — and releases it, again and
// again, until the run stops or its process is killed or closed. A paused process's workers
// start nothing new.
type worker struct {
	p        *proc
	rng      *mrand.Rand // this worker's own stream: its choices do not depend on others'
	watchdog time.Duration
	election *guard.Election // its own: Campaign while leading returns the term it leads
}

func (w *worker) loop() {
	r := w.p.run
	for !r.stopped.Load() {
		if w.p.isDead() || w.p.isClosed() {
			return
		}
		if !w.p.isRunning() {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		w.step()
		time.Sleep(w.between(0, 20*time.Millisecond))
	}
}

func (w *worker) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func (w *worker) chance(p float64) bool { return w.rng.Float64() < p }

// step makes one acquisition and, when it is granted, holds and releases the lock.
func (w *worker) step() {
	r, g := w.p.run, w.p.g
	name := r.names[w.rng.IntN(len(r.names))]
	kind := w.rng.Float64()
	switch {
	case kind < 0.10:
		name = permitName
	case kind < 0.22:
		name = rwName
	case kind < 0.28:
		name = termName
	}
	ttl, fixed := w.watchdog, false
	var opts []guard.LockOption
	if w.chance(0.4) {
		ttl, fixed = w.between(minLease, maxLease), true
		opts = append(opts, guard.LeaseTime(ttl))
	}
	var minHold time.Duration
	if w.chance(0.15) {
		minHold = w.between(10*time.Millisecond, maxMinHold)
		if fixed {
			minHold = min(minHold, ttl)
		}
		opts = append(opts, guard.MinHold(minHold))
	}
	spec := &acquisition{proc: w.p.id, name: name, ttl: ttl, fixed: fixed, minHold: minHold}

	// The primitive: a mutex (Acquire, TryAcquire, Do, AcquireAll), a permit, a read or
	// write side, a term.
	acquire := func(ctx context.Context, try bool, opts ...guard.LockOption) (*guard.Lock, error) {
		if try {
			return g.TryAcquire(ctx, name, opts...)
		}
		return g.Acquire(ctx, name, opts...)
	}
	switch name {
	case permitName:
		sem, err := g.Semaphore(name, r.permits)
		if err != nil {
			r.hist.violation("Semaphore: " + err.Error())
			return
		}
		spec.shared, spec.limit = true, r.permits
		acquire = func(ctx context.Context, try bool, opts ...guard.LockOption) (*guard.Lock, error) {
			if try {
				return sem.TryAcquire(ctx, opts...)
			}
			return sem.Acquire(ctx, opts...)
		}
	case rwName:
		rw, err := g.RWMutex(name)
		if err != nil {
			r.hist.violation("RWMutex: " + err.Error())
			return
		}
		write := w.chance(0.25)
		spec.shared = !write
		acquire = func(ctx context.Context, try bool, opts ...guard.LockOption) (*guard.Lock, error) {
			if try {
				opts = append(opts, guard.WaitTime(0))
			}
			if write {
				return rw.Lock(ctx, opts...)
			}
			return rw.RLock(ctx, opts...)
		}
	case termName:
		acquire = func(ctx context.Context, try bool, opts ...guard.LockOption) (*guard.Lock, error) {
			if try {
				opts = append(opts, guard.WaitTime(0))
			}
			return w.election.Campaign(ctx, instance(w.p.id), opts...)
		}
	default:
		if w.chance(0.15) {
			w.all(spec, opts)
			return
		}
		if w.chance(0.25) {
			w.do(spec, opts)
			return
		}
	}
	ctx := context.Background()
	var bound time.Duration // how long the call may take, when bounded
	what := "acquire"
	start := time.Now()
	var l *guard.Lock
	var err error
	switch k := w.rng.Float64(); {
	case k < 0.25:
		l, err = acquire(ctx, true, opts...)
		bound, what = r.cfg.Net.driverTimeout+10*time.Millisecond, "TryAcquire"
	case k < 0.55:
		wait := w.between(10*time.Millisecond, time.Second)
		l, err = acquire(ctx, false, append(opts, guard.WaitTime(wait))...)
		bound, what = wait+2*r.cfg.Net.driverTimeout+10*time.Millisecond, "Acquire(WaitTime)"
	default:
		d := w.between(time.Millisecond, 2*time.Second)
		var cancel context.CancelFunc
		if w.chance(0.3) {
			ctx, cancel = context.WithCancel(ctx) // cancelled at any point of the wait
			t := time.AfterFunc(d, cancel)
			defer t.Stop()
			r.stats.cancelledWaits.Add(1)
		} else {
			ctx, cancel = context.WithTimeout(ctx, d)
		}
		defer cancel()
		l, err = acquire(ctx, false, opts...)
		bound, what = d+5*time.Millisecond, "Acquire(ctx)"
	}
	end := time.Now()
	if err == nil || errors.Is(err, guard.ErrClosed) {
		// The Observer's AcquireEnd may have released the lock already, on this goroutine;
		// a lock granted as its Guard closed is given back before Acquire returns.
		bound += 2 * r.cfg.Net.driverTimeout
	}
	r.hist.waited(wait{proc: w.p.id, name: name, start: start, end: end})
	if err != nil {
		what += ": " + err.Error()
	}
	r.hist.called(call{what: what, proc: w.p.id, start: start, end: end, bound: bound, interrupted: w.p.interrupted(start)})
	if err != nil {
		w.expect(err)
		return
	}
	w.hold(l, spec, ctx)
}

// expect reports an acquisition error that no workload should see.
func (w *worker) expect(err error) {
	switch {
	case errors.Is(err, guard.ErrNotAcquired), errors.Is(err, guard.ErrClosed):
	case errors.Is(err, errTimeout), errors.Is(err, errRefused), errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
	default:
		var op *guard.OpError
		if !errors.As(err, &op) {
			w.p.run.hist.violation("unexpected acquire error: " + err.Error())
		}
	}
}

// granted records the grant of l.
func (w *worker) granted(l *guard.Lock, spec *acquisition) *acquisition {
	r := w.p.run
	a := *spec
	a.token, a.fence, a.at = l.Token(), l.Fence(), time.Now()
	r.hist.acquired(&a)
	r.stats.acquisitions.Add(1)
	context.AfterFunc(l.Context(), func() {
		cause := context.Cause(l.Context())
		r.hist.ended(&a, time.Now(), cause, errors.Is(cause, guard.ErrLockLost) || errors.Is(cause, guard.ErrLeaseExpired))
	})
	return &a
}

// hold holds l for a while, maybe extending and re-entering it, then releases it — sometimes
// with a context that ends while the release is on the wire.
func (w *worker) hold(l *guard.Lock, spec *acquisition, ctx context.Context) {
	r := w.p.run
	w.granted(l, spec)
	hold := w.holdTime(spec)
	extend := r.cfg.ExtendChance
	if extend == 0 {
		extend = 0.3
	}
	if spec.fixed && w.chance(extend) {
		w.sleep(l, hold/2)
		hold -= hold / 2
		r.stats.extends.Add(1)
		_ = l.Extend(ctx, w.between(20*time.Millisecond, 400*time.Millisecond))
	}
	if w.chance(0.1) && l.Err() == nil {
		inner, err := w.p.g.Acquire(l.Context(), spec.name, guard.WaitTime(0))
		if err == nil {
			r.stats.reentries.Add(1)
			if !inner.Reentrant() {
				r.hist.violation("a re-entry under a live lock was not reentrant")
			}
			_ = inner.Release(ctx)
		}
	}
	w.sleep(l, hold)
	rctx := context.Background()
	if w.chance(0.1) {
		var cancel context.CancelFunc
		rctx, cancel = context.WithCancel(rctx)
		t := time.AfterFunc(w.between(0, 2*r.cfg.Net.maxLeg), cancel)
		defer t.Stop()
		defer cancel()
		r.stats.cancelledReleases.Add(1)
	}
	start := time.Now()
	_ = l.Release(rctx)
	r.hist.called(call{what: "release", proc: w.p.id, start: start, end: time.Now(),
		bound: 2*r.cfg.Net.driverTimeout + 10*time.Millisecond, interrupted: w.p.interrupted(start)})
}

// holdTime is how long to hold a lock: mostly short, sometimes past its lease.
func (w *worker) holdTime(spec *acquisition) time.Duration {
	if w.chance(0.15) {
		return w.between(spec.ttl/2, spec.ttl+spec.ttl/3)
	}
	return w.between(0, spec.ttl/5)
}

// sleep sleeps for d, or until l's context ends.
func (w *worker) sleep(l *guard.Lock, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.Done():
	}
}

// all takes this name and another one at once (AcquireAll), holds them, and releases them.
func (w *worker) all(spec *acquisition, opts []guard.LockOption) {
	r := w.p.run
	names := []string{spec.name, r.names[w.rng.IntN(len(r.names))]}
	d := w.between(10*time.Millisecond, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	l, err := w.p.g.AcquireAll(ctx, names, opts...)
	r.stats.multi.Add(1)
	// A member granted as the context ends, or as the Guard closes, is given back first.
	r.hist.called(call{what: "AcquireAll", proc: w.p.id, start: start, end: time.Now(),
		bound: d + 4*r.cfg.Net.driverTimeout + 10*time.Millisecond, interrupted: w.p.interrupted(start)})
	if err != nil {
		w.expect(err)
		return
	}
	for _, m := range l.Members() {
		member := *spec
		member.name = m.Name()
		w.granted(m, &member)
		if l.Deadline().After(m.Deadline()) {
			r.hist.violation("a multi-lock's deadline is later than one of its members'")
		}
	}
	w.sleep(l, w.holdTime(spec))
	_ = l.Release(context.Background())
	for _, m := range l.Members() {
		if m.Err() == nil {
			r.hist.violation(fmt.Sprintf("a member of a released multi-lock is still live: %s fence %d reentrant %t group err %v",
				m.Name(), m.Fence(), m.Reentrant(), l.Err()))
		}
	}
}

// do runs the acquisition as Do, with the work inside.
func (w *worker) do(spec *acquisition, opts []guard.LockOption) {
	_ = w.p.g.Do(context.Background(), spec.name, func(ctx context.Context) error {
		l, ok := guard.FromContext(ctx)
		if !ok {
			w.p.run.hist.violation("Do ran its function without the lock in its context")
			return nil
		}
		w.granted(l, spec)
		w.sleep(l, w.holdTime(spec))
		return nil
	}, append(opts, guard.WaitTime(w.between(0, 500*time.Millisecond)))...)
}

// observer is a process's Guard's Observer. It calls back into the Guard as observers may: it
// reads the lock it is given in AcquireEnd, sometimes releases it there, adds a value to the
// lock's context, and releases a lock whose loss it hears of.
type observer struct {
	p   *proc
	mu  sync.Mutex // protects rng
	rng *mrand.Rand
}

type observerKey struct{}

func (o *observer) chance(p float64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.rng.Float64() < p
}

func (o *observer) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context {
	return ctx
}

func (o *observer) AcquireEnd(ctx context.Context, _ *guard.Acquisition, l *guard.Lock, _ error) context.Context {
	if l == nil {
		return ctx
	}
	if l.Context() == nil || (l.Err() == nil && l.Context().Err() != nil) {
		o.p.run.hist.violation("the Lock given to AcquireEnd is not whole")
	}
	if o.chance(0.01) {
		o.p.run.stats.observerReleases.Add(1)
		_ = l.Release(ctx)
	}
	if o.chance(0.5) {
		return context.WithValue(ctx, observerKey{}, l.Fence())
	}
	return ctx
}

func (o *observer) LockEvent(l *guard.Lock, e guard.LockEvent) {
	if e.Kind == guard.EventLost && o.chance(0.5) {
		_ = l.Release(context.Background())
	}
}
