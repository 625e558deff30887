package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/gocronlock"
)

// The lock names: one fixed name for the scheduled job, one template for the tasks.
const (
	jobName      = "report:window"
	taskTemplate = "task:{ID}"
)

// config is what a run does.
type config struct {
	instances int
	windows   int           // job windows to run; 0: until the context ends
	window    time.Duration // the job's schedule: once per window
	tasks     int           // tasks per batch: one batch, or one batch per window when windows is 0
	work      time.Duration // how long a task takes on average
}

// minHold is the report's hold window (guard.MinHold, through its gocronlock.Locker). It must
// cover the spread of the instances' ticks — an instance that fires late must still find the
// window taken — and must end before the next tick, or every instance would find the next
// window still taken and it would be skipped. So not the whole window, but half of it: the
// rule of docs/scheduling.md, which leaves room for both.
func (c config) minHold() time.Duration { return c.window / 2 }

// maxLate is how late an instance fires the report, at most: its clock and its scheduler are
// not in step with the others'. The rule holds while it is less than minHold.
func (c config) maxLate() time.Duration { return c.window / 5 }

// jobWork is how long one report takes: less than the spread of the ticks, so that without
// MinHold an instance that fires late would find the report done and run it again.
func (c config) jobWork() time.Duration { return c.window / 20 }

// taskWork is how long task id takes: from half to one and a half times c.work, the same on
// every instance.
func (c config) taskWork(id int) time.Duration {
	return c.work/2 + c.work*time.Duration(id*7%11)/10
}

// task is an item of a batch; its ID names its lock.
type task struct {
	ID int
}

// errDone reports a task that another instance finished before this one got its lock.
var errDone = errors.New("task already done")

// demo runs cfg.instances instances, each with its own Guard from newGuard, until the
// configured windows and the batch are done or ctx ends, and returns what ran. It logs each
// run of the job.
func demo(ctx context.Context, cfg config, newGuard func() *guard.Guard, log *slog.Logger) *record {
	// Window 0 starts a moment from now: gocron wants a start in the future.
	rec := &record{cfg: cfg, epoch: time.Now().Add(100 * time.Millisecond), log: log}
	done := &doneSet{by: map[int]int{}}
	var wg sync.WaitGroup
	for id := 1; id <= cfg.instances; id++ {
		in := &instance{id: id, cfg: cfg, rec: rec, done: done}
		g := newGuard()
		locker, err := gocronlock.NewLocker(g, guard.MinHold(cfg.minHold()))
		if err != nil {
			rec.fail(err)
			continue
		}
		in.process = decorators.MustFunc(g, taskTemplate, in.runTask)
		wg.Go(func() { in.schedule(ctx, locker) })
		wg.Go(func() { in.walk(ctx) })
	}
	wg.Wait()
	return rec
}

// instance is one instance of the service: a gocron scheduler that fires the report at every
// tick, and a walker that goes through every task of a batch.
type instance struct {
	id   int
	cfg  config
	rec  *record
	done *doneSet

	process func(context.Context, task) (struct{}, error) // runTask under the task's lock
}

