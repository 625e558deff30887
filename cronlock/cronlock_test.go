package cronlock_test

import (
	"bytes"
	"context"
	"errors"
	"log"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/cronlock"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
)

// fleet is 3 instances, each with its own Guard on a new client of the server and its own
// cron, that run one job wrapped with SkipIfLocked.
type fleet struct {
	log   *guardtest.TickLog
	fired chan int // each instance, each time its wrapped job returned
	logs  []*logs
	crons []*cron.Cron
}

// startFleet starts the instances: each schedules the job that job returns — given the
// instance and a function that returns the running tick's scheduled time — on the schedule
// that spec (or, when spec is "", a skewed schedule of the log's period) gives; opts go to
// SkipIfLocked.
func startFleet(t *testing.T, open func(*testing.T) guard.Backend, log *guardtest.TickLog, spec string,
	job func(instance int, scheduled func() time.Time) cron.Job, opts ...guard.LockOption) *fleet {
	t.Helper()
	name := lockName(t)
	f := &fleet{log: log, fired: make(chan int, 10000)}
	for i := range instances {
		g := guardtest.Instance(t, open)
		l := &logs{}
		f.logs = append(f.logs, l)
		wrap, err := cronlock.SkipIfLocked(g, name, append(opts, cronlock.Logger(l))...)
		require.NoError(t, err)
		fired := cron.JobWrapper(func(j cron.Job) cron.Job {
			return cron.FuncJob(func() {
				j.Run()
				f.fired <- i
			})
		})
		c := cron.New(cron.WithSeconds())
		t.Cleanup(func() { stop(c) })
		var id cron.EntryID
		// The tick a run is for: cron sets the entry's Prev when it starts the run.
		scheduled := func() time.Time { return c.Entry(id).Prev }
		wrapped := cron.NewChain(fired, wrap).Then(job(i, scheduled))
		if spec == "" {
			id = c.Schedule(skewed{t0: log.Tick0(), period: log.Period()}, wrapped)
		} else {
			id, err = c.AddJob(spec, wrapped)
			require.NoError(t, err)
		}
		f.crons = append(f.crons, c)
	}
	for _, c := range f.crons {
		c.Start()
	}
	return f
}

// wait waits until every instance has fired n times, then stops the crons.
func (f *fleet) wait(t *testing.T, n int) {
	t.Helper()
	count := make([]int, instances)
	timeout := time.NewTimer(time.Until(f.log.Tick0()) + time.Duration(n)*f.log.Period() + 30*time.Second)
	defer timeout.Stop()
	for done := 0; done < instances; {
		select {
		case i := <-f.fired:
			if count[i]++; count[i] == n {
				done++
			}
		case <-timeout.C:
			t.Fatalf("the instances fired %v of %d ticks", count, n)
		}
	}
	for _, c := range f.crons {
		stop(c)
	}
}

// errors returns the errors the instances logged.
func (f *fleet) errors() []error {
	var errs []error
	for _, l := range f.logs {
		_, e := l.snapshot()
		errs = append(errs, e...)
	}
	return errs
}

// Acceptance: 3 crons on each backend, a job every 200 ms for 20 ticks, timers up to 10 ms
// apart: every tick runs exactly once, also when the job takes only 2 ms.
func TestOncePerTick(t *testing.T) {
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
					log := guardtest.NewTickLog(time.Now().Add(startLead), period)
					f := startFleet(t, open, log, "", func(i int, scheduled func() time.Time) cron.Job {
						return cronlock.FuncJob(log.Task(i, c.work, scheduled))
					}, guard.MinHold(hold))
					f.wait(t, ticks)
					log.RequireOncePerTick(t, ticks)
					assert.Empty(t, f.errors())
				})
			}
		})
	}
}

