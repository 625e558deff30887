package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/lockname"
)

// Lock returns a middleware that holds the lock named by rendering template from each request
// while the handler runs (see the package doc for templates and responses). It panics, with a
// "guard/middleware:" message, when g is nil, the template is invalid, or an option is.
func Lock(g *guard.Guard, template string, opts ...guard.LockOption) func(http.Handler) http.Handler {
	key, err := compileTemplate(template)
	if err != nil {
		reason := err.Error()
		if ne, ok := errors.AsType[*guard.NameError](err); ok {
			reason = ne.Reason
		}
		panic(fmt.Sprintf("guard/middleware: Lock(%q): %s", template, reason))
	}
	return newLocker("Lock", g, template, key, opts).wrap
}

// LockFunc is Lock for names that a template cannot express: key returns the lock name of a
// request, used as it is (not escaped). Return an error for a request that cannot be locked;
// it is answered 400, as is an empty name. label names the lock in telemetry and must not be
// empty: a constant, never request data. LockFunc panics where Lock does.
func LockFunc(g *guard.Guard, label string, key func(*http.Request) (string, error), opts ...guard.LockOption) func(http.Handler) http.Handler {
	if key == nil {
		panic("guard/middleware: LockFunc: nil key function")
	}
	if label == "" {
		panic("guard/middleware: LockFunc: empty label")
	}
	return newLocker("LockFunc", g, label, func(r *http.Request) (string, error) {
		name, err := key(r)
		if err == nil {
			err = guard.CheckName(name)
		}
		return name, err
	}, opts).wrap
}

// locker is one configured middleware.
type locker struct {
	g   *guard.Guard
	key func(*http.Request) (string, error)
	acq []guard.LockOption // WaitTime(0), Label, then the caller's options
	cfg config
}

// newLocker checks everything Lock and LockFunc were given, or panics naming caller.
func newLocker(caller string, g *guard.Guard, label string, key func(*http.Request) (string, error), opts []guard.LockOption) *locker {
	fail := func(format string, args ...any) {
		panic(fmt.Sprintf("guard/middleware: %s(%q): %s", caller, label, fmt.Sprintf(format, args...)))
	}
	if g == nil {
		fail("nil *guard.Guard")
	}
	acq, err := lockname.CallOptions(label, opts)
	if err != nil {
		fail("%v", err)
	}
	m := &locker{g: g, key: key, acq: acq, cfg: config{busyStatus: http.StatusLocked}}
	for _, o := range opts {
		if o, ok := o.(Option); ok && o.set != nil {
			o.set(&m.cfg)
		}
	}
	if c := m.cfg.busyStatus; c < 400 || c > 599 {
		fail("BusyStatus(%d): not a 4xx or 5xx status", c)
	}
	return m
}

// wrap is the middleware.
func (m *locker) wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("guard/middleware: nil http.Handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, err := m.key(r)
		if err != nil {
			badName(w, err)
			return
		}
		ran := false
		err = m.g.Do(r.Context(), name, func(ctx context.Context) error {
			ran = true
			next.ServeHTTP(w, r.WithContext(ctx))
			return nil
		}, m.acq...)
		switch {
		case ran || err == nil:
			// The handler has answered; a lock lost meanwhile cancelled its context.
		case errors.Is(err, guard.ErrNotAcquired):
			m.busy(w, r, err)
		case errors.Is(err, guard.ErrInvalidName):
			badName(w, err)
		default:
			writeProblem(w, http.StatusServiceUnavailable, "The lock service is unavailable. Try again later.")
		}
	})
}
