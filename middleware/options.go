package middleware

import (
	"net/http"

	"github.com/guardlock/guard"
)

// Option configures the middleware's responses. An Option is a guard.LockOption, so it goes
// in one list with guard's options: middleware.Lock(g, t, guard.WaitTime(d), BusyStatus(409)).
// A Guard ignores it.
type Option struct {
	guard.EmptyLockOption
	set func(*config)
}

// config is what Options set.
type config struct {
	busyStatus int
	onBusy     func(http.ResponseWriter, *http.Request, error)
}

// BusyStatus sets the status of the response to a busy lock. Default: 423 Locked. code must
// be a 4xx or 5xx status.
func BusyStatus(code int) Option {
	return Option{set: func(c *config) { c.busyStatus = code }}
}

// OnBusy replaces the response to a busy lock: h is called instead, with an error that matches
// guard.ErrNotAcquired (errors.As gives a *guard.BusyError with the holder's remaining lease,
// when known). The handler is not called. Default: a problem response with the BusyStatus
// status and Retry-After.
func OnBusy(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return Option{set: func(c *config) { c.onBusy = h }}
}
