package middleware

import (
	"net/http"

	"github.com/guardlock/guard"
)

// Option configures the middleware. An Option is a guard.LockOption, so it goes in one list
// with guard's options: middleware.Lock(g, t, guard.WaitTime(d), BusyStatus(409)). A Guard
// ignores it. Options only record their values: Lock and LockFunc check them.
type Option struct {
	guard.EmptyLockOption
	set func(*config)
}

// config is what Options set.
type config struct {
	busyStatus    int
	onBusy        func(http.ResponseWriter, *http.Request, error)
	onBusySet     bool // OnBusy was given, perhaps with nil
	pathValues    func(*http.Request, string) (string, bool)
	pathValuesSet bool // PathValues was given, perhaps with nil
}

// BusyStatus sets the status of the response to a busy lock. Default: 423 Locked. code must
// be a 4xx or 5xx status.
func BusyStatus(code int) Option {
	return Option{set: func(c *config) { c.busyStatus = code }}
}

// OnBusy replaces the response to a busy lock: h is called instead, with an error that matches
// guard.ErrNotAcquired (errors.As gives a *guard.BusyError with the holder's remaining lease,
// when known). The handler is not called. Default: a problem response with the BusyStatus
// status and Retry-After. h must not be nil.
func OnBusy(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return Option{set: func(c *config) { c.onBusy, c.onBusySet = h, true }}
}

// PathValues makes Lock read the template's path parameters with fn, for routers that keep
// them elsewhere than chi and http.ServeMux do — gorilla/mux's mux.Vars, for one
// (docs/templates.md shows gorilla/mux, gin and echo). fn returns the value of the parameter
// name of the route that r was matched to, decoded as ServeMux's Request.PathValue is ("a"
// for "%61", "a/b" for "a%2Fb"), and ok false when r has not been matched to a route with
// that parameter: the middleware then answers 500, as for a middleware mounted on the router
// instead of the route (see the package doc). fn must not be nil.
//
// Default: chi's URL parameter when chi routed the request (decoded), else
// Request.PathValue.
func PathValues(fn func(r *http.Request, name string) (value string, ok bool)) Option {
	return Option{set: func(c *config) { c.pathValues, c.pathValuesSet = fn, true }}
}
