package middleware_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/guardtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prefix returns literal template text unique to the test.
func prefix(t *testing.T) string { return guardtest.Prefix(t, "middleware") }

// router mounts a handler behind a middleware on one route, the way its users would.
type router struct {
	name  string
	mount func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler
}

var routers = []router{
	{"chi", func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		r := chi.NewRouter()
		r.With(mw).Method(method, pattern, h)
		return r
	}},
	{"ServeMux", func(method, pattern string, mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle(method+" "+pattern, mw(h))
		return mux
	}},
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
	ch := make(chan result, 1)
	ctx := t.Context()
	go func() {
		res, err := do(ctx, srv, method, path)
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
