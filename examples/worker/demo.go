package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
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

// The lock names: one name per run for the scheduled job (jobName, with the run's ID for
// {run}), one template for the tasks, and the name under which a process joins a run. The
// job's and the tasks' names carry the run's ID: a run on a store shares no lock with another
// run on it, before it or at the same time — a lock still held by a run that was killed, or
// the job of a -forever run, would take a demonstration's windows.
const (
	jobName      = "report:{run}"
	taskTemplate = "task:{Run}:{ID}"
	runLock      = "worker:run"
)

// jobLock returns the name of r's job's lock.
func (r runRecord) jobLock() string { return "report:" + r.ID }

// importLock returns the name of the semaphore that admits r.Imports tasks of tenant at once.
func (r runRecord) importLock(tenant int64) string {
	return "imports:" + r.ID + ":" + strconv.FormatInt(tenant, 10)
}

// maintenanceElection returns the name of the election of r's maintenance loop.
func (r runRecord) maintenanceElection() string { return "maintenance:" + r.ID }

// config is what a run does.
type config struct {
	instances int           // in this process
	windows   int           // job windows to run; 0: until the context ends
	window    time.Duration // the job's schedule: once per window
	tasks     int           // tasks per batch: one batch, or one batch per window when windows is 0
	work      time.Duration // how long a task takes on average
	tenants   int           // tenants the tasks belong to
	imports   int           // tasks of one tenant that may run at once, across processes
}

// minHold is the report's hold window (guard.MinHold, through its gocronlock.Locker). It must
// cover the spread of the instances' ticks — an instance that fires late must still find the
// window taken — and must end before the next tick, or every instance would find the next
// window still taken and it would be skipped. So not the whole window, but half of it: the
// rule of the scheduling guide, which leaves room for both.
func (c config) minHold() time.Duration { return c.window / 2 }

// maxLate is how late an instance fires the report, at most: its clock and its scheduler are
// not in step with the others'. The rule holds while it is less than minHold.
func (c config) maxLate() time.Duration { return c.window / 5 }

// jobWork is how long one report takes: less than the spread of the ticks, so that without
// MinHold an instance that fires late would find the report done and run it again.
func (c config) jobWork() time.Duration { return c.window / 20 }

// taskWork is how long task id takes: from half to one and a half times c.work, the same on
// every instance.
func (c config) taskWork(id int64) time.Duration {
	return c.work/2 + c.work*time.Duration(id*7%11)/10
}

// awaitBusy bounds the wait for a task that another instance held when this one came to it:
// longer than a lease of the watchdog (30 s), so that the task of an instance that died is
// taken over once its lease ends.
const awaitBusy = time.Minute

// task is an item of a batch; its run's ID and its own name its lock.
type task struct {
	Run string
	ID  int64
}

// join returns the run this process takes part in. With an end to the windows, it is the run
// under way on the backend, or a new one whose window 0 starts half a window from now: under
// the lock runLock, the first process to come records the run, and the others read it. Without
// an end (-forever), windows count from the Unix epoch, so every process agrees on them
// without asking. join also creates the journal's tables, under the same lock.
func join(ctx context.Context, g *guard.Guard, j journal, cfg config) (runRecord, error) {
	var r runRecord
	err := g.Do(ctx, runLock, func(ctx context.Context) error {
		if err := j.setup(ctx); err != nil {
			return err
		}
		if cfg.windows == 0 {
			// Every -forever process with these flags is in this run, whenever it starts:
			// its windows count from the Unix epoch, so a process that restarts runs windows
			// no earlier process ran.
			r = runRecord{ID: fmt.Sprintf("every-%v-%d-%d-%d", cfg.window, cfg.tasks, cfg.tenants, cfg.imports), Epoch: time.Unix(0, 0),
				Window: cfg.window, Tasks: cfg.tasks, Tenants: cfg.tenants, Imports: cfg.imports}
			return nil
		}
		cur, ok, err := j.current(ctx)
		switch {
		case err != nil:
			return err
		case ok && cur.Windows > 0 && time.Now().Before(cur.end()):
			if cur.Windows != cfg.windows || cur.Window != cfg.window || cur.Tasks != cfg.tasks ||
				cur.Tenants != cfg.tenants || cur.Imports != cfg.imports {
				return fmt.Errorf("a run of %d windows of %v and %d tasks of %d tenants, %d imports at once each, is under way on this backend until %s: "+
					"give the same flags, or start after it",
					cur.Windows, cur.Window, cur.Tasks, cur.Tenants, cur.Imports, cur.end().Format(time.TimeOnly))
			}
			r = cur
			return nil
		}
		epoch := time.Now().Add(cfg.window / 2)
		r = runRecord{ID: newRunID(epoch), Epoch: epoch, Windows: cfg.windows, Window: cfg.window, Tasks: cfg.tasks,
			Tenants: cfg.tenants, Imports: cfg.imports}
		return j.begin(ctx, r)
	}, guard.WaitTime(30*time.Second))
	return r, err
}

