package middleware_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// A middleware that runs before routing, or names a parameter its route does not have, fails
// every request with a 500 that says what to do, and logs it once.
func TestNotRouted(t *testing.T) {
	var logs bytes.Buffer // written by ServeHTTP on this goroutine
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	var calls atomic.Int32
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) })

	tests := []struct {
		name, template, path string
		handler              func(lock func(http.Handler) http.Handler) http.Handler
		opts                 []guard.LockOption
	}{
		{"ServeMux wrapped whole", "account:{id}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /accounts/{id}", h)
			return lock(mux)
		}, nil},
		{"chi Use before routing", "account:{id}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(lock)
			r.Get("/accounts/{id}", h)
			return r
		}, nil},
		{"chi group before its route", "account:{id}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Route("/accounts", func(r chi.Router) {
				r.Use(lock) // the group's pattern, /accounts/*, has no {id}
				r.Get("/{id}", h)
			})
			return r
		}, nil},
		{"no router", "account:{id}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			return lock(h)
		}, nil},
		{"route before routing", "route:{route}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(lock)
			r.Get("/accounts/{id}", h)
			return r
		}, nil},
		{"ServeMux route without the parameter", "account:{acct}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("GET /accounts/{id}", lock(h))
			return mux
		}, nil},
		{"chi route without the parameter", "account:{acct}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			r := chi.NewRouter()
			r.With(lock).Get("/accounts/{id}", h)
			return r
		}, nil},
		{"PathValues, router wrapped whole", "account:{id}", "/accounts/7", func(lock func(http.Handler) http.Handler) http.Handler {
			vr := &varsRouter{}
			vr.handle("GET", "/accounts/:id", h)
			return lock(vr)
		}, []guard.LockOption{middleware.PathValues(varsOf)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs.Reset()
			srv := tt.handler(middleware.Lock(g, tt.template, tt.opts...))
			for range 2 {
				rec := httptest.NewRecorder()
				srv.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", tt.path, nil))
				p := requireProblem(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.String()},
					http.StatusInternalServerError)
				key := tt.template[strings.IndexByte(tt.template, '{'):]
				assert.Contains(t, p.Detail, key+" has no value")
				assert.Contains(t, p.Detail, "Mount the middleware on the route")
				assert.NotContains(t, p.Detail, "/accounts/7", "the body does not carry request data")
			}
			assert.Equal(t, 1, strings.Count(logs.String(), "guard/middleware"), "logged once: %s", logs.String())
			assert.Contains(t, logs.String(), "level=ERROR")
			assert.Contains(t, logs.String(), "Mount the middleware on the route")
		})
	}
	assert.Zero(t, calls.Load(), "no request reached the handler")
}

// A parameter that the route has, with an empty value, is a request without a lock name: 400.
func TestEmptyRest(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	mux := http.NewServeMux()
	mux.Handle("GET /files/{rest...}", middleware.Lock(g, "file:{rest}")(lockName))
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/files/", nil))
	p := requireProblem(t, response{status: rec.Code, header: rec.Header(), body: rec.Body.String()}, http.StatusBadRequest)
	assert.Contains(t, p.Detail, "{rest}: empty value")
}

// Every spelling of one path parameter gives one lock name: its decoded value, whichever
// router routed the request.
func testEncodedPaths(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		p := prefix(t)
		srv := serve(t, rt.mount("GET", "/t/{id}/x", rt.lock(newGuard(t), p+"acct:{id}"), lockName))
		tests := []struct {
			name string
			path []string // spellings of one value
			want string
		}{
			{"plain and escaped letter", []string{"/t/a/x", "/t/%61/x"}, "acct:a"},
			{"hex case", []string{"/t/j/x", "/t/%6a/x", "/t/%6A/x"}, "acct:j"},
			{"escaped slash", []string{"/t/a%2Fb/x", "/t/a%2fb/x", "/t/%61%2F%62/x"}, "acct:a%2Fb"},
			{"plus is a plus in a path", []string{"/t/a+b/x", "/t/a%2Bb/x", "/t/%61+b/x"}, "acct:a%2Bb"},
			{"escaped space", []string{"/t/a%20b/x", "/t/%61%20b/x"}, "acct:a%20b"},
			{"escaped percent", []string{"/t/%2561/x", "/t/%25%36%31/x"}, "acct:%2561"},
			{"unicode", []string{"/t/%C3%A9/x", "/t/%c3%a9/x"}, "acct:é"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				for _, path := range tt.path {
					res := send(t, srv, "GET", path)
					require.Equal(t, http.StatusOK, res.status, "%s: %s", path, res.body)
					assert.Equal(t, p+tt.want, res.body, path)
				}
			})
		}
		t.Run("query", func(t *testing.T) {
			srv := serve(t, rt.mount("GET", "/q/{id}", rt.lock(newGuard(t), p+"q:{query.k}"), lockName))
			for path, want := range map[string]string{
				"/q/1?k=a":     "q:a",
				"/q/1?k=%61":   "q:a",
				"/q/1?k=a+b":   "q:a%20b", // a query is form-encoded: '+' is a space
				"/q/1?k=a%20b": "q:a%20b",
				"/q/1?k=a%2Bb": "q:a%2Bb",
			} {
				res := send(t, srv, "GET", path)
				require.Equal(t, http.StatusOK, res.status, "%s: %s", path, res.body)
				assert.Equal(t, p+want, res.body, path)
			}
		})
	})
}

