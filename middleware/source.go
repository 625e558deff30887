package middleware

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/guardlock/guard/internal/lockname"
)

// request is a request being named, with its query parsed at most once.
type request struct {
	r     *http.Request
	query url.Values // nil until a query source asks
}

// source reads one placeholder's value from a request.
type source = lockname.Source[*request]

// compileTemplate parses template and binds each placeholder to its request source. The
// returned function renders a request's lock name, or returns a *guard.NameError. A bad
// template is a *guard.NameError too.
func compileTemplate(template string) (func(*http.Request) (string, error), error) {
	n, err := lockname.Bind(template, compileSource)
	if err != nil {
		return nil, err
	}
	return func(r *http.Request) (string, error) {
		return n.Name(&request{r: r})
	}, nil
}

// compileSource binds one placeholder key (see the package doc).
func compileSource(key string) (source, error) {
	kind, name, dotted := strings.Cut(key, ".")
	if !dotted {
		switch key {
		case "method":
			return func(q *request) (string, error) { return q.r.Method, nil }, nil
		case "route":
			return routePattern, nil
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
		return func(q *request) (string, error) { return pathValue(q.r, name), nil }, nil
	case "query":
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

// pathValue returns the path parameter name: chi's URL parameter when chi routed the request,
// else the ServeMux path value.
func pathValue(r *http.Request, name string) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if v := rc.URLParam(name); v != "" {
			return v
		}
	}
	return r.PathValue(name)
}

// routePattern returns the pattern of the route that matched: chi's, else the ServeMux's.
func routePattern(q *request) (string, error) {
	if rc := chi.RouteContext(q.r.Context()); rc != nil {
		if p := rc.RoutePattern(); p != "" {
			return p, nil
		}
	}
	return q.r.Pattern, nil
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
