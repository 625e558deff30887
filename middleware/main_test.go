package middleware_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/middleware"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prefix returns literal template text unique to the test.
func prefix(t *testing.T) string { return guardtest.Prefix(t, "middleware") }

// router mounts a handler behind a middleware on one route, the way its users would.
type router struct {
	name  string
	mount func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler
	opts  []guard.LockOption // what Lock needs to read the router's path parameters
}

// lock returns the lock middleware with the router's options after opts.
func (rt router) lock(g *guard.Guard, template string, opts ...guard.LockOption) func(http.Handler) http.Handler {
	return middleware.Lock(g, template, append(opts, rt.opts...)...)
}

var routers = []router{
	{name: "chi", mount: func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		r := chi.NewRouter()
		r.With(mw).Method(method, pattern, h)
		return r
	}},
	{name: "ServeMux", mount: func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle(method+" "+pattern, mw(h))
		return mux
	}},
	{name: "varsRouter", mount: func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		vr := &varsRouter{}
		vr.handle(method, strings.NewReplacer("{", ":", "}", "").Replace(pattern), mw(h))
		return vr
	}, opts: []guard.LockOption{middleware.PathValues(varsOf)}},
}

// varsRouter stands for the routers that the middleware knows nothing of (gorilla/mux, and
// gin or echo behind an adapter): it keeps the path parameters of the route it matched in the
// request's context, where varsOf finds them, and sets Request.Pattern. Its patterns are
// "/accounts/:id/withdraw"; a parameter matches one non-empty segment of the escaped path,
// and its value is the segment decoded, as ServeMux's are.
type varsRouter struct {
	routes []varsRoute
}

type varsRoute struct {
	method, pattern string
	segs            []string
	h               http.Handler
}

type varsKey struct{}

func (vr *varsRouter) handle(method, pattern string, h http.Handler) {
	vr.routes = append(vr.routes, varsRoute{method: method, pattern: pattern, segs: strings.Split(pattern, "/"), h: h})
}

func (vr *varsRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	segs := strings.Split(r.URL.EscapedPath(), "/")
	for _, rt := range vr.routes {
		if vars, ok := rt.match(r.Method, segs); ok {
			r = r.WithContext(context.WithValue(r.Context(), varsKey{}, vars))
			r.Pattern = rt.pattern
			rt.h.ServeHTTP(w, r)
			return
		}
	}
	http.NotFound(w, r)
}

func (rt varsRoute) match(method string, segs []string) (map[string]string, bool) {
	if method != rt.method || len(segs) != len(rt.segs) {
		return nil, false
	}
	vars := map[string]string{}
	for i, s := range rt.segs {
		name, param := strings.CutPrefix(s, ":")
		if !param {
			if s != segs[i] {
				return nil, false
			}
			continue
		}
		v, err := url.PathUnescape(segs[i])
		if err != nil || v == "" {
			return nil, false
		}
		vars[name] = v
	}
	return vars, true
}

// varsOf is the PathValues function for varsRouter.
func varsOf(r *http.Request, name string) (string, bool) {
	vars, _ := r.Context().Value(varsKey{}).(map[string]string)
	v, ok := vars[name]
	return v, ok
}

// param returns the path parameter name, whichever router routed r, as handlers read it.
func param(r *http.Request, name string) string {
	if v, ok := varsOf(r, name); ok {
		return v
	}
	if rc := chi.RouteContext(r.Context()); rc != nil {
		return rc.URLParam(name)
	}
	return r.PathValue(name)
}

// forEachRouter runs test once per router.
func forEachRouter(t *testing.T, test func(t *testing.T, rt router)) {
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) { test(t, rt) })
	}
}

// serve starts h on a test server, closed when the test ends.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// response is what a test request got.
type response struct {
	status int
	header http.Header
	body   string
}

// send makes a request to srv; header holds "Name: value" pairs.
func send(t *testing.T, srv *httptest.Server, method, path string, header ...string) response {
	t.Helper()
	res, err := do(t.Context(), srv, method, path, header...)
	require.NoError(t, err)
	return res
}

// result is a response or an error, for requests sent from other goroutines (which must not
// call t.FailNow).
type result struct {
	response
	err error
}

// goSend sends a request from a new goroutine and returns where its result arrives.
func goSend(t *testing.T, srv *httptest.Server, method, path string) <-chan result {
	ctx := t.Context()
	return async(func() (response, error) { return do(ctx, srv, method, path) })
}

// async calls f on a new goroutine and returns where its result arrives.
func async(f func() (response, error)) <-chan result {
	ch := make(chan result, 1)
	go func() {
		res, err := f()
		ch <- result{res, err}
	}()
	return ch
}

// requestTimeout bounds every test request, so that a broken middleware fails a test instead
// of hanging it.
const requestTimeout = 20 * time.Second

func do(ctx context.Context, srv *httptest.Server, method, path string, header ...string) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
	if err != nil {
		return response{}, err
	}
	for _, h := range header {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	return exchange(srv, req)
}

// exchange sends req to srv and reads the whole response.
func exchange(srv *httptest.Server, req *http.Request) (response, error) {
	res, err := srv.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(body)}, err
}

// problem is an RFC 9457 body.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// requireProblem checks that res is a problem response with status.
func requireProblem(t *testing.T, res response, status int) problem {
	t.Helper()
	require.Equal(t, status, res.status, "body: %s", res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	var p problem
	require.NoError(t, json.Unmarshal([]byte(res.body), &p), "body: %s", res.body)
	require.Equal(t, problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: p.Detail}, p)
	require.NotEmpty(t, p.Detail)
	return p
}

// lockName is a handler that answers with the name of the lock it runs under.
var lockName = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	l, ok := guard.FromContext(r.Context())
	if !ok {
		http.Error(w, "no lock", http.StatusInternalServerError)
		return
	}
	_, _ = io.WriteString(w, l.Name())
})
