package gocronlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/gocronlock"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
)

// schedule is what a fleet of instances runs: one job every period, until each instance has
// fired ticks ticks; each run works for work.
type schedule struct {
	period time.Duration
	ticks  int
	work   time.Duration
}

// runFleet runs the schedule on 3 instances — each with its own Guard on a new client of the
// server, its own Locker with opts and its own gocron scheduler — whose timers fire up to skew
// apart, and returns the runs once every instance has fired every tick.
func runFleet(t *testing.T, open func(*testing.T) guard.Backend, sc schedule, opts ...guard.LockOption) *guardtest.TickLog {
	t.Helper()
	name := lockName(t)
	t0 := time.Now().Add(startLead) // time to connect the clients
	log := guardtest.NewTickLog(t0, sc.period)
	fired := make(chan int, instances*(sc.ticks+20)) // each instance, at each tick it fired
	var fleet []*scheduler
	for i := range instances {
		g := guardtest.Instance(t, open)
		locker, err := gocronlock.NewLocker(g, opts...)
		require.NoError(t, err)
		s := newScheduler(t, gocron.WithDistributedLocker(splayedLocker{locker}))
		var job gocron.Job
		// The tick a run is for: gocron sets the next tick before the task runs.
		scheduled := func() time.Time {
			next, err := job.NextRun()
			assert.NoError(t, err)
			return next.Add(-sc.period)
		}
		job, err = s.NewJob(gocron.DurationJob(sc.period),
			gocron.NewTask(locker.Func(log.Task(i, sc.work, scheduled))),
			gocron.WithName(name),
			gocron.WithStartAt(gocron.WithStartDateTime(t0)),
			gocron.WithEventListeners(
				gocron.AfterJobRuns(func(uuid.UUID, string) { fired <- i }),
				gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
					t.Errorf("instance %d: the job failed: %v", i, err)
					fired <- i
				}),
				gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
					if !errors.Is(err, guard.ErrNotAcquired) {
						t.Errorf("instance %d: lock: %v", i, err)
					}
					fired <- i
				}),
			))
		require.NoError(t, err)
		fleet = append(fleet, s)
	}
	for _, s := range fleet {
		s.Start()
	}

	count := make([]int, instances)
	timeout := time.NewTimer(time.Until(t0) + time.Duration(sc.ticks)*sc.period + 30*time.Second)
	defer timeout.Stop()
	for done := 0; done < instances; {
		select {
		case i := <-fired:
			if count[i]++; count[i] == sc.ticks {
				done++
			}
		case <-timeout.C:
			t.Fatalf("the instances fired %v of %d ticks", count, sc.ticks)
		}
	}
	for _, s := range fleet {
		s.shutdown(t)
	}
	return log
}

// Acceptance: 3 schedulers on each backend, a job every 200 ms for 20 ticks, timers a few
// milliseconds apart: every tick runs exactly once, also when the job takes only 2 ms.
func TestLockerOncePerTick(t *testing.T) {
	for _, srv := range guardtest.Servers() {
		t.Run(srv.Name, func(t *testing.T) {
			open := srv.Start(t)
			for _, c := range []struct {
				name string
				work time.Duration
			}{
				{"instant", 0},
				{"2ms", 2 * time.Millisecond},
			} {
				t.Run(c.name, func(t *testing.T) {
					log := runFleet(t, open, schedule{period: period, ticks: ticks, work: c.work}, guard.MinHold(hold))
					log.RequireOncePerTick(t, ticks)
				})
			}
		})
	}
}

// The control: without a hold window, the instances whose timers fire a few milliseconds later
// find a 2 ms job finished and its lock free, and run the tick again. This is what MinHold is
// for, and shows that the test above can fail.
func TestLockerWithoutHoldRunsTicksAgain(t *testing.T) {
	store := memstore.New()
	log := runFleet(t, func(*testing.T) guard.Backend { return store },
		schedule{period: period, ticks: ticks, work: 2 * time.Millisecond}, guard.MinHold(0))
	log.Log(t)
	assert.Positive(t, log.RanTwice(), "no tick ran twice without a hold window")
	assert.Zero(t, log.Overlaps(), "the lock still keeps runs apart")
}