// process is this process's part in a run: its instances, and what they ran.
type process struct {
	cfg config
	run runRecord
	j   journal
	log *slog.Logger
	pid int
	// first is the first window this process takes part in: the first that starts after it
	// joined.
	first int64

	windows, tasks atomic.Int64 // runs by this process's instances
	// stale counts the done records of this process's instances that the journal refused:
	// their lock was lost, and a newer holder took the task over.
	stale atomic.Int64
	// limited reports that the backend grants shared holds, so that a Semaphore per tenant
	// limits its imports; without, the tasks run without the limit, and the verdict says so.
	limited bool

	mu   sync.Mutex // protects errs and failed
	errs []error
	// failed holds the windows (jobRun) and the tasks (taskRun) whose run met an error here:
	// the verdict blames that error, not the locks, when one of them did not run.
	failed map[kind]map[int64]bool
}

// newProcess returns this process's part in r.
func newProcess(cfg config, r runRecord, j journal, log *slog.Logger) *process {
	p := &process{cfg: cfg, run: r, j: j, log: log, pid: os.Getpid()}
	if late := time.Since(r.Epoch) + 10*time.Millisecond; late > 0 {
		p.first = int64((late + r.Window - 1) / r.Window)
	}
	return p
}

func (p *process) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// failOn records err, met by the run of window or task key (k jobRun or taskRun).
func (p *process) failOn(k kind, key int64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
	if p.failed == nil {
		p.failed = map[kind]map[int64]bool{}
	}
	if p.failed[k] == nil {
		p.failed[k] = map[int64]bool{}
	}
	p.failed[k][key] = true
}

// record adds e to the journal; a failure is the run's.
func (p *process) record(ctx context.Context, e event) {
	if err := p.j.add(ctx, p.run.ID, e); err != nil && ctx.Err() == nil {
		p.fail(fmt.Errorf("instance %s: journal: %w", e.Instance, err))
	}
}

// demo runs the process's instances, one on each Guard, until their windows and batches are
// done or ctx ends; meanwhile every instance campaigns to lead the maintenance loop.
func (p *process) demo(ctx context.Context, guards []*guard.Guard) {
	_, err := guards[0].Semaphore(p.run.importLock(0), max(p.run.Imports, 1))
	switch {
	case p.run.Imports == 0: // no limit asked for
	case err == nil:
		p.limited = true
	case errors.Is(err, guard.ErrUnsupported):
		p.log.Warn("the backend grants no shared holds (guard.Sharing): the tasks run without their per-tenant import limit: " + err.Error())
	default:
		p.fail(err)
	}
	mctx, stopMaintenance := context.WithCancel(ctx)
	var maintainers sync.WaitGroup
	var wg sync.WaitGroup
	for n, g := range guards {
		in := &instance{name: fmt.Sprintf("%d/%d", p.pid, n+1), p: p, g: g}
		maintainers.Go(func() { in.maintain(mctx, n == 0) })
		locker, err := gocronlock.NewLocker(g, guard.MinHold(p.cfg.minHold()))
		if err != nil {
			p.fail(err)
			continue
		}
		in.try = decorators.MustFunc(g, taskTemplate, in.runTask)
		in.await = decorators.MustFunc(g, taskTemplate, in.runTask, guard.WaitTime(awaitBusy))
		wg.Go(func() { in.schedule(ctx, locker) })
		wg.Go(func() { in.walk(ctx) })
	}
	wg.Wait()
	stopMaintenance()
	maintainers.Wait()
}

