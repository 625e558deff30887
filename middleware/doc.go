// Package middleware locks HTTP requests: a func(http.Handler) http.Handler that holds a
// distributed lock, named from the request, while the handler runs.
//
//	r := chi.NewRouter()
//	r.With(middleware.Lock(g, "account:{id}")).Post("/accounts/{id}/withdraw", withdraw)
//
//	mux := http.NewServeMux()
//	mux.Handle("POST /accounts/{id}/withdraw", middleware.Lock(g, "account:{id}")(withdraw))
//
// # Templates
//
// The lock name is a template: literal text with placeholders that name request data.
//
//	{id}               a path parameter, decoded: chi's URL parameter, else Request.PathValue
//	{path.id}          the same, for a parameter called "method" or "route"
//	{query.page}       the first value of the query parameter "page"
//	{header.X-Tenant}  the first value of the header "X-Tenant"
//	{method}           the request method
//	{route}            the route pattern: chi's, else http.Request.Pattern
//
// In literal text "{{" and "}}" stand for braces. The template is checked when the middleware
// is built: bad syntax, an unknown source ("{cookie.x}"), a bad header name, or placeholders
// with no literal text between them panic there, with a "guard/middleware:" message, as
// regexp.MustCompile does; so does a placeholder that touches a letter, digit or one of "-._~"
// of literal text ("{A}.{B}": write "{A}:{B}"). Values keep letters, digits and "-._~" and
// escape every other character, so rendering is injective and templates with different
// separators never share a name; the [templates guide] has the rules. For names the template
// language cannot express, LockFunc
// takes a function of the request.
//
// Values are read in their canonical form, so that one resource has one lock name. A path
// parameter is decoded: "/accounts/%61" and "/accounts/a" lock one account. (chi hands out the
// raw segment when it routed on the escaped path, as it does by default and behind CleanPath;
// the middleware decodes it then, as http.ServeMux does, and not behind StripSlashes or
// URLFormat, which make chi route on the decoded path. It tells which path chi routed on from
// the route patterns chi matched; the [templates guide] says how.)
// Query values are decoded by net/url, where "+" is a space; in a path it is a plus. Header
// values are used as they are.
//
// # Routers
//
// Path parameters exist only once the request is routed: wrap the route's handler (chi's
// r.With, a chi Route group's r.Use, or the handler given to ServeMux.Handle), not the whole
// router. A middleware that runs before routing — or whose template names a parameter its
// route does not have — answers every request 500 with a problem that says so, and logs it
// once with slog's default logger: the mistake shows on the first request, and never becomes
// one lock for all accounts.
//
// Other routers keep their parameters elsewhere. PathValues takes a function that reads
// them (gorilla/mux: mux.Vars); for gin and echo, the adapter that mounts a net/http
// middleware on a route can set Request.PathValue and Request.Pattern as chi does.
// The [templates guide] shows all three.
//
// # Request bodies
//
// The middleware reads the request body before it takes the lock, and the handler reads it
// from memory: a client that is slow to send its body, or stops, holds no lock, and a
// request whose client hangs up while it waits stops waiting (net/http notices a closed
// HTTP/1.1 connection only once the body is read). A request whose client left is never
// handled. MaxBodyBytes (1 MiB) and BodyTimeout (30 s) bound the read; StreamBody leaves
// the body to the handler, for uploads. The [templates guide] ("Slow and vanishing clients")
// says which server timeouts a locked route needs.
//
// # Responses
//
// The middleware tries once by default; guard.WaitTime(d) makes it wait up to d for a busy
// lock. The other guard.LockOptions (LeaseTime, MinHold) apply to every request, and the
// middleware adds guard.Label(template) so that telemetry is named by the template. Its own
// options — BusyStatus, OnBusy, PathValues, MaxBodyBytes, BodyTimeout, StreamBody, Permits,
// ReadWrite — travel in the same list; they are checked when the middleware is built.
//
// The lock is a mutex by default: one request at a time per name. Permits(n) makes it a
// semaphore, n requests at a time per name; ReadWrite makes it a read-write lock, which GET,
// HEAD and OPTIONS requests share and other requests hold alone.
//
// When the lock is taken, the handler runs with the lock's context: the request's context,
// also cancelled — with cause guard.ErrLockLost or guard.ErrLeaseExpired — when the lock is
// lost; guard.FromContext gives the Lock and its fence. A nested lock on the same name in that
// context (another middleware, a decorated function) re-enters it. The lock is released when
// the handler returns, and also when it panics; the panic, http.ErrAbortHandler included, goes
// on. The handler's response stands whatever the release does: a release that fails after it
// is reported to the Guard's observer ([semantics guide], "Cancellation and release").
//
// Otherwise the handler is not called, and the response is an RFC 9457 problem
// (application/problem+json, with type "about:blank", title, status and detail):
//
//   - lock busy (the attempt failed, or the wait ran out): 423 Locked — 429 Too Many Requests
//     with Permits, whose permits are all held — with Retry-After in whole seconds (rounded
//     up) when the backend reported a holder's remaining lease; BusyStatus and OnBusy change
//     that;
//   - the request's deadline — one the server set, as a timeout middleware does — passed
//     before the handler could run (while the body came, while the request waited, or as
//     the lock was granted): 503 Service Unavailable;
//   - no name (a value is missing or empty, the name is longer than guard.MaxNameLen, the
//     LockFunc key function failed, or a chi path reads as two different values): 400 Bad
//     Request;
//   - a body larger than MaxBodyBytes: 413 Content Too Large; one not in within BodyTimeout:
//     408 Request Timeout; one that cannot be read (a broken chunked encoding): 400;
//   - a path parameter or the route without a value because the request was not routed (see
//     Routers): 500 Internal Server Error, logged once;
//   - a nested lock that asks for the write side of a name whose read side the request holds
//     (guard.ErrUpgrade: it would wait for itself): 500;
//   - backend failure or closed Guard: 503 Service Unavailable.
//
// The handler of a request whose client left — while its body came, while it waited, or as
// the lock was granted — is not called, and the request is not answered: over HTTP/1 its
// connection is closed (an HTTP/1.1 client that half-closes its connection after its request
// has left, for net/http, which cancels the request's context); where the middleware cannot
// take the connection (HTTP/2, a ResponseWriter without Hijack), it answers 499 Client
// Closed Request, which nobody reads.
//
// Bodies never carry the lock name or request data: a 400 names the placeholder that lacks a
// value ("{id}: empty value"), which comes from the template, not from the request, and never
// shows a LockFunc key function's error.
//
// [templates guide]: https://github.com/guardlock/guard/blob/main/docs/templates.md
// [semantics guide]: https://github.com/guardlock/guard/blob/main/docs/semantics.md
package middleware
