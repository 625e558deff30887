package decorators_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
)

// After the work succeeded, a release that fails because the backend is unreachable is not
// the call's error: the call returns the function's results, and the observer hears of it.
// A release that finds the lock gone is: the work may not have run alone (guard.Guard.Do).
func TestReleaseFailsAfterWork(t *testing.T) {
	down := errors.New("dial tcp 10.0.0.9:40001: connection refused")
	for _, tc := range []struct {
		name    string
		release error
		want    error // what the call returns besides the results
	}{
		{"backend unreachable", down, nil},
		{"lock found gone", guard.ErrNotHeld, guard.ErrLockLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := make(guardtest.Releases, 2)
			g := guard.New(guardtest.ReleaseFails{Backend: memstore.New(), Err: tc.release}, guard.WithObserver(obs))
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
