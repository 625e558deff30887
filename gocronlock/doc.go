// Package gocronlock runs gocron v2 (github.com/go-co-op/gocron/v2) jobs once across the
// instances of a service, on any guard backend. Every instance runs the same scheduler with the
// same jobs; guard decides which instance runs each tick.
//
// A Locker (gocron.WithDistributedLocker) locks each run: the first instance whose timer fires
// takes the job's lock and runs it, and the lock outlives a fast run by a hold window, so that
// the other instances, whose timers fire a few milliseconds later, find the tick taken.
//
//	g := guard.New(redisstore.New(rdb))
//	locker, err := gocronlock.NewLocker(g, guard.MinHold(30*time.Second)) // half the period
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//	_, err = s.NewJob(gocron.CronJob("* * * * *", false), // every minute, on the minute
//		gocron.NewTask(locker.Func(sendReport)),          // sendReport(ctx) runs under the lock
//		gocron.WithName("report"))                        // the lock's name
//
// An Elector (gocron.WithDistributedElector) elects one leader instead, which runs every job
// while it leads; the watchdog holds its leadership, and another instance takes over when it
// is closed or dies.
//
// # The hold window
//
// guard.MinHold sets the window: by the rule of the [scheduling guide], half the job's period,
// which is right while the instances' timers for one tick fire less than half a period apart.
// The default, DefaultMinHold (half a second), is that rule for jobs that run at most once a
// second; a job that runs more often needs its own. A job that needs another window than the
// scheduler's other jobs gets a Locker of its own with gocron.WithDistributedJobLocker.
//
// Ticks must line up across the instances: use cron expressions or daily/weekly/monthly jobs,
// which fire at wall-clock times, or give a DurationJob a common start with gocron.WithStartAt
// (gocron.WithStartDateTime at a time rounded to the period). Two instances that run a
// DurationJob from their own start times have no common ticks to agree on.
//
// # Names
//
// gocron passes the job's name as the lock name. Without gocron.WithName, that is the task
// function's name, which two jobs with the same function share: name every locked job.
//
// # Contexts
//
// gocron calls a task whose first parameter is a context.Context with the job's context (the
// one given with gocron.WithContext, else the scheduler's, cancelled on shutdown) — not the
// lock's: the task's arguments are fixed when the job is created, and the Locker's lock exists
// only for one run. Locker.Func and Elector.Func bridge the two: the wrapped task finds the lock
// of its run (or the leadership) and runs under a context that ends when the lock is lost,
// as everywhere in guard. Without a Locker, decorators.Job inside the task does the same job
// by hand: it takes the lock under the context gocron gives the task, with guard.MinHold for
// the window, and returns an error matching guard.ErrNotAcquired when another instance has the
// tick.
//
// An Elector answers for the whole scheduler, so gocron does not consult a Locker when an
// Elector is set.
//
// [scheduling guide]: https://github.com/guardlock/guard/blob/main/docs/scheduling.md
package gocronlock
