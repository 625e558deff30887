package decorators

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/lockname"
)

// Func returns fn wrapped so that each call holds the lock named by rendering template with
// the call's argument (see the package doc for templates). The template, the argument type and
// opts are checked here; Func returns a *guard.NameError for a bad template or field, a
// *guard.OptionError for a bad option, and an error matching guard.ErrUnsupported for Permits,
// Read or Write on a Guard whose backend grants no shared holds.
//
// A call of the returned function renders the name, takes the lock (one attempt unless opts
// have guard.WaitTime), runs fn under the lock's context and releases the lock, as
// guard.Guard.Do does. When fn ran, it returns fn's results, its error joined with
// guard.ErrLockLost or guard.ErrLeaseExpired when the lock was lost meanwhile or found gone
// at release; a release that fails otherwise (the backend is unreachable) is not the call's
// error but the observer's to report. When fn did not run, it returns the zero R and: a
// *guard.NameError when the name cannot be rendered (empty value, nil pointer, too long); an
// error matching guard.ErrNotAcquired when the lock is busy (a *guard.BusyError whose Kind
// says what was busy: guard.KindPermit when every permit was taken); or the other errors of
// guard.Guard.Acquire. With Permits, Read or Write (Option) a call holds a permit or a side of
// the rendered name instead of its lock.
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
	p, err := choose(g, opts, false)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, a A) (R, error) {
		var r R
		name, err := n.Name(reflect.ValueOf(&a).Elem())
		if err != nil {
			return r, err
		}
		err = p.do(ctx, g, name, func(ctx context.Context) error {
			var err error
			r, err = fn(ctx, a)
			return err
		}, acq)
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
// guard.MinHold(window) the job runs once per window across instances; with Permits(n), up to
// n calls run at once across instances. Job returns a *guard.NameError for a bad name, a
// *guard.OptionError for a bad option, and an error matching guard.ErrUnsupported for
// Permits, Read or Write on a Guard whose backend grants no shared holds.
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
	p, err := choose(g, opts, false)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return p.do(ctx, g, name, fn, acq)
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

// FuncAll returns fn wrapped so that each call holds the locks named by rendering each of
// templates with the call's argument — all of them, or none, as guard.Guard.AcquireAll takes
// them: a transfer that locks both of its accounts, an import that touches several tenants.
//
//	transfer := decorators.MustFuncAll(g, []string{"account:{From}", "account:{To}"}, svc.Transfer)
//
// The names are taken in one canonical order, whatever the order of templates, so that calls
// whose names overlap never wait for each other in a circle; a name rendered twice (a transfer
// from an account to itself) is taken once. The telemetry label is the templates joined by
// ", ". FuncAll returns what Func returns for each template and option, a *guard.NameError
// when templates is empty, and a *guard.OptionError for Permits, Read or Write: it takes each
// name's lock.
//
// A call runs fn under the multi-lock's context, which ends when any of the locks is lost, and
// returns what a call of Func returns; when one name is busy it returns that name's
// *guard.BusyError, holding none of them.
func FuncAll[A, R any](g *guard.Guard, templates []string, fn func(context.Context, A) (R, error), opts ...guard.LockOption) (func(context.Context, A) (R, error), error) {
	if g == nil {
		return nil, errors.New("guard/decorators: nil *guard.Guard")
	}
	if fn == nil {
		return nil, errors.New("guard/decorators: nil function")
	}
	if len(templates) == 0 {
		return nil, &guard.NameError{Name: "", Reason: "FuncAll needs at least one template"}
	}
	namers := make([]*lockname.Namer[reflect.Value], len(templates))
	for i, template := range templates {
		n, err := newNamer[A](template)
		if err != nil {
			return nil, err
		}
		namers[i] = n
	}
	acq, err := lockname.CallOptions(strings.Join(templates, ", "), opts)
	if err != nil {
		return nil, err
	}
	if _, err := choose(g, opts, true); err != nil {
		return nil, err
	}
	return func(ctx context.Context, a A) (R, error) {
		var r R
		arg := reflect.ValueOf(&a).Elem()
		names := make([]string, len(namers))
		for i, n := range namers {
			name, err := n.Name(arg)
			if err != nil {
				return r, err
			}
			names[i] = name
		}
		l, err := g.AcquireAll(ctx, names, acq...)
		if err != nil {
			return r, err
		}
		err = run(ctx, l, func(ctx context.Context) error {
			var err error
			r, err = fn(ctx, a)
			return err
		})
		return r, err
	}, nil
}

// MustFuncAll is FuncAll for templates fixed in the program: it panics with a
// "guard/decorators:" message where FuncAll returns an error.
func MustFuncAll[A, R any](g *guard.Guard, templates []string, fn func(context.Context, A) (R, error), opts ...guard.LockOption) func(context.Context, A) (R, error) {
	f, err := FuncAll(g, templates, fn, opts...)
	if err != nil {
		panic(mustMessage(err))
	}
	return f
}
