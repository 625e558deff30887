package sim

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardlock/guard"
)

// Config is one simulated run.
type Config struct {
	Seed         uint64
	Procs        int           // processes at a time, each with a Guard of its own
	Goroutines   int           // workers per process
	Names        int           // lock names they contend for
	Acquisitions int           // the run ends after this many grants...
	Duration     time.Duration // ...or this much simulated time
	Faults       bool          // inject faults
	QueueTimeout time.Duration // the server's longest place in a queue
	// LongPlaces is a control: the server keeps a waiter's place for QueueTimeout whatever
	// lease it asked for, as before issue 16. The checks must catch it.
	LongPlaces bool
	// ExtendChance is how often a holder of a fixed lease extends it halfway through its hold;
	// 0: 0.3.
	ExtendChance float64
	// Trail keeps a log of what the server did with each name, printed with a violation of
	// bound (c); off by default, as it costs memory over a long run.
	Trail bool
	Net   netConfig
}

// DefaultConfig returns the configuration of the CI runs for seed.
func DefaultConfig(seed uint64) Config {
	return Config{
		Seed: seed, Procs: 4, Goroutines: 4, Names: 2,
		Acquisitions: 10000, Duration: 10 * time.Minute,
		Faults: true, QueueTimeout: time.Duration(100+seed%5*100) * time.Millisecond,
		Net: netConfig{
			minLeg: 50 * time.Microsecond, maxLeg: time.Millisecond,
			driverTimeout: 500 * time.Millisecond, late: 450 * time.Millisecond,
			noticeDelay: 2 * time.Millisecond, slowWatch: 300 * time.Millisecond,
		},
	}
}

// The names of the primitives; the mutexes' are n0, n1, …
const (
	permitName = "semaphore"
	rwName     = "rwmutex"
	termName   = "election"
)

// Bounds of the workload, which the checks use.
const (
	minWatchdog, maxWatchdog = 100 * time.Millisecond, 400 * time.Millisecond
	minLease, maxLease       = 30 * time.Millisecond, 300 * time.Millisecond
	maxMinHold               = 200 * time.Millisecond
)

// stats counts what a run did.
type stats struct {
	acquisitions, attempts                    atomic.Int64
	acquires, extendCalls, releases           atomic.Int64
	requests, lostRequests, lostReplies       atomic.Int64
	lateReplies, slowRequests                 atomic.Int64
	noticesLost, noticesDuplicated            atomic.Int64
	noticesLate, watchFailures, slowWatches   atomic.Int64
	pauses, kills, restarts, forced, closes   atomic.Int64
	extends, reentries, observerReleases      atomic.Int64
	cancelledReleases, cancelledWaits, stormy atomic.Int64
	multi                                     atomic.Int64
}

// run is one simulated run in progress.
type run struct {
	cfg    Config
	epoch  time.Time
	server *server
	hist   *history
	stats  stats
	names  []string

	mu     sync.Mutex // protects procs, all, nextID and plan
	procs  []*proc    // the processes in play
	all    []*proc    // every process ever started, for the teardown
	nextID int
	plan   *mrand.Rand // the fault plan's draws

	permits int // the semaphore's

	stopped atomic.Bool
	workers sync.WaitGroup
	checks  sync.WaitGroup // bound (d)'s checks after a kill
}

