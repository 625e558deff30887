package guardtest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/guardlock/guard"
)

// TickLog records the runs of one scheduled job, by tick, across the instances that schedule
// it. Every run flags itself while it runs, so that two runs at once are caught even when each
// tick ran once. It is safe for concurrent use.
type TickLog struct {
	t0     time.Time // when tick 0 is due
	period time.Duration

	inside   atomic.Int32 // runs in progress
	overlaps atomic.Int32 // runs that started while another was in progress
	late     atomic.Int64 // the latest a run started after its tick was due, in nanoseconds
	// Ran receives the instance of each run when it ends; it holds 1000 before a run blocks.
	Ran chan int

	mu     sync.Mutex // protects runs, fences and lates
	runs   map[int][]int
	fences map[int][]uint64
	lates  map[int]time.Duration // how late each tick's first run started
}

// NewTickLog returns a log for a job due at t0 and every period after.
func NewTickLog(t0 time.Time, period time.Duration) *TickLog {
	return &TickLog{t0: t0, period: period, Ran: make(chan int, 1000),
		runs: map[int][]int{}, fences: map[int][]uint64{}, lates: map[int]time.Duration{}}
}

// Tick0 returns when tick 0 is due.
func (r *TickLog) Tick0() time.Time { return r.t0 }

// Period returns the time between two ticks.
func (r *TickLog) Period() time.Duration { return r.period }

// Tick returns the tick nearest to at. A scheduler whose clock is skewed by less than half a
// period fires each tick nearer to its due time than to any other.
func (r *TickLog) Tick(at time.Time) int {
	return int((at.Sub(r.t0) + r.period/2) / r.period)
}

// Task returns the job as instance runs it: it records its run under the tick that scheduled
// returns the time of — when the scheduler set the running tick to fire — and its fence (when
// it runs under a lock), works for work, and returns the cause of a context that ends first.
// A run that starts late, however late, counts for the tick that started it.
func (r *TickLog) Task(instance int, work time.Duration, scheduled func() time.Time) func(context.Context) error {
	return func(ctx context.Context) error {
		k := r.Tick(scheduled())
		late := time.Since(r.t0.Add(time.Duration(k) * r.period))
		for old := r.late.Load(); int64(late) > old && !r.late.CompareAndSwap(old, int64(late)); old = r.late.Load() {
		}
		if r.inside.Add(1) > 1 {
			r.overlaps.Add(1)
		}
		defer func() {
			r.inside.Add(-1)
			r.Ran <- instance
		}()
		r.mu.Lock()
		if _, ok := r.lates[k]; !ok {
			r.lates[k] = late
		}
		r.runs[k] = append(r.runs[k], instance)
		if l, ok := guard.FromContext(ctx); ok {
			r.fences[k] = append(r.fences[k], l.Fence())
		}
		r.mu.Unlock()
		if work <= 0 {
			return context.Cause(ctx)
		}
		tm := time.NewTimer(work)
		defer tm.Stop()
		select {
		case <-tm.C:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// Runs returns the instances that ran each tick, in the order they ran it.
func (r *TickLog) Runs() map[int][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.runs)
}

// Overlaps returns how many runs started while another was running.
func (r *TickLog) Overlaps() int { return int(r.overlaps.Load()) }

// RequireOncePerTick checks that each of the first ticks ticks ran exactly once, that no tick
// ran twice, that no two runs overlapped, and that the fences rose from tick to tick; it logs
// the runs.
//
// One miss is excused, and logged: a tick that ran nowhere right after a tick whose run
// started more than half a period late. The hold window (half the period, by the rule of
// docs/scheduling.md) of that late run then covered the next tick's timers, as it should; a
// machine loaded enough to start a run that late (two cores, the race detector, other
// packages' servers) makes it happen. More than a quarter of the ticks missed that way fails.
func (r *TickLog) RequireOncePerTick(t *testing.T, ticks int) {
	t.Helper()
	r.mu.Lock()
	runs, fences, lates := maps.Clone(r.runs), maps.Clone(r.fences), maps.Clone(r.lates)
	r.mu.Unlock()
	r.Log(t)
	excused := map[int]bool{}
	for k := 1; k < ticks; k++ {
		if len(runs[k]) == 0 && len(runs[k-1]) == 1 && lates[k-1] > r.period/2 {
			excused[k] = true
			t.Logf("tick %d ran nowhere: tick %d's run started %v late, and its hold window covered tick %d",
				k, k-1, lates[k-1].Round(time.Millisecond), k)
		}
	}
	assert.LessOrEqual(t, len(excused), ticks/4, "ticks missed after late runs")
	for k := range ticks {
		if !excused[k] {
			assert.Len(t, runs[k], 1, "tick %d ran on instances %v", k, runs[k])
		}
	}
	for k, ids := range runs {
		assert.LessOrEqual(t, len(ids), 1, "tick %d ran on instances %v", k, ids)
	}
	assert.Zero(t, r.Overlaps(), "runs overlapped")
	last := -1 // the last tick that ran, for its fence
	for k := range ticks {
		switch {
		case excused[k]:
		case len(fences[k]) != 1:
			assert.Fail(t, "a run without a fence", "tick %d: %v", k, fences[k])
		case last >= 0:
			assert.Greater(t, fences[k][0], fences[last][0], "fence of tick %d", k)
			last = k
		default:
			last = k
		}
	}
}

// Log logs the runs by tick ("tick:[instances]") and the number of runs of each instance.
func (r *TickLog) Log(t *testing.T) {
	t.Helper()
	runs := r.Runs()
	var b strings.Builder
	perInstance := map[int]int{}
	for _, k := range slices.Sorted(maps.Keys(runs)) {
		fmt.Fprintf(&b, " %d:%v", k, runs[k])
		for _, id := range runs[k] {
			perInstance[id]++
		}
	}
	t.Logf("runs per tick (tick:[instance]):%s", b.String())
	t.Logf("runs by instance: %v; the latest run started %v after its tick was due", perInstance,
		time.Duration(r.late.Load()).Round(time.Millisecond))
}

// RanTwice returns how many ticks ran more than once.
func (r *TickLog) RanTwice() int {
	n := 0
	for _, ids := range r.Runs() {
		if len(ids) > 1 {
			n++
		}
	}
	return n
}