// Requests for one account, whatever the spelling of its ID, never run at once: the first
// holds the lock, a try-once request spelled otherwise is refused, and waiting requests in
// every spelling, on two instances, run one at a time.
func testEncodedSerializes(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		spellings := []string{"a", "%61", "a", "%61"}
		const requests = 12
		var inside, overlaps, calls atomic.Int32
		entered, leave := make(chan struct{}, requests), make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if inside.Add(1) != 1 {
				overlaps.Add(1)
			}
			defer inside.Add(-1)
			for range 20 {
				runtime.Gosched() // widen the window in which an overlap would be seen
			}
			if r.URL.Query().Get("block") == "1" {
				entered <- struct{}{}
				select {
				case <-leave:
				case <-r.Context().Done():
				}
			}
		})
		arrived := make(chan struct{}, requests)
		tmpl := prefix(t) + "account:{id}"
		var waiting []*httptest.Server
		for range 2 {
			lock := rt.lock(newGuard(t), tmpl, guard.WaitTime(time.Minute))
			mw := func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					arrived <- struct{}{}
					lock(next).ServeHTTP(w, r)
				})
			}
			waiting = append(waiting, serve(t, rt.mount("POST", "/accounts/{id}/withdraw", mw, h)))
		}
		tryOnce := serve(t, rt.mount("POST", "/accounts/{id}/withdraw", rt.lock(newGuard(t), tmpl), h))

		first := goSend(t, waiting[0], "POST", "/accounts/a/withdraw?block=1")
		select {
		case <-entered:
		case res := <-first:
			t.Fatalf("the first request ended before it entered the handler: %d %s %v", res.status, res.body, res.err)
		}
		<-arrived
		requireProblem(t, send(t, tryOnce, "POST", "/accounts/%61/withdraw"), http.StatusLocked)

		var wg sync.WaitGroup
		for i := 1; i < requests; i++ {
			wg.Go(func() {
				res, err := do(t.Context(), waiting[i%2], "POST", "/accounts/"+spellings[i%len(spellings)]+"/withdraw")
				if assert.NoError(t, err) {
					assert.Equal(t, http.StatusOK, res.status, res.body)
				}
			})
		}
		for i := 1; i < requests; i++ {
			<-arrived
		}
		close(leave)
		wg.Wait()
		r1 := <-first
		require.NoError(t, r1.err)
		assert.Equal(t, http.StatusOK, r1.status)
		assert.Equal(t, int32(requests), calls.Load())
		assert.Zero(t, overlaps.Load(), "requests for /accounts/a and /accounts/%61 ran at once")
	})
}

// A release that fails after the handler answered leaves the answer as it is: the work is
// done (guard.Guard.Do). The observer hears of the failure.
func TestReleaseFailsAfterHandler(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"backend unreachable", errDown},
		{"lock found gone", guard.ErrNotHeld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := make(guardtest.Releases, 1)
			g := guard.New(guardtest.ReleaseFails{Backend: memstore.New(), Err: tc.err}, guard.WithObserver(obs))
			t.Cleanup(func() { _ = g.Close(context.Background()) })
			mux := http.NewServeMux()
			mux.Handle("POST /accounts/{id}/withdraw", middleware.Lock(g, "account:{id}")(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, "withdrawn")
				})))
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "POST", "/accounts/7/withdraw", nil))
			assert.Equal(t, http.StatusCreated, rec.Code)
			assert.Equal(t, "withdrawn", rec.Body.String())
			assert.ErrorIs(t, <-obs, tc.err, "the observer hears of the failed release")
		})
	}
}