// Run simulates cfg inside the calling synctest bubble and returns its report.
func Run(cfg Config) *Report {
	r := &run{cfg: cfg, epoch: time.Now(), hist: &history{keepTrail: cfg.Trail}, plan: mrand.New(mrand.NewPCG(cfg.Seed, 1))}
	rate := 0.0
	if cfg.Faults {
		rate = (r.plan.Float64() - 0.5) / 50 // the server's clock runs up to 1% fast or slow: what watchdog.Drift allows
	}
	r.server = newServer(r.epoch, rate, cfg.QueueTimeout, cfg.LongPlaces, r.hist)
	for i := range cfg.Names {
		r.names = append(r.names, fmt.Sprintf("n%d", i))
	}
	r.permits = 1 + int(cfg.Seed%3)
	for range cfg.Procs {
		r.start()
	}
	chaos := make(chan struct{})
	go func() {
		defer close(chaos)
		r.chaos()
	}()
	deadline := r.epoch.Add(cfg.Duration)
	for r.stats.acquisitions.Load() < int64(cfg.Acquisitions) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	r.stopped.Store(true)
	<-chaos
	r.mu.Lock()
	for _, p := range r.all {
		p.resume()
	}
	r.mu.Unlock()
	r.workers.Wait()
	r.checks.Wait()
	end := time.Now()
	r.mu.Lock()
	all := r.all
	r.mu.Unlock()
	for _, p := range all {
		if p.isDead() {
			continue
		}
		r.close(p, false)
	}
	for _, p := range all {
		if p.isDead() {
			_ = p.g.Close(context.Background()) // a killed process's goroutines, for the bubble
		}
	}
	r.server.finish(end)
	return check(r, end)
}

// start starts a new process with its workers.
func (r *run) start() *proc {
	r.mu.Lock()
	id := r.nextID
	r.nextID++
	seed := r.plan.Uint64()
	r.mu.Unlock()
	rng := mrand.New(mrand.NewPCG(seed, 3))
	watchdog := minWatchdog + time.Duration(rng.Int64N(int64(maxWatchdog-minWatchdog)))
	p := &proc{id: id, run: r, gate: make(chan struct{}), rng: mrand.New(mrand.NewPCG(seed, 2)), watchdog: watchdog}
	close(p.gate)
	p.g = guard.New(&conn{p: p, s: r.server}, guard.WithWatchdogTimeout(watchdog),
		guard.WithInstance(instance(id)), guard.WithObserver(&observer{p: p, rng: rng}))
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.all = append(r.all, p)
	r.mu.Unlock()
	for i := range r.cfg.Goroutines {
		w := &worker{p: p, rng: mrand.New(mrand.NewPCG(seed, uint64(10+i))), watchdog: watchdog}
		var err error
		if w.election, err = guard.NewElection(p.g, termName); err != nil {
			panic(err) // the simulated server inspects
		}
		r.workers.Go(w.loop)
	}
	return p
}

func instance(id int) string { return fmt.Sprintf("p%d", id) }

// close closes p's Guard, as a process that shuts down does, and records how long it took.
func (r *run) close(p *proc, replace bool) {
	r.mu.Lock()
	for i, q := range r.procs {
		if q == p {
			r.procs = append(r.procs[:i], r.procs[i+1:]...)
			break
		}
	}
	r.mu.Unlock()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	start := time.Now()
	_ = p.g.Close(context.Background())
	r.hist.called(call{what: "close", proc: p.id, start: start, end: time.Now(), bound: closeBound(&r.cfg)})
	if replace && !r.stopped.Load() {
		r.start()
	}
}

