package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/lockname"
)

// Lock returns a middleware that holds the lock named by rendering template from each request
// while the handler runs (see the package doc for templates and responses). It panics, with a
// "guard/middleware:" message, when g is nil, the template is invalid, or an option is.
func Lock(g *guard.Guard, template string, opts ...guard.LockOption) func(http.Handler) http.Handler {
	m := newLocker("Lock", g, template, opts)
	key, err := compileTemplate(template, m.cfg.pathValues)
	if err != nil {
		reason := err.Error()
		if ne, ok := errors.AsType[*guard.NameError](err); ok {
			reason = ne.Reason
		}
		panic(fmt.Sprintf("guard/middleware: Lock(%q): %s", template, reason))
	}
	m.key = key
	return m.wrap
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
	m := newLocker("LockFunc", g, label, opts)
	m.key = func(q *request) (string, error) {
		name, err := key(q.r)
		if err == nil {
			err = guard.CheckName(name)
		}
		return name, err
	}
	return m.wrap
}

// locker is one configured middleware.
type locker struct {
	g     *guard.Guard
	label string // the template, or LockFunc's label
	key   func(*request) (string, error)
	acq   []guard.LockOption // WaitTime(0), Label, then the caller's options
	cfg   config

	unroutedOnce sync.Once // logs the first request that came before routing
}

// newLocker checks g and opts, or panics naming caller.
func newLocker(caller string, g *guard.Guard, label string, opts []guard.LockOption) *locker {
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
	m := &locker{g: g, label: label, acq: acq, cfg: config{busyStatus: http.StatusLocked}}
	for _, o := range opts {
		if o, ok := o.(Option); ok && o.set != nil {
			o.set(&m.cfg)
		}
	}
	if c := m.cfg.busyStatus; c < 400 || c > 599 {
		fail("BusyStatus(%d): not a 4xx or 5xx status", c)
	}
	if m.cfg.onBusySet && m.cfg.onBusy == nil {
		fail("OnBusy(nil)")
	}
	if m.cfg.pathValuesSet && m.cfg.pathValues == nil {
		fail("PathValues(nil)")
	}
	return m
}

// wrap is the middleware.
func (m *locker) wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("guard/middleware: nil http.Handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := request{r: r}
		name, err := m.key(&q)
		if q.unrouted != "" {
			m.notRouted(w, q.unrouted)
			return
		}
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
			// The handler has answered. A lock lost meanwhile cancelled its context; a
			// release that failed after it is the observer's to report (guard.Guard.Do).
		case errors.Is(err, guard.ErrNotAcquired):
			m.busy(w, r, err)
		case errors.Is(err, guard.ErrInvalidName):
			badName(w, err)
		default:
			writeProblem(w, http.StatusServiceUnavailable, "The lock service is unavailable. Try again later.")
		}
	})
}

// notRouted answers a request that reached the middleware before a router matched it to a
// route with the placeholder key: a mistake in the program, which every request meets. It
// logs it once.
func (m *locker) notRouted(w http.ResponseWriter, key string) {
	m.unroutedOnce.Do(func() {
		slog.Error(fmt.Sprintf("guard/middleware: Lock(%q): {%s} has no value: the request reached the middleware "+
			"before a router matched it to a route with that parameter. Mount the middleware on the route "+
			"(chi: r.With or a Route group's r.Use; http.ServeMux: mux.Handle(pattern, lock(h))), not on the "+
			"router, and name the route's parameters in the template; for other routers see "+
			"middleware.PathValues. Every such request is answered 500.", m.label, key))
	})
	writeProblem(w, http.StatusInternalServerError, "{"+key+"} has no value: the lock middleware ran before "+
		"the request was routed, or the route has no such parameter. Mount the middleware on the route, not on "+
		"the router (see docs/templates.md of github.com/guardlock/guard).")
}
