// Package guard is a distributed lock for Go services that run as several instances: "only one
// instance does this at a time" — a nightly report, a batch of tasks, a withdrawal on one
// account — declared once, at the edge of the code it protects.
//
// A Guard hands out locks on one Backend: memstore (in-process, the embedded default),
// redisstore, mongostore, pgstore or mysqlstore.
//
//	g := guard.New(memstore.New())
//	defer g.Close(ctx)
//
//	err := g.Do(ctx, "report:nightly", func(ctx context.Context) error {
//		return buildReport(ctx) // ctx ends if the lock is lost
//	}, guard.WaitTime(0))
//
// Every acquisition gets a fresh owner token and a fence, a number that strictly increases per
// name: pass it to the resource you protect, so that it can reject a stale holder. Without
// LeaseTime the Guard's watchdog keeps the lock until Release (package watchdog states the
// rules); with it, the lock lives that long. A Lock's context ends, with a cause
// (ErrLockLost, ErrLeaseExpired, ErrReleased, ErrClosed), no later than the lock's local
// validity deadline, even when the backend never answers. Acquire waits, in arrival order where
// the backend keeps a queue; TryAcquire makes one attempt; code that runs under a Lock and asks
// for the same name with its context re-enters it.
//
// Packages decorators and middleware put a lock in front of a function or an HTTP handler with
// a lock-name template; gocronlock and cronlock lock scheduled jobs; tracing records every wait
// and hold as OpenTelemetry spans and metrics; locktest is the conformance suite a Backend
// passes.
//
// The [semantics guide] says what these guarantees rest on, and what a lease-based lock cannot
// guarantee.
//
// [semantics guide]: https://github.com/guardlock/guard/blob/main/docs/semantics.md
package guard
