package sim

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardlock/guard"
)

// The network between the simulated processes and the server: every request and every reply
// takes a random time on the wire, and the faults the run turns on lose or delay them. A
// request on the wire reaches the server even when its caller's context ends meanwhile (the
// caller then returns at once, as a driver does): what a cancelled release or acquire did is
// unknown to its caller, as it is in production.

// Errors of the simulated network, as a driver reports them.
var (
	errTimeout = errors.New("sim: i/o timeout (no reply)")
	errRefused = errors.New("sim: connection refused (process killed)")
	errWatch   = errors.New("sim: subscribe failed")
)

// faults are the probabilities of each network fault, per request, reply or notice. A run
// changes them over time: calm spells with none, storms with many.
type faults struct {
	lostRequest, lostReply, lateReply, slowRequest float64
	noticeLost, noticeDup, noticeLate              float64
	watchFail, watchSlow                           float64
}

// net is the simulated network's settings.
type netConfig struct {
	minLeg, maxLeg time.Duration // one way, request or reply
	driverTimeout  time.Duration // how long a caller waits for a reply
	late           time.Duration // how late a late reply or a slow request comes
	noticeDelay    time.Duration // the longest a notice takes, when not late
	slowWatch      time.Duration // how long a slow Watch takes
}

// proc is one simulated process: a Guard and the client it talks through. Pausing it freezes
// its network — nothing it sends leaves, nothing sent to it arrives — until it resumes;
// killing it cuts the network for good. Its goroutines run on (a Go program cannot stop
// them): the workload stops starting work in a process that is not running, and the history
// ends its locks' validity when it was killed.
type proc struct {
	id  int
	run *run

	mu      sync.Mutex    // protects gate, dead, closed, stopped, faults and rng
	gate    chan struct{} // closed while the process runs; open while it is paused
	dead    bool
	closed  bool      // its Guard is closing
	stopped time.Time // when it was last paused or killed
	resumed time.Time // when it last resumed
	faults  faults
	rng     *mrand.Rand // the network's draws for this process

	g        *guard.Guard
	watchdog time.Duration // its Guard's watchdog timeout
	sub      *subscription // its Guard's subscription, once opened
}

// running returns the gate to wait on, and whether the process is dead.
func (p *proc) state() (chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate, p.dead
}

// pass waits until the process runs; it reports false when it is dead (or ctx ends first).
func (p *proc) pass(ctx context.Context) bool {
	gate, dead := p.state()
	if dead {
		return false
	}
	select {
	case <-gate:
		_, dead = p.state()
		return !dead
	case <-ctx.Done():
		return false
	}
}

func (p *proc) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
	p.stopped = time.Now()
}

func (p *proc) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
		p.resumed = time.Now()
	}
}

func (p *proc) kill() {
	p.mu.Lock()
	p.dead = true
	p.stopped = time.Now()
	p.mu.Unlock()
	p.resume() // whoever waits on the gate finds it dead
}

// interrupted reports whether p was paused or killed at some time since start.
func (p *proc) interrupted(start time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.stopped.IsZero() && (p.dead || !p.resumed.Before(start) || p.resumed.Before(p.stopped))
}

func (p *proc) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *proc) isDead() bool {
	_, dead := p.state()
	return dead
}

// isRunning reports whether the process is neither paused nor dead.
func (p *proc) isRunning() bool {
	gate, dead := p.state()
	if dead {
		return false
	}
	select {
	case <-gate:
		return true
	default:
		return false
	}
}

// draw returns a random number in [0, 1) from the process's network stream.
func (p *proc) draw() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64()
}

// between returns a random duration in [lo, hi].
func (p *proc) between(lo, hi time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return lo + time.Duration(p.rng.Int64N(int64(hi-lo)+1))
}