// schedule runs the report on a gocron scheduler, at the start of every window, through
// locker: the instance that takes the window's lock runs it, the others find it taken. The
// instance's clock is a little late, by its own amount. schedule returns when the scheduler
// has fired the configured windows, or when ctx ends.
func (in *instance) schedule(ctx context.Context, locker *gocronlock.Locker) {
	fired := make(chan struct{}) // closed when the last window has fired
	var n atomic.Int64
	tick := func() {
		if n.Add(1) == int64(in.cfg.windows) {
			close(fired)
		}
	}
	s, err := gocron.NewScheduler(
		gocron.WithDistributedLocker(locker),
		gocron.WithClock(lateClock{Clock: clockwork.NewRealClock(), late: rand.N(in.cfg.maxLate())}))
	if err != nil {
		in.rec.fail(fmt.Errorf("instance %d: %w", in.id, err))
		return
	}
	_, err = s.NewJob(gocron.DurationJob(in.cfg.window),
		gocron.NewTask(locker.Func(in.runReport)), // runReport(ctx) runs under the window's lock
		gocron.WithName(jobName),                  // the lock's name
		gocron.WithContext(ctx),
		gocron.WithStartAt(gocron.WithStartDateTime(in.rec.epoch)), // the instances' ticks line up
		gocron.WithEventListeners(
			gocron.AfterJobRuns(func(uuid.UUID, string) { tick() }),
			gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
				if ctx.Err() == nil {
					in.rec.fail(fmt.Errorf("instance %d: %w", in.id, err))
				}
				tick()
			}),
			gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				switch at := time.Now(); {
				case errors.Is(err, guard.ErrNotAcquired):
					in.rec.add(event{instance: in.id, kind: busyJob, key: in.rec.window(at), start: at})
				case ctx.Err() == nil:
					in.rec.fail(fmt.Errorf("instance %d, window %d: %w", in.id, in.rec.window(at), err))
				}
				tick()
			})))
	if err != nil {
		in.rec.fail(fmt.Errorf("instance %d: %w", in.id, err))
		_ = s.Shutdown()
		return
	}
	s.Start()
	select {
	case <-fired:
	case <-ctx.Done():
	}
	if err := s.Shutdown(); err != nil {
		in.rec.fail(fmt.Errorf("instance %d: %w", in.id, err))
	}
}

// lateClock is an instance's clock, behind the real one by late: the instance fires every
// tick that much later than an instance whose clock is right. The instance whose clock is
// furthest ahead runs every window; the others find it taken.
type lateClock struct {
	clockwork.Clock
	late time.Duration
}

func (c lateClock) Now() time.Time { return c.Clock.Now().Add(-c.late) }

// runReport is the scheduled job.
func (in *instance) runReport(ctx context.Context) error {
	l, _ := guard.FromContext(ctx)
	window := in.rec.window(l.AcquiredAt())
	in.rec.log.Info(fmt.Sprintf("window %d: instance %d runs the report, fence %d", window, in.id, l.Fence()))
	defer in.rec.ran(in.id, jobRun, window, l)
	return pause(ctx, in.cfg.jobWork())
}

// walk goes through the whole batch, from the first task to the last, and processes every
// task that is neither done nor busy. With no end to the windows, it walks a new batch at the
// start of every window.
func (in *instance) walk(ctx context.Context) {
	for b := 0; ; b++ {
		if b > 0 && in.cfg.windows > 0 {
			return
		}
		// Batch b starts with window b.
		if pause(ctx, time.Until(in.rec.epoch.Add(time.Duration(b)*in.cfg.window))) != nil {
			return
		}
		for n := range in.cfg.tasks {
			t := task{ID: b*in.cfg.tasks + n}
			if in.done.has(t.ID) { // spare the lock's round trip; checked again under it
				continue
			}
			at := time.Now()
			_, err := in.process(ctx, t)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, guard.ErrNotAcquired):
				in.rec.add(event{instance: in.id, kind: busyTask, key: t.ID, start: at})
			case err != nil && !errors.Is(err, errDone):
				in.rec.fail(fmt.Errorf("instance %d, task %d: %w", in.id, t.ID, err))
			}
		}
	}
}

// runTask is the work of one task. Under the task's lock, the done set tells for sure
// whether another instance did it already.
func (in *instance) runTask(ctx context.Context, t task) (struct{}, error) {
	if in.done.has(t.ID) {
		return struct{}{}, errDone
	}
	l, _ := guard.FromContext(ctx)
	defer in.rec.ran(in.id, taskRun, t.ID, l)
	if err := pause(ctx, in.cfg.taskWork(t.ID)); err != nil {
		return struct{}{}, err
	}
	in.done.add(t.ID, in.id)
	return struct{}{}, nil
}

// doneSet is the set of finished tasks, shared by the instances as a table in their database
// would be.
type doneSet struct {
	mu sync.Mutex  // protects by
	by map[int]int // task ID → the instance that did it
}

func (d *doneSet) has(id int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.by[id]
	return ok
}

func (d *doneSet) add(id, instance int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.by[id] = instance
}

// pause waits for d, or returns the cause when ctx ends first.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
