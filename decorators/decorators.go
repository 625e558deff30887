package decorators

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/lockname"
)

// Func returns fn wrapped so that each call holds the lock named by rendering template with
// the call's argument (see the package doc for templates). The template, the argument type and
// opts are checked here; Func returns a *guard.NameError for a bad template or field, a
// *guard.OptionError for a bad option.
//
// A call of the returned function renders the name, takes the lock (one attempt unless opts
// have guard.WaitTime), runs fn under the lock's context and releases the lock, as
// guard.Guard.Do does. When fn ran, it returns fn's results, its error joined with
// guard.ErrLockLost or guard.ErrLeaseExpired when the lock was lost meanwhile or found gone
// at release; a release that fails otherwise (the backend is unreachable) is not the call's
// error but the observer's to report. When fn did not run, it returns the zero R and: a
// *guard.NameError when the name cannot be rendered (empty value, nil pointer, too long); an
// error matching guard.ErrNotAcquired when the lock is busy; or the other errors of
// guard.Guard.Acquire.
func Func[A, R any](g *guard.Guard, template string, fn func(context.Context, A) (R, error), opts ...guard.LockOption) (func(context.Context, A) (R, error), error) {
	if g == nil {
		return nil, errors.New("guard/decorators: nil *guard.Guard")
	}
	if fn == nil {
		return nil, errors.New("guard/decorators: nil function")
	}
	n, err := newNamer[A](template)
	if err != nil {
		return nil, err
	}
	acq, err := lockname.CallOptions(template, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, a A) (R, error) {
		var r R
		name, err := n.Name(reflect.ValueOf(&a).Elem())
		if err != nil {
			return r, err
		}
		err = g.Do(ctx, name, func(ctx context.Context) error {
			var err error
			r, err = fn(ctx, a)
			return err
		}, acq...)
		return r, err
	}, nil
}

// MustFunc is Func for templates fixed in the program: it panics with a "guard/decorators:"
// message where Func returns an error.
func MustFunc[A, R any](g *guard.Guard, template string, fn func(context.Context, A) (R, error), opts ...guard.LockOption) func(context.Context, A) (R, error) {
	f, err := Func(g, template, fn, opts...)
	if err != nil {
		panic(mustMessage(err))
	}
	return f
}

// Job returns fn wrapped so that each call holds the lock called name — a fixed name, used as
// it is (not a template). It is the shape for workers and scheduled jobs; with
// guard.MinHold(window) the job runs once per window across instances. Job returns a
// *guard.NameError for a bad name and a *guard.OptionError for a bad option.
//
// A call of the returned function returns what guard.Guard.Do returns: fn's error (joined
// with the cause when the lock was lost), or an error matching guard.ErrNotAcquired when the
// lock is busy (another instance runs the job), or the other errors of acquiring it.
func Job(g *guard.Guard, name string, fn func(context.Context) error, opts ...guard.LockOption) (func(context.Context) error, error) {
	if g == nil {
		return nil, errors.New("guard/decorators: nil *guard.Guard")
	}
	if fn == nil {
		return nil, errors.New("guard/decorators: nil function")
	}
	if err := guard.CheckName(name); err != nil {
		return nil, err
	}
	acq, err := lockname.CallOptions(name, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return g.Do(ctx, name, fn, acq...)
	}, nil
}

// MustJob is Job for names fixed in the program: it panics with a "guard/decorators:" message
// where Job returns an error.
func MustJob(g *guard.Guard, name string, fn func(context.Context) error, opts ...guard.LockOption) func(context.Context) error {
	f, err := Job(g, name, fn, opts...)
	if err != nil {
		panic(mustMessage(err))
	}
	return f
}

func mustMessage(err error) string {
	return fmt.Sprintf("guard/decorators: %v", err)
}