// maintain campaigns for the lead of the run's maintenance loop (guard.Election) and, while
// it leads, runs a round of maintenance at every window: what one instance of a service must
// do alone (compact a log, refresh a cache) and must stop doing as soon as another took over.
// Each round checks the term first, as a liveness probe would (Election.Check), and is
// recorded with the term's fence, which rises with every new leader: the verdict checks that
// no round of an older term came after a round of a newer one. The process's first instance
// also observes the election and logs every change of leader. maintain resigns when ctx ends,
// so that another instance takes over at once, and campaigns again when its term was lost.
func (in *instance) maintain(ctx context.Context, observe bool) {
	p := in.p
	e, err := guard.NewElection(in.g, p.run.maintenanceElection())
	if err != nil {
		p.fail(fmt.Errorf("instance %s: %w", in.name, err))
		return
	}
	if observe {
		go func() {
			for l := range e.Observe(ctx) {
				p.log.Info(fmt.Sprintf("maintenance: led by instance %s from now on, term fence %d", l.Value, l.Fence))
			}
		}()
	}
	for ctx.Err() == nil {
		term, err := e.Campaign(ctx, in.name)
		if err != nil {
			if ctx.Err() == nil {
				p.fail(fmt.Errorf("instance %s: campaign: %w", in.name, err))
			}
			return
		}
		in.lead(ctx, e, term)
		// Resign by releasing the term itself: the term's context ended with ctx, and the
		// Election has let go of it then, so that Election.Resign would release nothing and
		// the next leader would wait for the term's lease to run out.
		// A term that was lost has nothing to release: that is no error of the run's.
		if err := term.Release(context.WithoutCancel(ctx)); err != nil {
			p.log.Warn(fmt.Sprintf("maintenance: instance %s: resigning: %v", in.name, err))
		}
	}
}

// maintenanceKey is the journal's key of the maintenance loop among the tasks' IDs, which are
// not negative: its claims fence the rounds.
const maintenanceKey = -1

// lead runs a round of maintenance at every window while term lasts and ctx is live.
func (in *instance) lead(ctx context.Context, e *guard.Election, term *guard.Lock) {
	p := in.p
	tick := time.NewTicker(p.run.Window)
	defer tick.Stop()
	for {
		if err := e.Check(); err != nil {
			p.log.Warn(fmt.Sprintf("maintenance: instance %s: %v", in.name, err))
		}
		// A round is fenced as a task is: it claims the maintenance with the term's fence, and
		// a leader that paused past its term's lease while another took over finds its
		// fence refused, and stops.
		at := time.Now()
		switch err := p.j.claim(term.Context(), p.run.ID, maintenanceKey, term.Fence()); {
		case errors.Is(err, errStale):
			p.log.Warn(fmt.Sprintf("maintenance: instance %s: a newer leader has taken over (term fence %d)", in.name, term.Fence()))
			return
		case err != nil:
			if term.Err() == nil {
				p.fail(fmt.Errorf("instance %s: maintenance: %w", in.name, err))
			}
			return
		}
		p.record(term.Context(), event{Instance: in.name, Kind: maintenance, Key: p.run.window(at), Fence: term.Fence(), Start: at})
		select {
		case <-tick.C:
		case <-term.Done():
			return
		case <-ctx.Done():
			return
		}
	}
}

// instance is one instance of the service: a gocron scheduler that fires the report at every
// tick, and a walker that goes through every task of a batch.
type instance struct {
	name string // "pid/n"
	p    *process
	g    *guard.Guard

	// runTask under the task's lock: try makes one attempt, await waits for a busy lock.
	try, await func(context.Context, task) (struct{}, error)
}

