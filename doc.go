// Package guard is a distributed lock for Go services that run as several instances: "only one
// instance does this at a time" — a nightly report, a batch of tasks, a withdrawal on one
// account — declared once, at the edge of the code it protects.
//
// A Guard hands out locks on one Backend (memstore in-process, redisstore, mongostore):
//
//	g := guard.New(memstore.New())
//	defer g.Close(ctx)
//
//	err := g.Do(ctx, "report:nightly", func(ctx context.Context) error {
//		return buildReport(ctx) // ctx ends if the lock is lost
//	}, guard.WaitTime(0))
//
// Packages decorators and middleware put a lock in front of a function or an HTTP handler with
// a lock-name template over its argument or request; package tracing records every wait and
// hold as OpenTelemetry spans and metrics.
//
// # Semantics
//
// Every acquisition gets a fresh random token; only that token extends or releases it. Every
// acquisition gets a fence, a number that strictly increases per name on the backend: pass it
// to the resource you protect so that it can reject a stale holder.
//
// Without LeaseTime, the Guard's watchdog holds the lock with a lease of the watchdog timeout
// (30 s by default) and renews it every third of that, in one batched call per tick for all
// the Guard's locks, until Release. With LeaseTime, the lock lives that long and is not
// renewed.
//
// A Lock's context (Lock.Context) ends, with a cause, when the lock can no longer be trusted:
// ErrLockLost when another owner took the name or renewal could not be confirmed, and
// ErrLeaseExpired when a fixed lease runs out — no later than the local validity deadline
// start + TTL − drift, where start is read before the acquire request was sent. That holds even
// when the backend never answers: the deadline is kept by the Guard's own clock.
//
// Acquire waits until its context is done; WaitTime bounds the wait; TryAcquire makes one
// attempt. Waiters are woken by release notifications (a backend that implements Notifier) and
// by releases on the same Guard, and re-try when the holder's lease would run out, so a crashed
// holder never strands them; on a backend without notifications they re-try with a jittered
// backoff of at most a second. MinHold keeps a name locked for a minimum window after release.
// Code that runs under a Lock and asks the same Guard for the same name with that context
// re-enters the lock instead of waiting for itself.
//
// See docs/semantics.md for the guarantees and, as important, what a lease-based lock cannot
// guarantee.
package guard
