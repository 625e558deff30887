package locktest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// TestHandoffEndsOnAFailure: when one instance's locker fails, Handoff ends instead of leaving
// the other instance waiting for a turn that never comes (it hung until the test's timeout).
func TestHandoffEndsOnAFailure(t *testing.T) {
	for _, failUnlock := range []bool{false, true} {
		mu := make(chan struct{}, 1)
		var calls atomic.Int32
		locker := func(fail bool) Locker {
			return func(ctx context.Context, _ string) (func() error, error) {
				if fail && calls.Add(1) == 3 && !failUnlock {
					return nil, errors.New("broken backend")
				}
				select {
				case mu <- struct{}{}:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return func() error {
					if fail && failUnlock && calls.Load() >= 3 {
						return errors.New("broken release") // and the lock stays taken
					}
					<-mu
					return nil
				}, nil
			}
		}
		res := testing.Benchmark(func(b *testing.B) {
			Handoff(b, "n", [2]Locker{locker(false), locker(true)}, nil)
		})
		t.Logf("failUnlock=%v: ended after %d ops", failUnlock, res.N)
	}
}