// schedule runs the report on a gocron scheduler, at the start of every window from the
// process's first, through locker: the instance that takes the window's lock runs it, the
// others find it taken. The instance's clock is a little late, by its own amount. schedule
// returns half a window after the run's last window started, between the last tick and the
// one after, or when ctx ends.
func (in *instance) schedule(ctx context.Context, locker *gocronlock.Locker) {
	p := in.p
	first := p.first // gocron wants a start in the future
	for time.Until(p.run.start(first)) < 10*time.Millisecond {
		first++
	}
	if p.run.Windows > 0 && int64(p.run.Windows) <= first {
		return // no window left for this process
	}
	var stopping atomic.Bool // set when the scheduler shuts down, which cancels the runs
	s, err := gocron.NewScheduler(
		gocron.WithDistributedLocker(locker),
		gocron.WithClock(lateClock{Clock: clockwork.NewRealClock(), late: rand.N(p.cfg.maxLate())}))
	if err != nil {
		p.fail(fmt.Errorf("instance %s: %w", in.name, err))
		return
	}
	_, err = s.NewJob(gocron.DurationJob(p.run.Window),
		gocron.NewTask(locker.Func(in.runReport)), // runReport(ctx) runs under the window's lock
		gocron.WithName(p.run.jobLock()),          // the lock's name
		gocron.WithContext(ctx),
		gocron.WithStartAt(gocron.WithStartDateTime(p.run.start(first))), // the instances' ticks line up
		gocron.WithEventListeners(
			gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
				if ctx.Err() == nil && !stopping.Load() {
					at := time.Now()
					p.failOn(jobRun, p.run.window(at), fmt.Errorf("instance %s, window %d: %w", in.name, p.run.window(at), err))
				}
			}),
			gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				switch at := time.Now(); {
				case errors.Is(err, guard.ErrNotAcquired):
					p.record(ctx, event{Instance: in.name, Kind: busyJob, Key: p.run.window(at), Start: at})
				case ctx.Err() == nil && !stopping.Load():
					p.failOn(jobRun, p.run.window(at), fmt.Errorf("instance %s, window %d: %w", in.name, p.run.window(at), err))
				}
			})))
	if err != nil {
		p.fail(fmt.Errorf("instance %s: %w", in.name, err))
		_ = s.Shutdown()
		return
	}
	s.Start()
	if p.run.Windows > 0 {
		// Stop between ticks, half a window after the last one started: Shutdown cancels
		// the runs in flight, and a run still releasing its lock would have its release cut
		// short, leaving the name taken until its lease ran out.
		_ = pause(ctx, time.Until(p.run.start(int64(p.run.Windows-1)).Add(p.run.Window/2)))
	} else {
		<-ctx.Done()
	}
	stopping.Store(true)
	if err := s.Shutdown(); err != nil {
		p.fail(fmt.Errorf("instance %s: %w", in.name, err))
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

// runReport is the scheduled job. Its record in the journal, made under the window's lock,
// is what the verdict counts.
func (in *instance) runReport(ctx context.Context) error {
	p := in.p
	l, _ := guard.FromContext(ctx)
	window := p.run.window(l.AcquiredAt())
	p.log.Info(fmt.Sprintf("window %d: instance %s runs the report, fence %d", window, in.name, l.Fence()))
	if err := pause(ctx, p.cfg.jobWork()); err != nil {
		return err
	}
	// The job ran: its record is made even if the lock ends while it is on its way — cut
	// short by the lock's context, a write the server applied came back as an error, and
	// the process did not count a window the journal shows it ran. Were the lock lost and the
	// window run again elsewhere, both records show it, as they should.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := p.j.add(wctx, p.run.ID, event{Instance: in.name, Kind: jobRun, Key: window, Fence: l.Fence(),
		Start: l.AcquiredAt(), End: time.Now()}); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	p.windows.Add(1)
	return nil
}

// batch returns the tasks of the batch that starts with window k: the run's one batch, or
// without an end to the windows one batch per window.
func (p *process) batch(k int64) []task {
	first := int64(0)
	if p.run.Windows == 0 {
		first = k * int64(p.run.Tasks)
	}
	tasks := make([]task, p.run.Tasks)
	for i := range tasks {
		tasks[i] = task{Run: p.run.ID, ID: first + int64(i)}
	}
	return tasks
}

// walk goes through the run's batch of tasks; without an end to the windows, through a new
// batch at the start of every window.
func (in *instance) walk(ctx context.Context) {
	p := in.p
	if p.run.Windows > 0 {
		in.walkBatch(ctx, 0) // the one batch, from window 0 on: at once for a process that joined late
		return
	}
	for k := p.first; ctx.Err() == nil; k++ {
		in.walkBatch(ctx, k)
	}
}

