package locktest

import (
	"sync"
	"testing"
	"time"
)

// stepSlack is how far the wall clock may move apart from the monotonic one between two looks
// before a clockWatch counts it as a step: a lease's drift allowance is 1 %, and a look takes
// 10 ms.
const stepSlack = 20 * time.Millisecond

// clockWatch notices steps of this host's wall clock while a test runs. The tests' servers run
// on this host, and every backend decides expiry on its wall clock (docs/operations.md#clocks):
// a step forward ends every lease early at once, which no lock can help. Some hosts' clocks are
// stepped now and then (a virtual machine catching up after a pause); a test whose timing
// assertion failed asks the watch whether that is why.
type clockWatch struct {
	mu      sync.Mutex
	largest time.Duration // the largest step seen, either way
	steps   int
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
				if d := (off - last).Abs(); d > stepSlack {
					w.mu.Lock()
					w.steps++
					w.largest = max(w.largest, d)
					w.mu.Unlock()
				}
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
	if w.steps == 0 {
		return false
	}
	t.Logf("this host's wall clock was stepped %d times during the test, by up to %v: the servers' leases moved with it", w.steps, w.largest)
	return true
}