// The control: without a hold window, the instances whose timers fire a few milliseconds
// later find a 2 ms job finished and its lock free, and run the tick again.
func TestWithoutHoldRunsTicksAgain(t *testing.T) {
	store := memstore.New()
	log := guardtest.NewTickLog(time.Now().Add(startLead), period)
	f := startFleet(t, func(*testing.T) guard.Backend { return store }, log, "", func(i int, scheduled func() time.Time) cron.Job {
		return cronlock.FuncJob(log.Task(i, 2*time.Millisecond, scheduled))
	}, guard.MinHold(0))
	f.wait(t, ticks)
	log.Log(t)
	assert.Positive(t, log.RanTwice(), "no tick ran twice without a hold window")
	assert.Zero(t, log.Overlaps(), "the lock still keeps runs apart")
}

// The default hold window suits a job that runs every second, on cron's own schedule.
func TestDefaultHold(t *testing.T) {
	store := memstore.New()
	const n = 4
	log := guardtest.NewTickLog(time.Now().Truncate(time.Second).Add(time.Second), time.Second)
	f := startFleet(t, func(*testing.T) guard.Backend { return store }, log, "* * * * * *", func(i int, scheduled func() time.Time) cron.Job {
		return cronlock.FuncJob(log.Task(i, 2*time.Millisecond, scheduled))
	})
	f.wait(t, n)
	log.RequireOncePerTick(t, n)
	assert.Empty(t, f.errors())
}

// run builds a wrapper on g with opts, logging to a new logs, and runs job through it once.
func run(t *testing.T, g *guard.Guard, job cron.Job, opts ...guard.LockOption) *logs {
	t.Helper()
	l := &logs{}
	wrap, err := cronlock.SkipIfLocked(g, lockName(t), append(opts, cronlock.Logger(l))...)
	require.NoError(t, err)
	wrap(job).Run()
	return l
}

// A ContextJob runs under the lock's context: its fence is there, and when the lease runs out
// the context ends with guard.ErrLeaseExpired, and the failure is logged.
func TestContextJobRunsUnderTheLock(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	var fence uint64
	l := run(t, g, cronlock.FuncJob(func(ctx context.Context) error {
		lk, ok := guard.FromContext(ctx)
		if assert.True(t, ok, "no lock in the job's context") {
			fence = lk.Fence()
		}
		<-ctx.Done()
		return context.Cause(ctx)
	}), guard.LeaseTime(100*time.Millisecond), guard.MinHold(50*time.Millisecond))
	assert.Equal(t, uint64(1), fence)
	_, errs := l.snapshot()
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], guard.ErrLeaseExpired)
	assert.ErrorContains(t, errs[0], "job failed")
}

// A plain cron.Job runs under the lock too: nobody else can take it meanwhile.
func TestPlainJobRunsUnderTheLock(t *testing.T) {
	store := memstore.New()
	g, other := guard.New(store), guard.New(store)
	defer g.Close(context.Background())
	defer other.Close(context.Background())
	ran := false
	l := run(t, g, cron.FuncJob(func() {
		ran = true
		_, err := other.TryAcquire(t.Context(), lockName(t))
		assert.ErrorIs(t, err, guard.ErrNotAcquired, "the lock was free while the job ran")
	}))
	assert.True(t, ran)
	_, errs := l.snapshot()
	assert.Empty(t, errs)
}

// What docs/scheduling.md tells a reader who wants to see the skips: a skip is logged at
// Info, which a PrintfLogger — cron.DefaultLogger is one — drops, and a VerbosePrintfLogger
// prints; a failure is printed by both.
func TestSkipsShowWithAVerboseLogger(t *testing.T) {
	store := memstore.New()
	g, other := guard.New(store), guard.New(store)
	defer g.Close(context.Background())
	defer other.Close(context.Background())
	held, err := other.TryAcquire(t.Context(), lockName(t))
	require.NoError(t, err)
	defer held.Release(context.Background())
	failing := cronlock.FuncJob(func(context.Context) error { return errors.New("report failed") })

	for _, tt := range []struct {
		name     string
		logger   func(l interface{ Printf(string, ...any) }) cron.Logger
		wantSkip bool
	}{
		{"printf, as cron.DefaultLogger", cron.PrintfLogger, false},
		{"verbose printf", cron.VerbosePrintfLogger, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			l := tt.logger(log.New(&out, "", 0))
			cron.NewChain(cronlock.MustSkipIfLocked(g, lockName(t), cronlock.Logger(l))).Then(failing).Run()
			assert.Contains(t, out.String(), "report failed", "a failure is printed")
			out.Reset()
			cron.NewChain(cronlock.MustSkipIfLocked(g, held.Name(), cronlock.Logger(l))).Then(failing).Run()
			assert.Equal(t, tt.wantSkip, strings.Contains(out.String(), "skip"), "a skip printed: %q", out.String())
		})
	}
}

