// Package watchdog states the rules by which a Guard keeps its locks alive and decides when
// it can no longer trust them; the Guard applies them with one scheduler of its own.
//
// A lock taken without a lease time is renewed every RenewAfter(TTL) = TTL/3 (TTL: the Guard's
// watchdog timeout, 30 s by default); a lock with a fixed lease is only watched. The renewals
// due within BatchWindow(TTL) = TTL/6 go out together, one backend call per server (a Redis
// Cluster master), so that locks taken at different moments share round trips. A renewal left
// unanswered for HedgeAfter(TTL) = TTL/6 is sent again on its own, and several batches may be
// out at once: one slow reply or one slow server costs no other lock its renewal. A failed
// renewal is tried again after RetryAfter(TTL): TTL/10, at most a second.
//
// A lock handed over by a backend's wait queue gets the lease its waiter asked for, but no
// longer than the waiter's place in the queue (Place), so that a waiter that died holds the
// name no longer than that; the Guard claims the rest of the lease as a renewal would, after a
// third of what it was granted, unless the lock is released sooner. Every request that sets a
// lease — a renewal, a claim, an Extend — goes through the lock's one lease owner, one kind
// at a time, so they reach the server in the order they were decided; a request that may
// shorten the lease moves the local deadline before it is sent, and a request whose answer
// never came keeps its lease in doubt: later answers are trusted for no longer than it asked.
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
// The [semantics guide] explains what this guarantees and what it cannot.
//
// [semantics guide]: https://github.com/guardlock/guard/blob/main/docs/semantics.md
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

// RenewAfter is how long after the request that set a watchdog lease of ttl the lease is renewed.
func RenewAfter(ttl time.Duration) time.Duration { return ttl / 3 }

// BatchWindow is how far ahead of their time renewals of a lease of ttl join a batch that is
// being sent, so that locks taken at different moments share round trips.
func BatchWindow(ttl time.Duration) time.Duration { return ttl / 6 }

// HedgeAfter is how long a renewal of a lease of ttl may go unanswered before it is sent again.
func HedgeAfter(ttl time.Duration) time.Duration { return ttl / 6 }

// RetryAfter is how soon a failed renewal of a lease of ttl is tried again.
func RetryAfter(ttl time.Duration) time.Duration { return min(ttl/10, time.Second) }

// Place is how long a waiter that asked for a lease of ttl keeps its place in a backend's wait
// queue after its last request, in a queue whose places last queueTimeout: never longer than
// the lease it asked for, so that a waiter whose process died or stopped keeps the name from
// others — as a place in the queue, or as the lease a hand-over gives it — no longer than a
// holder that asked for the same lease would. A live waiter asks again within half of it.
func Place(queueTimeout, ttl time.Duration) time.Duration { return min(queueTimeout, ttl) }

// ErrSuspended is the error a lock's loss carries when the host was found suspended for longer
// than the lock's lease had left.
var ErrSuspended = errors.New("watchdog: the host was suspended")
