package cronlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/guardlock/guard"
)

// DefaultMinHold is the hold-at-least that SkipIfLocked gives each run unless guard.MinHold
// says otherwise: half a second. By the sizing rule of docs/scheduling.md — hold for half the
// job's period — it suits every job that runs at most once a second (the shortest period of a
// cron expression), on instances whose timers fire less than half a second apart.
const DefaultMinHold = 500 * time.Millisecond

// ContextJob is a cron.Job that can run under a context. SkipIfLocked runs it with RunContext,
// under the lock's context, and logs the error it returns.
type ContextJob interface {
	cron.Job
	// RunContext runs the job under ctx.
	RunContext(ctx context.Context) error
}

// FuncJob is a function as a ContextJob, the counterpart of cron.FuncJob for functions that
// take a context.
type FuncJob func(ctx context.Context) error

// Run runs f with context.Background() and drops its error: it is what f does as a plain
// cron.Job, outside SkipIfLocked.
func (f FuncJob) Run() { _ = f(context.Background()) }

// RunContext runs f with ctx and returns its error.
func (f FuncJob) RunContext(ctx context.Context) error { return f(ctx) }

// Option configures SkipIfLocked beyond the lock: it is a guard.LockOption, so it goes in one
// list with guard's options — SkipIfLocked(g, name, guard.MinHold(d), Logger(l)). A Guard
// ignores it.
type Option struct {
	guard.EmptyLockOption
	set func(*config)
}

// config is what Options set.
type config struct {
	logger cron.Logger
	base   context.Context
}

// Logger sets where the wrapper reports: skipped runs at Info (as cron.SkipIfStillRunning
// does), and failed runs and lock errors at Error. Default: cron.DefaultLogger, which prints
// errors only. l must not be nil.
func Logger(l cron.Logger) Option {
	return Option{set: func(c *config) { c.logger = l }}
}

// BaseContext sets the context that every run takes its lock under and runs under (its lock's
// context derives from it): cancel it on shutdown to cancel running jobs, which cron's Stop
// does not. Default: context.Background(). ctx must not be nil.
func BaseContext(ctx context.Context) Option {
	return Option{set: func(c *config) { c.base = ctx }}
}

// SkipIfLocked returns a cron.JobWrapper that runs a job only on the instance that takes the
// lock called name (see the package doc): the others skip the run, as cron.SkipIfStillRunning
// skips a run while the previous one runs — and so does this instance while its own previous
// run still holds the lock. guard.MinHold sets the hold window (default DefaultMinHold),
// guard.LeaseTime a fixed lease instead of the watchdog's; Logger and BaseContext configure
// the wrapper. guard.WaitTime makes a run wait for a busy lock instead of skipping, so that
// every instance runs every tick, one after the other: for a job that must run everywhere
// but never twice at once, not once per tick.
//
// It returns an error for a nil g, a *guard.NameError for a bad name, and a *guard.OptionError
// for an invalid option — among them a LeaseTime shorter than the hold window.
func SkipIfLocked(g *guard.Guard, name string, opts ...guard.LockOption) (cron.JobWrapper, error) {
	if g == nil {
		return nil, errors.New("guard/cronlock: SkipIfLocked with a nil *guard.Guard")
	}
	if err := guard.CheckName(name); err != nil {
		return nil, err
	}
	if err := guard.CheckLockOptions(opts...); err != nil {
		return nil, err
	}
	// One attempt, the default hold, the name as telemetry label; then the caller's options.
	acq := append([]guard.LockOption{guard.WaitTime(0), guard.MinHold(DefaultMinHold), guard.Label(name)}, opts...)
	if err := guard.CheckLockOptions(acq...); err != nil {
		// The caller's options are fine on their own: the default hold is what conflicts.
		return nil, &guard.OptionError{Option: "MinHold", Value: DefaultMinHold,
			Reason: fmt.Sprintf("the default hold conflicts with the options given (%v); pass guard.MinHold", err)}
	}
	cfg := config{logger: cron.DefaultLogger, base: context.Background()}
	for _, o := range opts {
		if o, ok := o.(Option); ok && o.set != nil {
			o.set(&cfg)
		}
	}
	switch {
	case cfg.logger == nil:
		return nil, &guard.OptionError{Option: "Logger", Value: nil, Reason: "must not be nil"}
	case cfg.base == nil:
		return nil, &guard.OptionError{Option: "BaseContext", Value: nil, Reason: "must not be nil"}
	}

	return func(job cron.Job) cron.Job {
		return cron.FuncJob(func() {
			ran := false
			err := g.Do(cfg.base, name, func(ctx context.Context) error {
				ran = true
				if cj, ok := job.(ContextJob); ok {
					return cj.RunContext(ctx)
				}
				job.Run()
				return nil
			}, acq...)
			switch {
			case err == nil:
			case !ran && errors.Is(err, guard.ErrNotAcquired):
				cfg.logger.Info("skip", "lock", name, "reason", err)
			case !ran:
				cfg.logger.Error(err, "lock", "lock", name)
			default:
				cfg.logger.Error(err, "job failed", "lock", name)
			}
		})
	}, nil
}

// MustSkipIfLocked is SkipIfLocked for names and options fixed in the program: it panics with
// a "guard/cronlock:" message where SkipIfLocked returns an error.
func MustSkipIfLocked(g *guard.Guard, name string, opts ...guard.LockOption) cron.JobWrapper {
	w, err := SkipIfLocked(g, name, opts...)
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "guard/cronlock: ") {
			msg = "guard/cronlock: " + msg
		}
		panic(msg)
	}
	return w
}