// walkBatch goes through the batch that starts with window k, from the first task to the
// last, and processes every task that is neither done nor busy; then it waits for the tasks
// it found busy, and finds them done — or runs them, if their holder did not finish them —
// and runs again those whose lock or import permit it lost while it ran them.
func (in *instance) walkBatch(ctx context.Context, k int64) {
	p := in.p
	if pause(ctx, time.Until(p.run.start(k))) != nil {
		return
	}
	var busy []task
	for _, t := range p.batch(k) {
		// Spare the lock's round trip for a task done already; runTask checks again under
		// the lock.
		if done, err := p.j.done(ctx, p.run.ID, t.ID); err == nil && done {
			continue
		}
		at := time.Now()
		_, err := in.try(ctx, t)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, guard.ErrNotAcquired):
			p.record(ctx, event{Instance: in.name, Kind: busyTask, Key: t.ID, Start: at})
			busy = append(busy, t)
		case lost(err): // its lock or its import permit: run it again, below
			p.log.Warn(fmt.Sprintf("task %d: instance %s lost its lock or its import permit: %v", t.ID, in.name, err))
			busy = append(busy, t)
		case err != nil && !errors.Is(err, errDone) && !errors.Is(err, errStale):
			p.failOn(taskRun, t.ID, fmt.Errorf("instance %s, task %d: %w", in.name, t.ID, err))
		}
	}
	for _, t := range busy {
		_, err := in.await(ctx, t)
		switch {
		case ctx.Err() != nil:
			return
		case lost(err):
			p.log.Warn(fmt.Sprintf("task %d: instance %s lost its lock: %v", t.ID, in.name, err))
		case err != nil && !errors.Is(err, errDone) && !errors.Is(err, errStale):
			p.failOn(taskRun, t.ID, fmt.Errorf("instance %s, task %d: %w", in.name, t.ID, err))
		}
	}
}

// lost reports whether err says that a lock was lost while its holder worked, as it is when
// the holder's process paused past its lease: the journal's fences keep its work from
// counting twice, and whoever found the task busy takes it over. Not an error of the run's.
func lost(err error) bool {
	return errors.Is(err, guard.ErrLockLost) || errors.Is(err, guard.ErrLeaseExpired)
}

// runTask is the work of one task, under its lock. It claims the task in the journal with
// its lock's fence — which tells it for sure whether another instance did it already — and
// once the work is done records the task done with the same fence. The journal refuses that
// record when a holder with a newer fence claimed the task meanwhile: this instance paused
// past its lease, and the task was taken over. runTask then returns errStale; the work it did
// is the one the fence keeps out.
func (in *instance) runTask(ctx context.Context, t task) (struct{}, error) {
	p := in.p
	l, _ := guard.FromContext(ctx)
	if err := p.j.claim(ctx, p.run.ID, t.ID, l.Fence()); err != nil {
		return struct{}{}, err
	}
	// The import itself: at most Imports of the tenant's at once, across every process.
	start, work := time.Now(), ctx
	var permit *guard.Lock
	if p.limited {
		sem, err := in.g.Semaphore(p.run.importLock(p.run.tenant(t.ID)), p.run.Imports)
		if err != nil {
			return struct{}{}, err
		}
		permit, err = sem.Acquire(ctx, guard.WaitTime(awaitBusy))
		if err != nil {
			return struct{}{}, fmt.Errorf("import permit: %w", err)
		}
		defer func() {
			if err := permit.Release(context.WithoutCancel(ctx)); err != nil {
				p.log.Warn(fmt.Sprintf("task %d: releasing its import permit: %v", t.ID, err))
			}
		}()
		start, work = permit.AcquiredAt(), permit.Context()
	}
	if err := pause(work, p.cfg.taskWork(t.ID)); err != nil {
		return struct{}{}, err
	}
	// The permit has no fence that the journal checks: ask it whether it is still ours before
	// the import counts. A process stopped past its lease (SIGSTOP, a long GC) wakes up to a
	// timer that fired and a permit whose context the watchdog has not ended yet; Err checks
	// the lease's deadline itself. Others may hold every permit by now: the import is not
	// recorded, and walkBatch runs the task again under a new one. (A pause between here and
	// the record can still overrun: only a resource that checks a fence closes that gap.)
	if permit != nil {
		if err := permit.Err(); err != nil {
			return struct{}{}, err
		}
	}
	// The record is made even when the lock was lost meanwhile, which a process that was
	// stopped learns only now: the journal's fences decide whether it still counts.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := p.j.finish(wctx, p.run.ID, event{Instance: in.name, Kind: taskRun, Key: t.ID, Fence: l.Fence(),
		Start: start, End: time.Now()})
	switch {
	case errors.Is(err, errStale), errors.Is(err, errDone):
		p.stale.Add(1)
		p.log.Warn(fmt.Sprintf("task %d: instance %s lost its lock (fence %d) while it ran the task, which was taken over; "+
			"the journal refused its done record", t.ID, in.name, l.Fence()))
		return struct{}{}, err
	case err != nil:
		return struct{}{}, fmt.Errorf("journal: %w", err)
	}
	p.tasks.Add(1)
	return struct{}{}, nil
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