func (p *proc) fault() faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// call sends one request that apply runs on the server, and waits for its reply — what apply
// returned — the caller's context, or the driver's timeout.
func (p *proc) call(ctx context.Context, apply func() any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !p.pass(ctx) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errRefused
	}
	cfg, f := &p.run.cfg.Net, p.fault()
	st := &p.run.stats
	st.requests.Add(1)
	lostRequest, lostReply := p.draw() < f.lostRequest, p.draw() < f.lostReply
	count(&st.lostRequests, lostRequest)
	count(&st.lostReplies, lostReply && !lostRequest)
	out := p.between(cfg.minLeg, cfg.maxLeg)
	if p.draw() < f.slowRequest {
		st.slowRequests.Add(1)
		out += p.between(cfg.late/2, cfg.late)
	}
	back := p.between(cfg.minLeg, cfg.maxLeg)
	if p.draw() < f.lateReply {
		st.lateReplies.Add(1)
		back += p.between(cfg.late/2, cfg.late)
	}
	replied := make(chan any, 1)
	if !lostRequest {
		time.AfterFunc(out, func() {
			res := apply()
			if lostReply {
				return
			}
			time.AfterFunc(back, func() {
				if p.pass(context.Background()) {
					replied <- res
				}
			})
		})
	}
	timeout := time.NewTimer(cfg.driverTimeout)
	defer timeout.Stop()
	select {
	case res := <-replied:
		return res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timeout.C:
		return nil, errTimeout
	}
}

func count(c *atomic.Int64, happened bool) {
	if happened {
		c.Add(1)
	}
}

// conn is a process's client of the simulated server: a guard.Backend and guard.Notifier.
type conn struct {
	p *proc
	s *server
}

var (
	_ guard.Backend   = (*conn)(nil)
	_ guard.Notifier  = (*conn)(nil)
	_ guard.Sharing   = (*conn)(nil)
	_ guard.Batcher   = (*conn)(nil)
	_ guard.Inspector = (*conn)(nil)
)

// Inspect reports the newest holder of name, in one request.
func (c *conn) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	res, err := c.p.call(ctx, func() any { return c.s.inspect(name) })
	if err != nil {
		return guard.LockInfo{}, err
	}
	return res.(guard.LockInfo), nil
}

// List is not simulated: it lists nothing.
func (c *conn) List(context.Context, string, string, int) ([]guard.LockInfo, string, error) {
	return nil, "", nil
}

// ForceRelease frees every holder of name (the operator's fault does it on the server).
func (c *conn) ForceRelease(ctx context.Context, name string, _ uint64) error {
	res, err := c.p.call(ctx, func() any { return c.s.force(name) })
	if err != nil {
		return err
	}
	if res == nil {
		return nil
	}
	return res.(error)
}

// SharedLocks tells that the simulated server grants shared holds.
func (*conn) SharedLocks() {}

// AcquireAll tries every request at once, all or none, in one request.
func (c *conn) AcquireAll(ctx context.Context, reqs []guard.Request) ([]uint64, error) {
	c.p.run.stats.acquires.Add(1)
	type answer struct {
		fences []uint64
		err    error
	}
	res, err := c.p.call(ctx, func() any {
		fences, err := c.s.acquireAll(reqs)
		return answer{fences, err}
	})
	if err != nil {
		return nil, err
	}
	a := res.(answer)
	return a.fences, a.err
}

func (c *conn) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	c.p.run.stats.acquires.Add(1)
	type answer struct {
		fence uint64
		err   error
	}
	res, err := c.p.call(ctx, func() any {
		fence, err := c.s.acquire(r)
		return answer{fence, err}
	})
	if err != nil {
		return 0, err
	}
	a := res.(answer)
	return a.fence, a.err
}

