package locktest

import (
	"sync"
	"testing"
	"time"

	"github.com/guardlock/guard"
	"github.com/stretchr/testify/assert"
)

// stepSlack is how far the wall clock may move ahead of the monotonic one between two looks,
// 10 ms apart, before a clockWatch counts it as a step; and driftSlack how far in all, in small
// moves, before they count as one: a lease's drift allowance is 1 % + 2 ms.
const (
	stepSlack  = 5 * time.Millisecond
	driftSlack = 20 * time.Millisecond
)

// clockWatch notices steps forward of this host's wall clock while a test runs. The tests'
// servers run on this host, and every backend decides expiry on its wall clock
// (docs/operations.md#clocks): a step forward ends every lease early at once, which no lock can
// help. Some hosts' clocks are stepped now and then (a virtual machine catching up after a
// pause); a test whose timing assertion failed asks the watch whether that is why. A step back
// only makes leases longer: it is not counted.
type clockWatch struct {
	mu      sync.Mutex
	largest time.Duration // the largest step seen
	steps   int
	ahead   time.Duration // how far the wall clock has moved ahead of the monotonic one, in all
}

// watchClock starts a clockWatch that stops with the test.
func watchClock(t testing.TB) *clockWatch {
	w := &clockWatch{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		last := offset(start, start)
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				off := offset(start, now)
				w.mu.Lock()
				if d := off - last; d > stepSlack {
					w.steps++
					w.largest = max(w.largest, d)
				}
				w.ahead = max(w.ahead, off)
				w.mu.Unlock()
				last = off
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return w
}

// offset returns how far the wall clock has moved from the monotonic one since start.
func offset(start, now time.Time) time.Duration {
	return now.Round(0).Sub(start.Round(0)) - now.Sub(start)
}

// stepped reports whether the wall clock was stepped since the watch began, and says so in the
// test's log.
func (w *clockWatch) stepped(t testing.TB) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.steps == 0 && w.ahead <= driftSlack {
		return false
	}
	t.Logf("this host's wall clock moved %v ahead of its monotonic clock during the test, in %d steps of more than %v (the largest %v): the servers' leases moved with it",
		w.ahead, w.steps, stepSlack, w.largest)
	return true
}

// assertWindowKept asserts that next was granted no sooner than window after first: the MinHold
// window of first was kept. The window is measured on our monotonic clock and kept by the
// server's, which on this host (as the tests' servers are) is the wall clock: a host that steps
// it forward ends the window early on the first but not on the second, so the window was kept
// if it was on either. It says so when only the wall clock kept it.
func assertWindowKept(t testing.TB, first, next *guard.Lock, window time.Duration) {
	t.Helper()
	mono := next.AcquiredAt().Sub(first.AcquiredAt())
	wall := next.AcquiredAt().Round(0).Sub(first.AcquiredAt().Round(0))
	if mono < window && wall >= window {
		t.Logf("taken %v after the first grant by the monotonic clock, %v by the wall clock, which was stepped forward meanwhile: the window was kept on the server's clock", mono, wall)
		return
	}
	assert.GreaterOrEqual(t, mono, window, "taken %v after the first grant (%v by the wall clock), window %v", mono, wall, window)
}
