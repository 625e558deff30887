package guardtest

import (
	"context"
	"time"

	"github.com/guardlock/guard"
)

// ReleaseFails is a backend whose releases fail with Err after the work is done: the server
// went away (a driver's error), or the lock was found gone (guard.ErrNotHeld). It takes and
// extends locks as Backend does.
type ReleaseFails struct {
	guard.Backend
	Err error
}

// Release returns Err, and releases nothing.
func (b ReleaseFails) Release(context.Context, string, string, time.Duration) error { return b.Err }

// Releases is an Observer that sends the error of each release it hears of, nil included.
// Make it with room for every release the test expects.
type Releases chan error

// AcquireStart returns ctx.
func (Releases) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context { return ctx }

// AcquireEnd returns ctx.
func (Releases) AcquireEnd(ctx context.Context, _ *guard.Acquisition, _ *guard.Lock, _ error) context.Context {
	return ctx
}

// LockEvent sends the error of an EventReleased.
func (o Releases) LockEvent(_ *guard.Lock, e guard.LockEvent) {
	if e.Kind == guard.EventReleased {
		o <- e.Err
	}
}
