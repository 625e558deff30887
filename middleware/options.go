package middleware

import (
	"net/http"
	"time"

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
	busyStatusSet bool // BusyStatus was given
	onBusy        func(http.ResponseWriter, *http.Request, error)
	onBusySet     bool // OnBusy was given, perhaps with nil
	pathValues    func(*http.Request, string) (string, bool)
	pathValuesSet bool // PathValues was given, perhaps with nil
	maxBody       int64
	bodyTimeout   time.Duration
	streamBody    bool
	permits       int  // Permits(n): a semaphore of n; 0: a mutex, or a read-write lock
	permitsSet    bool // Permits was given, perhaps with a bad count
	readWrite     bool // ReadWrite
}

// The defaults of the body options.
const (
	defaultMaxBody     = 1 << 20
	defaultBodyTimeout = 30 * time.Second
)

// BusyStatus sets the status of the response to a busy lock. Default: 423 Locked, and 429 Too
// Many Requests with Permits. code must be a 4xx or 5xx status.
func BusyStatus(code int) Option {
	return Option{set: func(c *config) { c.busyStatus, c.busyStatusSet = code, true }}
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

// MaxBodyBytes sets how large a request body the middleware reads before it takes the lock:
// a larger one is answered 413 Content Too Large, and the handler is not called. Default:
// 1 MiB. n must not be negative; 0 refuses any body; math.MaxInt64 sets no limit but the
// memory the bodies take (docs/templates.md says how much).
//
// The middleware reads the whole body before it takes the lock and hands it to the handler
// from memory, so that the lock is held only once the request is complete: a client that is
// slow to send, or stops sending, delays nobody but itself. Because net/http notices a client
// that closed its connection only once the request body is read, reading it also ends the
// wait of a request whose client left. For bodies too large to keep in memory, see
// StreamBody.
func MaxBodyBytes(n int64) Option {
	return Option{set: func(c *config) { c.maxBody = n }}
}

// BodyTimeout bounds how long the middleware waits for a request body to arrive, from the
// moment the request reaches it; a body that is not in by then is answered 408 Request
// Timeout, and an HTTP/1 connection is closed (HTTP/2 ends the request's stream only). It moves the connection's read deadline
// (http.ResponseController.SetReadDeadline) forward to the moment the time is up, never
// back: a server's own ReadTimeout that ends sooner still applies. Default: 30 seconds. 0
// leaves the bound to the server; d must not be negative.
func BodyTimeout(d time.Duration) Option {
	return Option{set: func(c *config) { c.bodyTimeout = d }}
}

// StreamBody leaves the request body to the handler, which reads it while it holds the lock,
// as a handler behind no middleware does: for uploads too large to keep in memory. The lock
// is then held while the client sends the body, however slowly: set the server's ReadTimeout
// (docs/templates.md says how). While an HTTP/1 request waits, the middleware reads up to
// 64 KiB of its body ahead, so that net/http notices a client that hangs up — before its
// body is in, or after a body of at most that size — and the wait ends without calling the
// handler; the handler reads that part from memory and the rest as it comes. A LockFunc key
// may read the start of the body: the handler reads that again, from memory, then the rest.
// MaxBodyBytes and BodyTimeout do not apply. Default: the middleware reads the body first
// (see MaxBodyBytes).
func StreamBody() Option {
	return Option{set: func(c *config) { c.streamBody = true }}
}

// Permits makes the route admit n requests at a time per lock name instead of one: each
// request holds a permit of a semaphore of n on its name (guard.Guard.Semaphore), with all a
// lock's guarantees — a permit whose holder died comes back when its lease ends. A request
// that finds no permit free, at once or within its WaitTime, is answered 429 Too Many
// Requests with Retry-After (see the package doc); BusyStatus and OnBusy change that. n must
// be at least 1, Permits does not go with ReadWrite, and the Guard's backend must grant shared
// holds (guard.Sharing): Lock and LockFunc panic otherwise.
//
// Permits are counted per name by the backend: instances of a service that give one name
// different counts each admit up to their own (guard.Semaphore says more), and a plain Lock on
// the same name excludes every permit.
func Permits(n int) Option {
	return Option{set: func(c *config) { c.permits, c.permitsSet = n, true }}
}

// ReadWrite makes the route's lock a read-write lock on its name (guard.Guard.RWMutex):
// requests with a safe method — GET, HEAD, OPTIONS — take the read side and run alongside
// each other; any other method takes the write side and runs alone, and a waiting writer is
// not passed by readers that come after it. A busy lock is answered as a Lock's is (423 by
// default). The Guard's backend must grant shared holds (guard.Sharing), and ReadWrite does
// not go with Permits: Lock and LockFunc panic otherwise. A plain Lock on the same name is a
// writer.
//
// It is an option rather than a constructor of its own so that it goes with either way of
// naming the lock (Lock's template, LockFunc's function) and with every other option, as
// Permits does; one route's GET and POST share one template, as they share one middleware.
func ReadWrite() Option {
	return Option{set: func(c *config) { c.readWrite = true }}
}
