// Package watchdog states the rules by which a Guard keeps its locks alive and decides when
// it can no longer trust them; the Guard applies them with one scheduler of its own.
//
// A lock taken without a lease time is renewed every TTL/3 (TTL: the Guard's watchdog timeout,
// 30 s by default); a lock with a fixed lease is only watched. The renewals due within TTL/6
// go out together, one backend call per server (a Redis Cluster master), so that locks taken
// at different moments share round trips. A renewal left unanswered for TTL/6 is sent again on
// its own, and several batches may be out at once: one slow reply or one slow server costs no
// other lock its renewal. A failed renewal is tried again every TTL/10, at most every second.
//
// A lock's local validity deadline is Deadline(start, TTL) = start + TTL − Drift(TTL), where
// start is read before the request that set the lease was sent. The lease on the server cannot
// have run out before that moment, as long as the server's clock neither runs much faster than
// the client's nor steps forward. The Guard cancels the lock's context at that deadline, even
// when the backend never answers, and at once when a renewal finds the lock gone.
//
// A host that was suspended (a paused VM, a laptop lid) stops Go's monotonic clock, on which
// deadlines are measured. The Guard compares it with the wall clock at least every second
// while it holds locks; when the wall clock ran ahead, it moves every deadline back by the time
// the host was away, ends the locks whose time ran out (the last error is ErrSuspended) and
// renews the rest at once.
//
// docs/semantics.md explains what this guarantees and what it cannot.
package watchdog

import (
	"errors"
	"time"
)

// Drift is the safety margin subtracted from a lease's TTL to get its local deadline: 1% of
// the TTL for clock rate differences, plus 2 ms for timer and scheduling lag.
func Drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// Deadline returns the local validity deadline of a lease of ttl set by a request sent at start.
func Deadline(start time.Time, ttl time.Duration) time.Time {
	return start.Add(ttl - Drift(ttl))
}

// ErrSuspended is the error a lock's loss carries when the host was found suspended for longer
// than the lock's lease had left.
var ErrSuspended = errors.New("watchdog: the host was suspended")
