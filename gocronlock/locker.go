package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/go-co-op/gocron/v2"

	"github.com/guardlock/guard"
)

// Locker is a gocron.Locker on a guard.Guard: pass it to gocron.WithDistributedLocker (every
// job of the scheduler) or gocron.WithDistributedJobLocker (one job). Each run of a job takes
// the lock named by the job's name, with one attempt; an instance that finds it held skips the
// run. The name stays locked for at least the hold window (guard.MinHold, DefaultMinHold by
// default) after the run took it, so that instances whose timers fire a little later find the
// tick taken.
//
// A Locker is safe for concurrent use, by any number of jobs and schedulers.
type Locker struct {
	g    *guard.Guard
	opts []guard.LockOption // the caller's

	mu   sync.Mutex // protects runs
	runs map[context.Context]*guard.Lock
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker that takes its locks from g with opts: guard.MinHold sets the hold
// window (default DefaultMinHold; see docs/scheduling.md for how to size it), guard.LeaseTime
// gives every run a fixed lease instead of the watchdog's. guard.WaitTime makes a run wait for
// a busy lock instead of skipping, so that every instance runs every tick, one after the
// other: for a job that must run everywhere but never twice at once, not once per tick. It
// returns an error for a nil g and a *guard.OptionError for an invalid option — among them a
// LeaseTime shorter than the hold window.
//
// For a job that needs another hold window, give it a Locker of its own with
// gocron.WithDistributedJobLocker.
func NewLocker(g *guard.Guard, opts ...guard.LockOption) (*Locker, error) {
	if g == nil {
		return nil, errors.New("guard/gocronlock: NewLocker with a nil *guard.Guard")
	}
	if err := guard.CheckLockOptions(opts...); err != nil {
		return nil, err
	}
	all := append([]guard.LockOption{guard.WaitTime(0), guard.MinHold(DefaultMinHold)}, opts...)
	if err := guard.CheckLockOptions(all...); err != nil {
		// The caller's options are fine on their own: the default hold is what conflicts.
		return nil, &guard.OptionError{Option: "MinHold", Value: DefaultMinHold,
			Reason: fmt.Sprintf("the default hold conflicts with the options given (%v); pass guard.MinHold", err)}
	}
	return &Locker{g: g, opts: opts, runs: make(map[context.Context]*guard.Lock)}, nil
}

// Lock takes the lock called key for one run of a job; gocron calls it with the job's context
// and name. It returns an error matching guard.ErrNotAcquired when another instance holds the
// job (gocron then skips the run and reports the error to the job's AfterLockError listener),
// or the other errors of guard.Guard.TryAcquire.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	// One attempt, the default hold, and the job's name as telemetry label (job names are
	// few), then the caller's options, which override them.
	opts := make([]guard.LockOption, 0, len(l.opts)+3)
	opts = append(opts, guard.WaitTime(0), guard.MinHold(DefaultMinHold), guard.Label(key))
	lk, err := l.g.TryAcquire(ctx, key, append(opts, l.opts...)...)
	if err != nil {
		return nil, err
	}
	r := &run{l: l, ctx: ctx, lock: lk}
	if isMapKey(ctx) {
		l.mu.Lock()
		l.runs[ctx] = lk
		l.mu.Unlock()
		r.registered = true
	}
	return r, nil
}

// Func returns task wrapped so that it runs under the lock of its run: give it to
// gocron.NewTask, with no context among the task's parameters, so that gocron passes the job's
// context. The wrapped task finds the lock that this Locker took for the run, and calls task
// with the lock's context: it is cancelled, with cause guard.ErrLockLost or
// guard.ErrLeaseExpired, when the lock is lost, and guard.FromContext gives the lock and its
// fence. It returns task's error, joined with the loss's cause when the lock was lost while
// task ran; or ErrNoLock, without calling task, when there is no such lock. Func panics when
// task is nil.
//
// gocron passes a task the job's context, not the lock's; Func is how the lock's context
// reaches the task.
func (l *Locker) Func(task func(context.Context) error) func(context.Context) error {
	if task == nil {
		panic("guard/gocronlock: Locker.Func(nil)")
	}
	return func(ctx context.Context) error {
		lk := l.held(ctx)
		if lk == nil {
			return ErrNoLock
		}
		err := task(lk.Context())
		if cause := lossCause(lk.Context()); cause != nil && !errors.Is(err, cause) {
			err = errors.Join(err, cause)
		}
		return err
	}
}

// held returns the lock this Locker holds for a run with context ctx, or nil.
func (l *Locker) held(ctx context.Context) *guard.Lock {
	if !isMapKey(ctx) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[ctx]
}

// isMapKey reports whether ctx can be a map key: contexts are pointers in practice, but
// the interface does not promise it.
func isMapKey(ctx context.Context) bool {
	return ctx != nil && reflect.TypeOf(ctx).Comparable()
}

// run is one run's lock, as gocron holds it.
type run struct {
	l          *Locker
	ctx        context.Context // the job's context, the key in l.runs
	lock       *guard.Lock
	registered bool
}

// Unlock releases the run's lock: with a hold window, the name stays locked until the window
// ends. gocron calls it when the run ends, with the job's context; the release reaches the
// backend even when that context is cancelled (the scheduler is shutting down), as
// guard.Lock.Release does. It returns the errors of guard.Lock.Release.
func (r *run) Unlock(ctx context.Context) error {
	if r.registered {
		r.l.mu.Lock()
		if r.l.runs[r.ctx] == r.lock {
			delete(r.l.runs, r.ctx)
		}
		r.l.mu.Unlock()
	}
	return r.lock.Release(ctx)
}

// lossCause returns why ctx ended when the lock it belongs to was lost or its lease ran out,
// else nil.
func lossCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, guard.ErrLockLost) || errors.Is(cause, guard.ErrLeaseExpired) {
		return cause
	}
	return nil
}
