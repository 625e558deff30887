package gocronlock_test

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
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
	// A period of 400 ms leaves a run 200 ms of lateness (its hold window) before the next
	// tick finds the name still held: a loaded CI machine (two cores, the race detector, other
	// packages' servers) started runs 182 ms late with 200 ms periods.
	period = 400 * time.Millisecond
	ticks  = 12
	// startLead is how long after a fleet starts its first tick is due: time to connect its
	// clients and create the SQL stores' tables, on a loaded machine.
	startLead = 1500 * time.Millisecond
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

// splay waits a random time up to skew, or until ctx ends: an instance's timer firing later
// than another's, by a different amount at every tick, as on machines whose clocks are not
// quite in step. (A skewed gocron clock would do the same, but gocron also reads it to tell
// which of a job's ticks are past, and a clock that jumps at every reading confuses that.)
func splay(ctx context.Context) error {
	t := time.NewTimer(mrand.N(skew))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// splayedLocker is a gocron.Locker that asks for the lock after a splay.
type splayedLocker struct{ gocron.Locker }

func (l splayedLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if err := splay(ctx); err != nil {
		return nil, err
	}
	return l.Locker.Lock(ctx, key)
}

// splayedElector is a gocron.Elector that answers after a splay.
type splayedElector struct{ gocron.Elector }

func (e splayedElector) IsLeader(ctx context.Context) error {
	if err := splay(ctx); err != nil {
		return err
	}
	return e.Elector.IsLeader(ctx)
}

// mortal is a backend that can die as its process would: once dead, every call fails without
// reaching the server, and what it holds is never released — its leases run out on the server.
type mortal struct {
	guard.Backend
	dead atomic.Bool
}

var errDead = errors.New("the instance's process died")

func (m *mortal) die() { m.dead.Store(true) }

func (m *mortal) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if m.dead.Load() {
		return 0, errDead
	}
	return m.Backend.Acquire(ctx, r)
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
func (m *mortal) Subscribe(released func(guard.Notice)) (guard.Subscription, error) {
	n, ok := m.Backend.(guard.Notifier)
	if !ok {
		return nil, errors.New("no release notifications on this backend")
	}
	return n.Subscribe(released)
}

// Inspect, List and ForceRelease pass through to the backend: an Elector's election reads who
// leads.
func (m *mortal) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	return m.Backend.(guard.Inspector).Inspect(ctx, name)
}

func (m *mortal) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	return m.Backend.(guard.Inspector).List(ctx, prefix, cursor, limit)
}

func (m *mortal) ForceRelease(ctx context.Context, name string, fence uint64) error {
	return m.Backend.(guard.Inspector).ForceRelease(ctx, name, fence)
}
