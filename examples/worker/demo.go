package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
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

// minHold is the report's guard.MinHold. It must cover the spread of the instances' ticks —
// an instance that fires late must still find the window taken — and must end before the
// next tick, or every instance would find the next window still taken and it would be
// skipped. So not the whole window, but half of it: that leaves room for both.
func (c config) minHold() time.Duration { return c.window / 2 }

// maxLate is how late an instance fires the report, at most: its clock and its scheduler are
// not in step with the others'.
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
	rec := &record{cfg: cfg, epoch: time.Now(), log: log}
	done := &doneSet{by: map[int]int{}}
	var wg sync.WaitGroup
	for id := 1; id <= cfg.instances; id++ {
		in := &instance{id: id, cfg: cfg, rec: rec, done: done}
		g := newGuard()
		in.report = decorators.MustJob(g, jobName, in.runReport, guard.MinHold(cfg.minHold()))
		in.process = decorators.MustFunc(g, taskTemplate, in.runTask)
		wg.Go(func() { in.schedule(ctx) })
		wg.Go(func() { in.walk(ctx) })
	}
	wg.Wait()
	return rec
}

// instance is one instance of the service: a scheduler that fires the report at every tick,
// and a walker that goes through every task of a batch.
type instance struct {
	id   int
	cfg  config
	rec  *record
	done *doneSet

	report  func(context.Context) error                   // runReport under the job's lock
	process func(context.Context, task) (struct{}, error) // runTask under the task's lock
}

// schedule fires the report at the start of every window, a little late, by a different
// amount each time.
func (in *instance) schedule(ctx context.Context) {
	for k := 0; in.cfg.windows == 0 || k < in.cfg.windows; k++ {
		late := rand.N(in.cfg.maxLate())
		if pause(ctx, time.Until(in.rec.epoch.Add(time.Duration(k)*in.cfg.window+late))) != nil {
			return
		}
		at := time.Now()
		err := in.report(ctx)
		switch {
		case errors.Is(err, guard.ErrNotAcquired) && ctx.Err() == nil:
			in.rec.add(event{instance: in.id, kind: busyJob, key: k, start: at})
		case err != nil && ctx.Err() == nil:
			in.rec.fail(fmt.Errorf("instance %d, window %d: %w", in.id, k, err))
		}
	}
}

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
		if b > 0 {
			if in.cfg.windows > 0 || pause(ctx, time.Until(in.rec.epoch.Add(time.Duration(b)*in.cfg.window))) != nil {
				return
			}
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
