package routers_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/mux"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	goleak.VerifyTestMain(m)
}

// A router serves h on POST /accounts/{id}/withdraw, behind lock, the way the examples wire it.
type router struct {
	name  string
	serve func(lock func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler
	opts  []guard.LockOption // what middleware.Lock needs for the router
}

var routers = []router{
	{name: "gin", serve: func(lock func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
		r := gin.New()
		r.POST("/accounts/:id/withdraw", ginLock(lock), func(c *gin.Context) { h(c.Writer, c.Request) })
		return r
	}},
	{name: "echo", serve: func(lock func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
		e := echo.New()
		e.POST("/accounts/:id/withdraw", func(c echo.Context) error {
			h(c.Response(), c.Request())
			return nil
		}, echoLock(lock))
		return e
	}},
	{name: "gorilla", serve: func(lock func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
		r := mux.NewRouter()
		r.Handle("/accounts/{id}/withdraw", lock(h)).Methods("POST")
		return r
	}, opts: []guard.LockOption{middleware.PathValues(gorillaVars)}},
}

func newGuard(t *testing.T) *guard.Guard {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

func send(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "POST", path, nil))
	return rec
}

// Every spelling of an account's ID gives one lock name, behind every router.
func TestOneResourceOneName(t *testing.T) {
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) {
			srv := rt.serve(middleware.Lock(newGuard(t), "account:{id}", rt.opts...), withdraw)
			for path, want := range map[string]string{
				"/accounts/a/withdraw":        "account:a",
				"/accounts/%61/withdraw":      "account:a",
				"/accounts/%6A/withdraw":      "account:j",
				"/accounts/%6a/withdraw":      "account:j",
				"/accounts/a+b/withdraw":      "account:a%2Bb",
				"/accounts/a%2Bb/withdraw":    "account:a%2Bb",
				"/accounts/a%20b/withdraw":    "account:a%20b",
				"/accounts/%2561/withdraw":    "account:%2561", // the value "%61", its '%' escaped
				"/accounts/%C3%A9/withdraw":   "account:é",
				"/accounts/%c3%a9/withdraw":   "account:é",
				"/accounts/%61%62/withdraw":   "account:ab",
				"/accounts/%25%61/withdraw":   "account:%25a",
				"/accounts/x%25y/withdraw":    "account:x%25y",
				"/accounts/x%2525/withdraw":   "account:x%2525",
				"/accounts/%78%2525/withdraw": "account:x%2525",
			} {
				rec := send(t, srv, path)
				require.Equal(t, http.StatusOK, rec.Code, "%s: %s", path, rec.Body)
				assert.Equal(t, "withdrawn under "+want, rec.Body.String(), path)
			}
		})
	}
}

// While /accounts/a holds the lock, /accounts/%61 is refused and its handler does not run.
func TestBusyAcrossSpellings(t *testing.T) {
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) {
			var srv http.Handler
			inner := make(chan int, 1)
			calls := 0
			srv = rt.serve(middleware.Lock(newGuard(t), "account:{id}", rt.opts...), func(w http.ResponseWriter, r *http.Request) {
				calls++
				if calls == 1 { // the first request sends the second while it holds the lock
					inner <- send(t, srv, "/accounts/%61/withdraw").Code
				}
				w.WriteHeader(http.StatusNoContent)
			})
			assert.Equal(t, http.StatusNoContent, send(t, srv, "/accounts/a/withdraw").Code)
			assert.Equal(t, http.StatusLocked, <-inner)
			assert.Equal(t, 1, calls, "the busy request never reached the handler")
		})
	}
}

// {route} is the router's pattern.
func TestRoute(t *testing.T) {
	want := map[string]string{
		"gin":  "route:%2Faccounts%2F%3Aid%2Fwithdraw", // values escape separators
		"echo": "route:%2Faccounts%2F%3Aid%2Fwithdraw",
	}
	for _, rt := range routers {
		if want[rt.name] == "" {
			continue // gorilla/mux: set Request.Pattern yourself to use {route}
		}
		t.Run(rt.name, func(t *testing.T) {
			srv := rt.serve(middleware.Lock(newGuard(t), "route:{route}", rt.opts...), withdraw)
			rec := send(t, srv, "/accounts/7/withdraw")
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			assert.Equal(t, "withdrawn under "+want[rt.name], rec.Body.String())
		})
	}
}

// Wrapping the whole gorilla/mux router, before it matched a route, fails every request with
// a 500 that says what to do.
func TestGorillaRouterWrappedWhole(t *testing.T) {
	r := mux.NewRouter()
	r.HandleFunc("/accounts/{id}/withdraw", withdraw).Methods("POST")
	srv := middleware.Lock(newGuard(t), "account:{id}", middleware.PathValues(gorillaVars))(r)
	rec := send(t, srv, "/accounts/7/withdraw")
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	var p struct{ Detail string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	assert.Contains(t, p.Detail, "Mount the middleware on the route")
}