// pick returns a process in play that runs, or nil.
func (r *run) pick() *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	var live []*proc
	for _, p := range r.procs {
		if p.isRunning() {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[r.plan.IntN(len(live))]
}

func (r *run) between(lo, hi time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return lo + time.Duration(r.plan.Int64N(int64(hi-lo)+1))
}

func (r *run) chance(p float64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.plan.Float64() < p
}

// chaos runs the fault plan: calm spells and storms, one after the other. In a storm the
// network loses and delays requests, replies and notices and fails watches, and one more
// fault may strike: a process paused past its lease or killed, the server restarted with its
// state lost, an operator's forced release, a process closed and replaced.
func (r *run) chaos() {
	for !r.stopped.Load() {
		time.Sleep(r.between(time.Second, 6*time.Second)) // calm
		if !r.cfg.Faults || r.stopped.Load() {
			continue
		}
		r.stats.stormy.Add(1)
		from := time.Now()
		storm := r.between(300*time.Millisecond, 1500*time.Millisecond)
		f := faults{}
		if r.chance(0.7) {
			f = faults{
				lostRequest: 0.02, lostReply: 0.02, lateReply: 0.02, slowRequest: 0.02,
				noticeLost: 0.1, noticeDup: 0.05, noticeLate: 0.05, watchFail: 0.2, watchSlow: 0.2,
			}
		}
		r.setFaults(f)
		switch k := r.between(0, 9); {
		case k <= 2:
			r.pause(storm)
		case k == 3:
			r.kill()
		case k == 4:
			r.server.restart()
			r.stats.restarts.Add(1)
		case k <= 6:
			r.force()
		case k == 7:
			if p := r.pick(); p != nil {
				r.stats.closes.Add(1)
				r.close(p, true)
			}
		}
		time.Sleep(storm)
		r.setFaults(faults{})
		r.hist.faultSpan(from, time.Now())
	}
}

func (r *run) setFaults(f faults) {
	r.mu.Lock()
	procs := append([]*proc(nil), r.all...)
	r.mu.Unlock()
	for _, p := range procs {
		p.mu.Lock()
		p.faults = f
		p.mu.Unlock()
	}
}

// maxAsk is the longest lease a process asks for: its watchdog's, or a LeaseTime.
func maxAsk(p *proc) time.Duration { return max(p.watchdog, maxLease) }

// pause stops p's network for longer than its longest lease — at least storm — and checks,
// once its longest lease could have run out, that the server keeps nothing of it: no lock,
// no place in a queue.
func (r *run) pause(storm time.Duration) {
	p := r.pick()
	if p == nil {
		return
	}
	r.stats.pauses.Add(1)
	ask := maxAsk(p)
	d := max(storm, ask+r.between(ask/4, ask))
	from := time.Now()
	p.pause()
	r.blocksNoLonger(p, from, ask)
	time.Sleep(max(d-time.Since(from), 0))
	p.resume()
	r.hist.procEvent(procEvent{proc: p.id, from: from, to: time.Now(), maxAsk: ask})
}

// kill kills a process for good — its Guard is never closed — and starts another in its place.
func (r *run) kill() {
	p := r.pick()
	if p == nil {
		return
	}
	r.stats.kills.Add(1)
	from := time.Now()
	p.kill()
	r.mu.Lock()
	for i, q := range r.procs {
		if q == p {
			r.procs = append(r.procs[:i], r.procs[i+1:]...)
			break
		}
	}
	r.mu.Unlock()
	ask := maxAsk(p)
	r.hist.procEvent(procEvent{proc: p.id, from: from, maxAsk: ask})
	r.checks.Go(func() { r.blocksNoLonger(p, from, ask) })
	if !r.stopped.Load() {
		r.start()
	}
}

// blocksNoLonger checks bound (d): by the time p's longest lease and a request still on the
// wire could have run out after from, the server keeps no lock and no place of p.
func (r *run) blocksNoLonger(p *proc, from time.Time, ask time.Duration) {
	slack := r.cfg.Net.maxLeg + r.cfg.Net.late + 5*time.Millisecond
	time.Sleep(ask + slack)
	if p.isRunning() {
		return // resumed already
	}
	inst := instance(p.id)
	if name, ok := r.server.ownsInstance(inst); ok {
		r.hist.violation(fmt.Sprintf("(d) process %s, stopped at %v, still holds or waits for %q %v later (its longest lease: %v)",
			inst, r.since(from), name, time.Since(from), ask))
	}
}

// force breaks the lock of a random name, as an operator's ForceRelease does.
func (r *run) force() {
	r.mu.Lock()
	name := r.names[r.plan.IntN(len(r.names))]
	r.mu.Unlock()
	if r.server.force(name) == nil {
		r.stats.forced.Add(1)
		r.hist.force(name, time.Now())
	}
}

func (r *run) since(t time.Time) time.Duration { return t.Sub(r.epoch) }