// The default hold window suits a job that runs once a second.
func TestLockerDefaultHold(t *testing.T) {
	store := memstore.New()
	const n = 4
	log := runFleet(t, func(*testing.T) guard.Backend { return store },
		schedule{period: time.Second, ticks: n, work: 2 * time.Millisecond})
	log.RequireOncePerTick(t, n)
}

// runOnce runs task once at once on a new scheduler with opts, and returns its error.
func runOnce(t *testing.T, task func(context.Context) error, name string, opts ...gocron.SchedulerOption) error {
	t.Helper()
	s := newScheduler(t, opts...)
	result := make(chan error, 1)
	_, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), gocron.NewTask(task),
		gocron.WithName(name),
		gocron.WithEventListeners(
			gocron.AfterJobRuns(func(uuid.UUID, string) { result <- nil }),
			gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { result <- err }),
			gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { result <- err }),
		))
	require.NoError(t, err)
	s.Start()
	defer s.shutdown(t)
	select {
	case err := <-result:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run")
		return nil
	}
}

// The task runs under the lock's context: its fence is there, and when the lease runs out the
// context ends with guard.ErrLeaseExpired and the run fails with it.
func TestLockerFuncRunsUnderTheLock(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	locker, err := gocronlock.NewLocker(g, guard.LeaseTime(100*time.Millisecond), guard.MinHold(50*time.Millisecond))
	require.NoError(t, err)

	var fence uint64
	err = runOnce(t, locker.Func(func(ctx context.Context) error {
		l, ok := guard.FromContext(ctx)
		if !assert.True(t, ok, "no lock in the task's context") {
			return nil
		}
		fence = l.Fence()
		<-ctx.Done()
		return context.Cause(ctx)
	}), "lease", gocron.WithDistributedLocker(locker))
	assert.ErrorIs(t, err, guard.ErrLeaseExpired)
	assert.Equal(t, uint64(1), fence)
}

// A task wrapped by a Locker that does not lock its job does not run.
func TestLockerFuncWithoutLock(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	locker, err := gocronlock.NewLocker(g)
	require.NoError(t, err)
	other, err := gocronlock.NewLocker(g)
	require.NoError(t, err)
	task := locker.Func(func(context.Context) error {
		t.Error("the task ran without its lock")
		return nil
	})
	for _, c := range []struct {
		name string
		opts []gocron.SchedulerOption
	}{
		{"no locker", nil},
		{"another locker", []gocron.SchedulerOption{gocron.WithDistributedLocker(other)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.ErrorIs(t, runOnce(t, task, lockName(t), c.opts...), gocronlock.ErrNoLock)
		})
	}
}

// A busy job is skipped with an error that says so: gocron reports it to AfterLockError.
func TestLockerBusy(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	locker, err := gocronlock.NewLocker(g)
	require.NoError(t, err)
	held, err := g.TryAcquire(t.Context(), "busy")
	require.NoError(t, err)
	defer held.Release(context.Background())

	err = runOnce(t, locker.Func(func(context.Context) error {
		t.Error("the job ran while another instance held it")
		return nil
	}), "busy", gocron.WithDistributedLocker(locker))
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "busy", busy.Name)
}

func TestNewLockerErrors(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	for _, c := range []struct {
		name string
		g    *guard.Guard
		opts []guard.LockOption
		want error
		msg  string
	}{
		{"nil guard", nil, nil, nil, "nil *guard.Guard"},
		{"negative hold", g, []guard.LockOption{guard.MinHold(-time.Second)}, guard.ErrInvalidOption, "MinHold(-1s)"},
		{"hold longer than the lease", g, []guard.LockOption{guard.LeaseTime(time.Second), guard.MinHold(2 * time.Second)},
			guard.ErrInvalidOption, "longer than LeaseTime(1s)"},
		{"default hold longer than the lease", g, []guard.LockOption{guard.LeaseTime(100 * time.Millisecond)},
			guard.ErrInvalidOption, "the default hold conflicts"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := gocronlock.NewLocker(c.g, c.opts...)
			assert.Nil(t, l)
			require.Error(t, err)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			assert.ErrorContains(t, err, c.msg)
		})
	}
	l, err := gocronlock.NewLocker(g)
	require.NoError(t, err)
	assert.PanicsWithValue(t, "guard/gocronlock: Locker.Func(nil)", func() { l.Func(nil) })
}
