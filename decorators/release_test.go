package decorators_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/memstore"
)

// releaseFails is a backend whose releases fail with err: the server went away, or the lock
// was found gone (guard.ErrNotHeld).
type releaseFails struct {
	guard.Backend
	err error
}

func (b releaseFails) Release(context.Context, string, string, time.Duration) error { return b.err }

// releases is an Observer that passes on the error of each release.
type releases chan error

func (releases) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context { return ctx }

func (releases) AcquireEnd(ctx context.Context, _ *guard.Acquisition, _ *guard.Lock, _ error) context.Context {
	return ctx
}

func (o releases) LockEvent(_ *guard.Lock, e guard.LockEvent) {
	if e.Kind == guard.EventReleased {
		o <- e.Err
	}
}

// After the work succeeded, a release that fails because the backend is unreachable is not
// the call's error: the call returns the function's results, and the observer hears of it.
// A release that finds the lock gone is: the work may not have run alone (guard.Guard.Do).
func TestReleaseFailsAfterWork(t *testing.T) {
	down := errors.New("dial tcp 10.0.0.9:6379: connection refused")
	for _, tc := range []struct {
		name    string
		release error
		want    error // what the call returns besides the results
	}{
		{"backend unreachable", down, nil},
		{"lock found gone", guard.ErrNotHeld, guard.ErrLockLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := make(releases, 2)
			g := guard.New(releaseFails{memstore.New(), tc.release}, guard.WithObserver(obs))
			t.Cleanup(func() { _ = g.Close(context.Background()) })

			f := decorators.MustFunc(g, "orders:{ID}", func(ctx context.Context, o Order) (string, error) {
				return "shipped " + o.ID, nil
			})
			r, err := f(t.Context(), Order{ID: "7"})
			assert.Equal(t, "shipped 7", r, "the function's result, whatever the release did")
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			assert.ErrorIs(t, <-obs, tc.release, "the observer hears of the failed release")

			job := decorators.MustJob(g, "report", func(context.Context) error { return nil })
			err = job(t.Context())
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			assert.ErrorIs(t, <-obs, tc.release)
		})
	}
}
