// Package cronlock runs robfig/cron v3 (github.com/robfig/cron/v3) jobs once across the
// instances of a service, on any guard backend. Every instance runs the same cron with the same
// entries; a job wrapper, the distributed counterpart of cron.SkipIfStillRunning, skips the
// run on the instances that find another instance holding the job.
//
//	g := guard.New(redisstore.New(rdb))
//	c := cron.New()
//	c.AddJob("*/5 * * * *", cron.NewChain(
//		cron.Recover(cron.DefaultLogger),
//		cronlock.MustSkipIfLocked(g, "report", guard.MinHold(150*time.Second)), // half the period
//	).Then(cronlock.FuncJob(sendReport))) // sendReport(ctx) runs under the lock's context
//	c.Start()
//
// Each run takes the lock with one attempt; the instance that gets it runs the job, and the
// name stays locked for at least the hold window (guard.MinHold, DefaultMinHold by default)
// after the run took it, so that the instances whose timers fire a few milliseconds later
// find the tick taken. Size the window by the rule of the [scheduling guide]: half the job's
// period, right while the instances' timers for one tick fire less than half a period apart.
// Cron expressions fire at wall-clock times, so the ticks of all instances line up. "@every"
// schedules do not: they count from when each instance's cron started (to the whole second),
// so two instances have no common ticks to agree on.
//
// # Contexts
//
// A cron.Job has no context. A job that implements ContextJob — FuncJob adapts a
// func(context.Context) error — runs under the lock's context instead: it is cancelled, with
// cause guard.ErrLockLost or guard.ErrLeaseExpired, when the lock is lost, and
// guard.FromContext gives the lock and its fence. Another cron.Job runs with Run, still under
// the lock but unable to see it. Put the wrapper last in the chain, next to the job, so that
// it sees the job itself; wrappers that come after it hide what the job implements.
//
// A wrapper locks one name: build one for each job (cron.NewChain(…).Then(job)), not one for
// the whole cron with cron.WithChain, which would make all its jobs share one lock.
//
// [scheduling guide]: https://github.com/guardlock/guard/blob/main/docs/scheduling.md
package cronlock
