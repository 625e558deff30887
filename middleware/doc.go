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
// regexp.MustCompile does. Values are escaped so that rendering is injective — separators,
// braces (Redis Cluster hash tags), '%' and control bytes in values cannot merge or forge names;
// docs/templates.md has the rules. For names the template language cannot express, LockFunc
// takes a function of the request.
//
// Values are read in their canonical form, so that one resource has one lock name. A path
// parameter is decoded: "/accounts/%61" and "/accounts/a" lock one account. (chi hands out the
// raw segment when a path has escapes; the middleware decodes it, as http.ServeMux does.)
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
// docs/templates.md shows all three.
//
// # Responses
//
// The middleware tries once by default; guard.WaitTime(d) makes it wait up to d for a busy
// lock. The other guard.LockOptions (LeaseTime, MinHold) apply to every request, and the
// middleware adds guard.Label(template) so that telemetry is named by the template. Its own
// options, BusyStatus, OnBusy and PathValues, travel in the same list; they are checked when
// the middleware is built.
//
// When the lock is taken, the handler runs with the lock's context: the request's context,
// also cancelled — with cause guard.ErrLockLost or guard.ErrLeaseExpired — when the lock is
// lost; guard.FromContext gives the Lock and its fence. A nested lock on the same name in that
// context (another middleware, a decorated function) re-enters it. The lock is released when
// the handler returns, and also when it panics; the panic, http.ErrAbortHandler included, goes
// on. The handler's response stands whatever the release does: a release that fails after it
// is reported to the Guard's observer (docs/semantics.md, "Cancellation and release").
//
// Otherwise the handler is not called, and the response is an RFC 9457 problem
// (application/problem+json, with type "about:blank", title, status and detail):
//
//   - lock busy (the attempt or the wait failed, or the request's context ended the wait):
//     423 Locked, with Retry-After in whole seconds (rounded up) when the backend reported the
//     holder's remaining lease; BusyStatus and OnBusy change that;
//   - no name (a value is missing or empty, the name is longer than guard.MaxNameLen, or the
//     LockFunc key function failed): 400 Bad Request;
//   - a path parameter or the route without a value because the request was not routed (see
//     Routers): 500 Internal Server Error, logged once;
//   - backend failure or closed Guard: 503 Service Unavailable.
//
// Bodies never carry the lock name or request data: a 400 names the placeholder that lacks a
// value ("{id}: empty value"), which comes from the template, not from the request.
package middleware
