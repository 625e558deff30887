package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
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
// it is answered 400, as is an empty name, with a problem that does not show the error (it
// may tell internals: a MarshalText error, an address); slog's default logger gets it at
// debug level. key may read the request body (see MaxBodyBytes): the handler reads it again
// from its start. With StreamBody too, where what key reads is kept in memory until the
// handler reads it again: read what names the lock, not the whole of a large body. label
// names the lock in telemetry and must not be empty: a constant, never request data.
// LockFunc panics where Lock does.
func LockFunc(g *guard.Guard, label string, key func(*http.Request) (string, error), opts ...guard.LockOption) func(http.Handler) http.Handler {
	if key == nil {
		panic("guard/middleware: LockFunc: nil key function")
	}
	if label == "" {
		panic("guard/middleware: LockFunc: empty label")
	}
	m := newLocker("LockFunc", g, label, opts)
	m.key = func(q *request) (string, error) {
		var kb *keyBody
		if m.cfg.streamBody {
			kb = recordKeyRead(q.r)
		}
		name, err := key(q.r)
		kb.replay(q.r)
		if err != nil {
			return "", &keyError{err}
		}
		return name, guard.CheckName(name)
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
	// Clipped, so that an acquisition that adds options of its own (a Semaphore's, an
	// RWMutex's kind) copies them: requests share acq.
	m := &locker{g: g, label: label, acq: slices.Clip(acq), cfg: config{
		maxBody: defaultMaxBody, bodyTimeout: defaultBodyTimeout,
	}}
	for _, o := range opts {
		if o, ok := o.(Option); ok && o.set != nil {
			o.set(&m.cfg)
		}
	}
	switch {
	case m.cfg.permitsSet && m.cfg.permits < 1:
		fail("Permits(%d): must be at least 1", m.cfg.permits)
	case m.cfg.permitsSet && m.cfg.readWrite:
		fail("Permits and ReadWrite: a route's lock is a semaphore or a read-write lock, not both")
	case m.cfg.permitsSet:
		if _, err := g.Semaphore("guard-middleware-probe", m.cfg.permits); err != nil {
			fail("Permits(%d): %v", m.cfg.permits, err)
		}
	case m.cfg.readWrite:
		if _, err := g.RWMutex("guard-middleware-probe"); err != nil {
			fail("ReadWrite: %v", err)
		}
	}
	if !m.cfg.busyStatusSet {
		m.cfg.busyStatus = http.StatusLocked
		if m.cfg.permitsSet {
			m.cfg.busyStatus = http.StatusTooManyRequests
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
	if m.cfg.maxBody < 0 {
		fail("MaxBodyBytes(%d): negative", m.cfg.maxBody)
	}
	if m.cfg.bodyTimeout < 0 {
		fail("BodyTimeout(%v): negative", m.cfg.bodyTimeout)
	}
	return m
}

// wrap is the middleware.
func (m *locker) wrap(next http.Handler) http.Handler {
	if next == nil {
		panic("guard/middleware: nil http.Handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, buf := m.readBody(w, r)
		if r == nil {
			return // answered
		}
		if ab, ok := r.Body.(*aheadBody); ok {
			defer ab.stop()
		}
		q := newRequest(r)
		name, err := m.key(q)
		unrouted := q.unrouted
		q.free()
		if unrouted != "" {
			m.notRouted(w, unrouted)
			return
		}
		if err != nil {
			m.badName(w, r, err)
			return
		}
		buf.rewind(r) // LockFunc's key may have read it
		if pastDeadline(r.Context()) {
			timeUp(w) // while the body came
			return
		}
		ran, ended := false, false
		err = m.do(r, name, func(ctx context.Context) error {
			if r.Context().Err() != nil {
				// The client left, or the request's deadline passed, while the lock was
				// being granted: the work must not be done for nobody, or too late.
				ended = true
				return nil
			}
			ran = true
			next.ServeHTTP(w, r.WithContext(ctx))
			return nil
		})
		switch {
		case ended:
			if pastDeadline(r.Context()) {
				timeUp(w)
			} else {
				clientLeft(w, r)
			}
		case ran || err == nil:
			// The handler has answered. A lock lost meanwhile cancelled its context; a
			// release that failed after it is the observer's to report (guard.Guard.Do).
		case errors.Is(err, guard.ErrNotAcquired) && pastDeadline(r.Context()):
			timeUp(w)
		case r.Context().Err() != nil:
			// The request's own context ended the wait, or the attempt: its client left.
			// Not busy: nobody else holds the lock for all it tells.
			clientLeft(w, r)
		case errors.Is(err, guard.ErrNotAcquired):
			m.busy(w, r, err)
		case errors.Is(err, guard.ErrInvalidName):
			m.badName(w, r, err)
		case errors.Is(err, guard.ErrUpgrade):
			writeProblem(w, http.StatusInternalServerError, "The request asked for the write side of a lock "+
				"that it holds the read side of.")
		default:
			writeProblem(w, http.StatusServiceUnavailable, "The lock service is unavailable. Try again later.")
		}
	})
}

// do runs fn under the route's lock on name — a mutex, a permit of a semaphore (Permits), or
// the read or write side of a read-write lock (ReadWrite) — as guard.Guard.Do runs it: the
// lock is released when fn returns or panics.
func (m *locker) do(r *http.Request, name string, fn func(context.Context) error) error {
	ctx := r.Context()
	switch {
	case m.cfg.permits > 0:
		s, err := m.g.Semaphore(name, m.cfg.permits)
		if err != nil {
			return err
		}
		return s.Do(ctx, fn, m.acq...)
	case m.cfg.readWrite:
		rw, err := m.g.RWMutex(name)
		if err != nil {
			return err
		}
		var l *guard.Lock
		if safeMethod(r.Method) {
			l, err = rw.RLock(ctx, m.acq...)
		} else {
			l, err = rw.Lock(ctx, m.acq...)
		}
		if err != nil {
			return err
		}
		// The middleware answers from fn alone once it runs: what the release says is the
		// observer's to report (guard.Guard.Do).
		defer func() { _ = l.Release(ctx) }()
		return fn(l.Context())
	}
	return m.g.Do(ctx, name, fn, m.acq...)
}

// safeMethod reports whether a request with method reads only (RFC 9110, 9.2.1): it takes
// the read side of a ReadWrite lock.
func safeMethod(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
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