// Two templates with different separators never share a name: while POST /owners/acme%2Fx
// holds "repo:{Owner}" for the owner "acme/x", POST /repos/acme/x takes "repo:{Owner}/{Repo}"
// for "acme" and "x" at once (issue 23: it was answered 423).
func TestTemplatesKeptApart(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	entered, leave := make(chan string, 1), make(chan struct{})
	blocking := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, _ := guard.FromContext(r.Context())
		entered <- l.Name()
		select {
		case <-leave:
		case <-r.Context().Done():
		}
	})
	r := chi.NewRouter()
	r.With(middleware.Lock(g, "repo:{owner}")).Post("/owners/{owner}", blocking)
	r.With(middleware.Lock(g, "repo:{owner}/{repo}")).Post("/repos/{owner}/{repo}", lockName)
	srv := serve(t, r)

	first := goSend(t, srv, "POST", "/owners/acme%2Fx")
	select {
	case name := <-entered:
		assert.Equal(t, "repo:acme%2Fx", name)
	case res := <-first:
		t.Fatalf("the first request ended before it entered the handler: %d %s %v", res.status, res.body, res.err)
	}
	res := send(t, srv, "POST", "/repos/acme/x")
	require.Equal(t, http.StatusOK, res.status, res.body)
	assert.Equal(t, "repo:acme/x", res.body)
	close(leave)
	require.NoError(t, (<-first).err)
}

// Behind chi middleware that changes the path chi routes on — StripSlashes and URLFormat set
// the route context's RoutePath from the decoded URL.Path — every spelling of one account
// still names one lock: the middleware decodes a parameter only when chi matched it against
// the escaped path (issue 16, case 8: "/accounts/%2541/" locked account:%2541 and
// "/%61ccounts/%2541/" locked account:A).
func TestChiPathRewrites(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	lock := middleware.Lock(g, "acct:{id}")
	strip, format := chimw.StripSlashes, chimw.URLFormat
	setups := []struct {
		name          string
		use, groupUse func(http.Handler) http.Handler // the router's middleware, and its group's
		group, route  string                          // the route, in a group (r.Route) when group is set
	}{
		{"plain", nil, nil, "", "/accounts/{id}"},
		{"StripSlashes", strip, nil, "", "/accounts/{id}"},
		{"URLFormat", format, nil, "", "/accounts/{id}"},
		{"StripSlashes in a subrouter", nil, strip, "/accounts", "/{id}"},
		{"StripSlashes before a mounted group", strip, nil, "/accounts/{id}", "/"},
		{"mounted group", nil, nil, "/accounts/{id}", "/"},
		{"StripSlashes and a parameter of the group", strip, nil, "/x/{a}", "/{id}"},
	}
	build := func(use, groupUse func(http.Handler) http.Handler, group, route string) http.Handler {
		r := chi.NewRouter()
		if use != nil {
			r.Use(use)
		}
		if group == "" {
			r.With(lock).Get(route, lockName)
			return r
		}
		r.Route(group, func(r chi.Router) {
			if groupUse != nil {
				r.Use(groupUse)
			}
			r.With(lock).Get(route, lockName)
		})
		return r
	}
	resources := []struct {
		want            string
		spellings, json []string
	}{
		{"acct:%2541", []string{ // the account "%41"
			"/accounts/%2541", "/accounts/%2541/", "/%61ccounts/%2541/", "/accounts/%25%341/",
			"/x/A/%2541/", "/x/%41/%2541/", "/x/%41/%2541",
		}, []string{"/accounts/%2541.json", "/%61ccounts/%2541.json", "/accounts/%25%341.json"}},
		{"acct:a", []string{
			"/accounts/a", "/accounts/a/", "/accounts/%61", "/accounts/%61/", "/%61ccounts/%61/",
			"/x/A/a/", "/x/%41/%61/", "/x/%41/%61",
		}, []string{"/accounts/a.json", "/accounts/%61.json", "/%61ccounts/%61.json"}},
		{"acct:a%2Fb", []string{"/accounts/a%2Fb", "/accounts/a%2Fb/", "/accounts/a%2fb/", "/%61ccounts/a%2Fb/",
			"/x/A/a%2Fb/", "/x/%41/a%2fb"},
			[]string{"/accounts/a%2Fb.json", "/%61ccounts/a%2fb.json"}},
	}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			srv := serve(t, build(s.use, s.groupUse, s.group, s.route))
			for _, res := range resources {
				routed := 0
				spellings := res.spellings
				if s.name == "URLFormat" { // "/accounts/a.json" is the account "a"
					spellings = append(spellings, res.json...)
				}
				for _, path := range spellings {
					got := send(t, srv, "GET", path)
					if got.status == http.StatusNotFound || got.status == http.StatusMethodNotAllowed {
						continue // this router has no route for this spelling
					}
					routed++
					require.Equal(t, http.StatusOK, got.status, "%s: %s", path, got.body)
					assert.Equal(t, res.want, got.body, "%s: one resource, one name", path)
				}
				assert.Positive(t, routed, "no spelling of %s was routed", res.want)
			}
		})
	}
}