func (c *conn) Extend(ctx context.Context, leases []guard.Lease) []error {
	c.p.run.stats.extendCalls.Add(1)
	res, err := c.p.call(ctx, func() any { return c.s.extend(leases) })
	if err != nil {
		errs := make([]error, len(leases))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return res.([]error)
}

func (c *conn) Release(ctx context.Context, name, token string, keep time.Duration) error {
	c.p.run.stats.releases.Add(1)
	res, err := c.p.call(ctx, func() any { return c.s.release(name, token, keep) })
	if err != nil {
		return err
	}
	if res == nil {
		return nil
	}
	return res.(error)
}

// Subscribe opens the process's subscription: notices come in order, each after its delay,
// lost, duplicated or late as the process's faults say.
func (c *conn) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	sub := &subscription{p: c.p, s: c.s, notify: notify, names: make(map[string]bool),
		queue: make(chan timedNotice, 4096), done: make(chan struct{})}
	c.s.mu.Lock()
	c.s.subs[sub] = struct{}{}
	c.s.mu.Unlock()
	c.p.mu.Lock()
	c.p.sub = sub
	c.p.mu.Unlock()
	go sub.loop()
	return sub, nil
}

type timedNotice struct {
	n  guard.Notice
	at time.Time
}

// subscription is a process's stream of notices.
type subscription struct {
	p      *proc
	s      *server
	notify func(guard.Notice)

	mu     sync.Mutex // protects names, closed and last
	names  map[string]bool
	closed bool
	last   time.Time // when the last notice is due: they come in order

	queue chan timedNotice
	done  chan struct{}
}

func (sub *subscription) watches(name string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.names[name] && !sub.closed
}

// deliver queues n for the process, with its delay and faults.
func (sub *subscription) deliver(n guard.Notice) {
	f := sub.p.fault()
	if sub.p.draw() < f.noticeLost {
		sub.p.run.stats.noticesLost.Add(1)
		return
	}
	copies := 1
	if sub.p.draw() < f.noticeDup {
		copies = 2
		sub.p.run.stats.noticesDuplicated.Add(1)
	}
	delay := sub.p.between(0, sub.p.run.cfg.Net.noticeDelay)
	if sub.p.draw() < f.noticeLate {
		sub.p.run.stats.noticesLate.Add(1)
		delay += sub.p.between(sub.p.run.cfg.Net.late/2, sub.p.run.cfg.Net.late)
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.closed {
		return
	}
	at := time.Now().Add(delay)
	if at.Before(sub.last) {
		at = sub.last
	}
	sub.last = at
	for range copies {
		select {
		case sub.queue <- timedNotice{n, at}:
		default: // a subscriber that fell that far behind loses notices
		}
	}
}

func (sub *subscription) loop() {
	for {
		select {
		case tn := <-sub.queue:
			if d := time.Until(tn.at); d > 0 {
				select {
				case <-time.After(d):
				case <-sub.done:
					return
				}
			}
			if !sub.p.pass(context.Background()) {
				continue // dead: lost
			}
			if sub.watches(tn.n.Name) {
				sub.notify(tn.n)
			}
		case <-sub.done:
			return
		}
	}
}

// Watch confirms the watch of name after a round trip — or a slow one, or fails — as the
// process's faults say.
func (sub *subscription) Watch(ctx context.Context, name string) error {
	f := sub.p.fault()
	if !sub.p.pass(ctx) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errRefused
	}
	d := sub.p.between(2*sub.p.run.cfg.Net.minLeg, 2*sub.p.run.cfg.Net.maxLeg)
	if sub.p.draw() < f.watchSlow {
		sub.p.run.stats.slowWatches.Add(1)
		d += sub.p.run.cfg.Net.slowWatch
	}
	fail := sub.p.draw() < f.watchFail
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	if fail {
		sub.p.run.stats.watchFailures.Add(1)
		return errWatch
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.closed {
		return errWatch
	}
	sub.names[name] = true
	return nil
}

func (sub *subscription) Unwatch(name string) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	delete(sub.names, name)
}

func (sub *subscription) Close() error {
	sub.mu.Lock()
	if !sub.closed {
		sub.closed = true
		close(sub.done)
	}
	sub.mu.Unlock()
	sub.s.mu.Lock()
	delete(sub.s.subs, sub)
	sub.s.mu.Unlock()
	return nil
}
