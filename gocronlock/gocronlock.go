package gocronlock

import (
	"errors"
	"time"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrNotLeader is what Elector.IsLeader returns on an instance that does not lead: gocron
	// then skips the run.
	ErrNotLeader = errors.New("guard/gocronlock: not the leader")
	// ErrNoLock is returned by a task wrapped with Locker.Func when the Locker holds no lock for
	// the run: the job is not locked by that Locker (another Locker, none, or an Elector), or
	// its task was given a context of its own instead of gocron's. The task did not run.
	ErrNoLock = errors.New("guard/gocronlock: the run holds no lock of this Locker")
	// ErrClosed is the cause of the leadership lock's context when Elector.Close ends the
	// term.
	ErrClosed = errors.New("guard/gocronlock: elector closed")
)

// DefaultMinHold is the hold-at-least that a Locker gives each run unless guard.MinHold says
// otherwise: half a second. By the sizing rule of docs/scheduling.md — hold for half the
// job's period — it suits every job that runs at most once a second (the shortest period of a
// cron expression), on instances whose timers fire less than half a second apart. A job that
// runs more often needs guard.MinHold(period/2).
const DefaultMinHold = 500 * time.Millisecond

// DefaultSettle is how long a newly elected Elector waits before it leads, unless Settle says
// otherwise: the same half second as DefaultMinHold, by the same rule.
const DefaultSettle = DefaultMinHold