// A job that another instance holds is skipped, and the skip is logged at Info, as
// cron.SkipIfStillRunning does; so is a run while this instance's previous run goes on, and
// a run after the base context ended.
func TestSkips(t *testing.T) {
	store := memstore.New()
	g, other := guard.New(store), guard.New(store)
	defer g.Close(context.Background())
	defer other.Close(context.Background())
	never := cronlock.FuncJob(func(context.Context) error {
		t.Error("the job ran")
		return nil
	})
	requireSkip := func(t *testing.T, l *logs, reason string) {
		t.Helper()
		infos, errs := l.snapshot()
		assert.Empty(t, errs)
		require.Len(t, infos, 1)
		assert.Contains(t, infos[0], "skip")
		assert.Contains(t, infos[0], reason)
	}

	t.Run("held elsewhere", func(t *testing.T) {
		held, err := other.TryAcquire(t.Context(), lockName(t))
		require.NoError(t, err)
		defer held.Release(context.Background())
		requireSkip(t, run(t, g, never), "is held")
	})
	t.Run("still running here", func(t *testing.T) {
		l := &logs{}
		wrap, err := cronlock.SkipIfLocked(g, lockName(t), cronlock.Logger(l))
		require.NoError(t, err)
		second := wrap(never)
		first := wrap(cronlock.FuncJob(func(context.Context) error {
			second.Run()
			return nil
		}))
		first.Run()
		requireSkip(t, l, "is held")
	})
	t.Run("base context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		requireSkip(t, run(t, g, never, cronlock.BaseContext(ctx)), context.Canceled.Error())
	})
}

// A backend failure is logged at Error, and the job does not run.
func TestLockError(t *testing.T) {
	g := guard.New(memstore.New())
	require.NoError(t, g.Close(t.Context()))
	l := run(t, g, cronlock.FuncJob(func(context.Context) error {
		t.Error("the job ran")
		return nil
	}))
	_, errs := l.snapshot()
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], guard.ErrClosed)
}

func TestSkipIfLockedErrors(t *testing.T) {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())
	for _, c := range []struct {
		name string
		g    *guard.Guard
		lock string
		opts []guard.LockOption
		want error
		msg  string
	}{
		{"nil guard", nil, "job", nil, nil, "nil *guard.Guard"},
		{"empty name", g, "", nil, guard.ErrInvalidName, "empty"},
		{"negative hold", g, "job", []guard.LockOption{guard.MinHold(-time.Second)}, guard.ErrInvalidOption, "MinHold(-1s)"},
		{"default hold longer than the lease", g, "job", []guard.LockOption{guard.LeaseTime(100 * time.Millisecond)},
			guard.ErrInvalidOption, "the default hold conflicts"},
		{"nil logger", g, "job", []guard.LockOption{cronlock.Logger(nil)}, guard.ErrInvalidOption, "Logger"},
		{"nil base context", g, "job", []guard.LockOption{cronlock.BaseContext(nil)}, guard.ErrInvalidOption, "BaseContext"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := cronlock.SkipIfLocked(c.g, c.lock, c.opts...)
			assert.Nil(t, w)
			require.Error(t, err)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			assert.ErrorContains(t, err, c.msg)
		})
	}
	assert.PanicsWithValue(t, "guard/cronlock: SkipIfLocked with a nil *guard.Guard",
		func() { cronlock.MustSkipIfLocked(nil, "job") })
	assert.PanicsWithValue(t, `guard/cronlock: guard: invalid lock name "": empty`,
		func() { cronlock.MustSkipIfLocked(g, "") })
}
