package cronlock_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"go.uber.org/goleak"
)

// Crons, Guards and servers start goroutines: none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The acceptance schedule: 3 instances run one job every period, for ticks ticks.
const (
	instances = 3
	// A period of 400 ms leaves a run 200 ms of lateness (its hold window) before the next
	// tick finds the name still held: a loaded CI machine (two cores, the race detector, other
	// packages' servers) started runs 182 ms late with 200 ms periods.
	period = 400 * time.Millisecond
	ticks  = 12
	// startLead is how long after a fleet starts its first tick is due: time to connect its
	// clients and create the SQL stores' tables, on a loaded machine.
	startLead = 1500 * time.Millisecond
	// skew is how far apart the instances' timers fire, at most, on top of the scheduling
	// noise.
	skew = 10 * time.Millisecond
	// hold is the hold window by the rule of docs/scheduling.md: half the period.
	hold = period / 2
)

// lockName returns a lock name no other test uses.
func lockName(t *testing.T) string {
	return "cronlock-test:" + strings.ReplaceAll(t.Name(), "/", ":")
}

// skewed is a cron.Schedule that fires every period from t0, each tick early by a random
// amount up to skew: the instances' timers fire milliseconds apart, in a different order at
// every tick, as on machines whose clocks are not quite in step.
type skewed struct {
	t0     time.Time
	period time.Duration
}

// Next returns the first tick after t, counting each tick from the earliest it can fire.
func (s skewed) Next(t time.Time) time.Time {
	k := time.Duration(0)
	if d := t.Add(skew).Sub(s.t0); d >= 0 {
		k = d/s.period + 1
	}
	return s.t0.Add(k*s.period - rand.N(skew))
}

// stop stops c and waits for its running jobs.
func stop(c *cron.Cron) { <-c.Stop().Done() }

// logs is a cron.Logger that keeps what it is told.
type logs struct {
	mu    sync.Mutex // protects infos and errs
	infos []string
	errs  []error
}

func (l *logs) Info(msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, fmt.Sprint(append([]any{msg}, kv...)...))
}

func (l *logs) Error(err error, msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Errorf("%s %v: %w", msg, kv, err))
}

func (l *logs) snapshot() ([]string, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.infos...), append([]error(nil), l.errs...)
}
