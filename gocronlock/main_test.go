package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
)

// Schedulers, Guards, electors and servers all start goroutines: none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The acceptance schedule: 3 instances run one job every period, for ticks ticks.
const (
	instances = 3
	period    = 150 * time.Millisecond
	ticks     = 20
	// skew is how far apart the instances' timers fire, at most, on top of the scheduling
	// noise: each reading of an instance's clock is ahead by a random amount up to skew.
	skew = 10 * time.Millisecond
	// hold is the hold window by the rule of docs/scheduling.md: half the period.
	hold = period / 2
)

// lockName returns a lock (and job) name no other test uses.
func lockName(t *testing.T) string {
	return "gocronlock-test:" + strings.ReplaceAll(t.Name(), "/", ":")
}

// newGuard returns a Guard on a new client of the server — a service instance — closed when
// the test ends.
func newGuard(t *testing.T, open func(*testing.T) guard.Backend, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g := guard.New(open(t), opts...)
	t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
	return g
}

// scheduler is a gocron.Scheduler that the test shuts down once, at the latest when it ends.
type scheduler struct {
	gocron.Scheduler
	once sync.Once
}

// newScheduler returns a scheduler with opts, not started.
func newScheduler(t *testing.T, opts ...gocron.SchedulerOption) *scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	require.NoError(t, err)
	sc := &scheduler{Scheduler: s}
	t.Cleanup(func() { sc.shutdown(t) })
	return sc
}

// shutdown stops the scheduler and waits for its running jobs.
func (s *scheduler) shutdown(t *testing.T) {
	s.once.Do(func() { assert.NoError(t, s.Shutdown()) })
}

// skewedClock is the real clock, read ahead by a random amount up to max, a different amount
// at every reading. gocron sets each timer from a reading of its clock, so a scheduler on it
// fires each tick up to max early: the instances' timers fire milliseconds apart, in a
// different order at every tick, as on machines whose clocks are not quite in step.
type skewedClock struct {
	clockwork.Clock
	max time.Duration
}

func (c skewedClock) Now() time.Time { return c.Clock.Now().Add(rand.N(c.max)) }

// withSkew is the scheduler option of a skewed clock.
func withSkew() gocron.SchedulerOption {
	return gocron.WithClock(skewedClock{Clock: clockwork.NewRealClock(), max: skew})
}

// tickLog records the runs of one job, by tick, across the instances. Every run flags itself
// while it runs, so that two runs at once are caught even when each tick ran once.
type tickLog struct {
	t0     time.Time // when tick 0 is due
	period time.Duration

	inside   atomic.Int32 // runs in progress
	overlaps atomic.Int32 // runs that started while another was in progress
	ran      chan int     // the instance of each run, when it ends

	mu     sync.Mutex // protects runs and fences
	runs   map[int][]int
	fences map[int][]uint64
}

func newTickLog(t0 time.Time, period time.Duration) *tickLog {
	return &tickLog{t0: t0, period: period, ran: make(chan int, 1000),
		runs: map[int][]int{}, fences: map[int][]uint64{}}
}

// tick returns the tick that a run starting at at belongs to: the nearest due time. Instances
// fire a few milliseconds apart, far less than half a period.
func (r *tickLog) tick(at time.Time) int {
	return int((at.Sub(r.t0) + r.period/2) / r.period)
}

// task returns the job as instance runs it: it records its tick and its fence (when it runs
// under a lock), works for work, and fails on a context that ends early.
func (r *tickLog) task(instance int, work time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		k := r.tick(time.Now())
		if r.inside.Add(1) > 1 {
			r.overlaps.Add(1)
		}
		defer func() {
			r.inside.Add(-1)
			r.ran <- instance
		}()
		r.mu.Lock()
		r.runs[k] = append(r.runs[k], instance)
		if l, ok := guard.FromContext(ctx); ok {
			r.fences[k] = append(r.fences[k], l.Fence())
		}
		r.mu.Unlock()
		if work <= 0 {
			return ctx.Err()
		}
		tm := time.NewTimer(work)
		defer tm.Stop()
		select {
		case <-tm.C:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// snapshot returns the runs by tick.
func (r *tickLog) snapshot() (runs map[int][]int, fences map[int][]uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.runs), maps.Clone(r.fences)
}

// perTick summarises runs as "tick:instances" in tick order, for the log.
func perTick(runs map[int][]int) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(runs)) {
		fmt.Fprintf(&b, " %d:%v", k, runs[k])
	}
	return strings.TrimSpace(b.String())
}

// byInstance counts the runs of each instance.
func byInstance(runs map[int][]int) map[int]int {
	n := map[int]int{}
	for _, ids := range runs {
		for _, id := range ids {
			n[id]++
		}
	}
	return n
}

// mortal is a backend that can die as its process would: once dead, every call fails without
// reaching the server, and what it holds is never released — its leases run out on the server.
type mortal struct {
	guard.Backend
	dead atomic.Bool
}

var errDead = errors.New("the instance's process died")

func (m *mortal) die() { m.dead.Store(true) }

func (m *mortal) Acquire(ctx context.Context, name, token string, ttl time.Duration) (uint64, error) {
	if m.dead.Load() {
		return 0, errDead
	}
	return m.Backend.Acquire(ctx, name, token, ttl)
}

func (m *mortal) Extend(ctx context.Context, leases []guard.Lease) []error {
	if m.dead.Load() {
		errs := make([]error, len(leases))
		for i := range errs {
			errs[i] = errDead
		}
		return errs
	}
	return m.Backend.Extend(ctx, leases)
}

func (m *mortal) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if m.dead.Load() {
		return errDead
	}
	return m.Backend.Release(ctx, name, token, keep)
}

// Subscribe passes release notifications through when the backend has them.
func (m *mortal) Subscribe(released func(name string)) (guard.Subscription, error) {
	n, ok := m.Backend.(guard.Notifier)
	if !ok {
		return nil, errors.New("no release notifications on this backend")
	}
	return n.Subscribe(released)
}
