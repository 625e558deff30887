package middleware

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"

	"github.com/guardlock/guard/internal/lockname"
)

// request is a request being named, with its query parsed at most once.
type request struct {
	r     *http.Request
	query url.Values // nil until a query source asks
	// unrouted is the first placeholder that found the request not routed yet: the
	// middleware wraps the router, not the route.
	unrouted string
	// chiPath is which path chi routed the request on, once a value asked (chiUnknown
	// before).
	chiPath chiPath
}

// requests keeps request structs for reuse: naming a request would otherwise cost an
// allocation of its own, as the template's sources are called through function values.
var requests = sync.Pool{New: func() any { return new(request) }}

// newRequest returns r to be named.
func newRequest(r *http.Request) *request {
	q := requests.Get().(*request)
	*q = request{r: r}
	return q
}

// free gives q back for reuse; q must not be used afterwards.
func (q *request) free() {
	*q = request{}
	requests.Put(q)
}

// source reads one placeholder's value from a request.
type source = lockname.Source[*request]

// compileTemplate parses template and binds each placeholder to its request source, reading
// path parameters with values when it is not nil (PathValues). The returned function renders
// a request's lock name, or returns a *guard.NameError; a bad template is a *guard.NameError
// too.
func compileTemplate(template string, values func(*http.Request, string) (string, bool)) (func(*request) (string, error), error) {
	n, err := lockname.Bind(template, func(key string) (source, error) { return compileSource(key, values) })
	if err != nil {
		return nil, err
	}
	return n.Name, nil
}

// compileSource binds one placeholder key (see the package doc).
func compileSource(key string, values func(*http.Request, string) (string, bool)) (source, error) {
	kind, name, dotted := strings.Cut(key, ".")
	if !dotted {
		switch key {
		case "method":
			return func(q *request) (string, error) { return q.r.Method, nil }, nil
		case "route":
			return func(q *request) (string, error) { return q.routeValue(key), nil }, nil
		}
		kind, name = "path", key
	}
	if name == "" {
		return nil, fmt.Errorf("no name after %q", kind+".")
	}
	switch kind {
	case "path":
		if !isParamName(name) {
			return nil, fmt.Errorf("%q is not a path parameter name (letters, digits, '_', '-', or chi's '*')", name)
		}
		return func(q *request) (string, error) {
			var (
				v   string
				ok  bool
				err error
			)
			if values != nil {
				v, ok = values(q.r, name)
			} else {
				v, ok, err = q.pathValue(name)
			}
			if !ok && q.unrouted == "" {
				q.unrouted = key
			}
			return v, err
		}, nil
	case "query":
		// url.Values are decoded: "%61" and "a" are one value, and "+" is a space.
		return func(q *request) (string, error) {
			if q.query == nil {
				q.query = q.r.URL.Query()
			}
			return q.query.Get(name), nil
		}, nil
	case "header":
		if !isToken(name) {
			return nil, fmt.Errorf("%q is not a header name", name)
		}
		// Header values have no escapes to decode: they are used as they came.
		name = http.CanonicalHeaderKey(name)
		return func(q *request) (string, error) {
			if v := q.r.Header[name]; len(v) > 0 {
				return v[0], nil
			}
			return "", nil
		}, nil
	}
	return nil, fmt.Errorf("unknown request source %q (want a path parameter name, method, route, or path., query., header. and a name)", kind)
}

// pathValue returns the path parameter name, decoded — one resource has one value, whether
// its path spelled "a" or "%61" — and whether the request was routed to a route that has the
// parameter. It reads chi's URL parameter when chi has one by that name (see chiValue), else
// Request.PathValue, which http.ServeMux sets (decoded) and adapters for other routers can set
// (docs/templates.md).
func (q *request) pathValue(name string) (string, bool, error) {
	r := q.r
	if rc := chi.RouteContext(r.Context()); rc != nil {
		keys := rc.URLParams.Keys
		for i := len(keys) - 1; i >= 0; i-- { // the innermost route's, as chi.URLParam
			if keys[i] == name {
				v, err := q.chiValue(rc, rc.URLParams.Values[i])
				return v, true, err
			}
		}
		if v := r.PathValue(name); v != "" {
			return v, true, nil
		}
		// chi has matched no route with the parameter: the middleware runs in r.Use before
		// routing, or in a group whose pattern does not have it.
		return "", false, nil
	}
	if v := r.PathValue(name); v != "" {
		return v, true, nil
	}
	// No value: ServeMux routed the request with an empty one ("{rest...}" at the end of a
	// path); or it routed it to a route without the parameter; or nothing routed it — the
	// middleware wraps the router.
	return "", strings.Contains(r.Pattern, "{"+name+"}") || strings.Contains(r.Pattern, "{"+name+"...}"), nil
}

// routeValue returns the pattern of the route that matched: chi's, else Request.Pattern (set
// by ServeMux, and by chi). It records key as unrouted when there is none.
func (q *request) routeValue(key string) string {
	if rc := chi.RouteContext(q.r.Context()); rc != nil {
		if p := rc.RoutePattern(); p != "" {
			return p
		}
	}
	if q.r.Pattern == "" && q.unrouted == "" {
		q.unrouted = key
	}
	return q.r.Pattern
}

func isParamName(s string) bool {
	if s == "*" {
		return true
	}
	for _, c := range []byte(s) {
		if !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token, as header names are.
func isToken(s string) bool {
	for _, c := range []byte(s) {
		if !isAlnum(c) && !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return s != ""
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
