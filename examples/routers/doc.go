// Package routers shows middleware.Lock behind routers other than chi and http.ServeMux —
// gin, echo and gorilla/mux — in its examples, which its tests run against the real routers.
// It is a module of its own, so that the routers stay out of guard's go.mod; the adapters are
// a few lines each, to copy into a program (docs/templates.md, "Other routers").
//
// The middleware reads a route's path parameters from chi, from Request.PathValue (which
// http.ServeMux sets), or through middleware.PathValues. gorilla/mux keeps them in the
// request's context: PathValues reads them with mux.Vars. gin and echo keep them in their own
// context type; the adapter that mounts the net/http middleware on their routes sets
// Request.PathValue and Request.Pattern, as chi does.
package routers
