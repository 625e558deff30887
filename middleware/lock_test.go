package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/middleware"
)

func TestMemstore(t *testing.T) { runSuite(t, guardtest.Memory()) }

func TestRedis(t *testing.T) { runSuite(t, guardtest.Redis(t)) }

// runSuite runs the middleware tests on the backend behind newGuard.
func runSuite(t *testing.T, newGuard guardtest.Factory) {
	t.Run("SameAccountBusy", func(t *testing.T) { testSameAccountBusy(t, newGuard) })
	t.Run("SameAccountSerializes", func(t *testing.T) { testSameAccountSerializes(t, newGuard) })
	t.Run("DifferentAccountsInParallel", func(t *testing.T) { testDifferentAccounts(t, newGuard) })
	t.Run("LockContext", func(t *testing.T) { testLockContext(t, newGuard) })
	t.Run("Sources", func(t *testing.T) { testSources(t, newGuard) })
	t.Run("Injective", func(t *testing.T) { testInjective(t, newGuard) })
	t.Run("MissingValues", func(t *testing.T) { testMissingValues(t, newGuard) })
	t.Run("ReleaseAfterPanic", func(t *testing.T) { testPanic(t, newGuard) })
	t.Run("Reentrant", func(t *testing.T) { testReentrant(t, newGuard) })
	t.Run("LeaseExpired", func(t *testing.T) { testLeaseExpired(t, newGuard) })
	t.Run("BusyOptions", func(t *testing.T) { testBusyOptions(t, newGuard) })
	t.Run("LockFunc", func(t *testing.T) { testLockFunc(t, newGuard) })
	t.Run("EncodedPaths", func(t *testing.T) { testEncodedPaths(t, newGuard) })
	t.Run("EncodedPathsSerialize", func(t *testing.T) { testEncodedSerializes(t, newGuard) })
	t.Run("Permits", func(t *testing.T) { testPermits(t, newGuard) })
	t.Run("ReadWrite", func(t *testing.T) { testReadWrite(t, newGuard) })
}

// account is a handler that detects overlapping requests for one account. A request with
// ?block=1 signals entered and waits for leave.
type account struct {
	inside   sync.Map // account id → *atomic.Int32: requests inside now
	overlaps atomic.Int32
	calls    atomic.Int32
	entered  chan string
	leave    chan struct{}
}

func newAccount() *account {
	return &account{entered: make(chan string, 16), leave: make(chan struct{})}
}

func (a *account) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.calls.Add(1)
	id := param(r, "id")
	n, _ := a.inside.LoadOrStore(id, new(atomic.Int32))
	if n.(*atomic.Int32).Add(1) != 1 {
		a.overlaps.Add(1)
	}
	defer n.(*atomic.Int32).Add(-1)
	for range 20 {
		runtime.Gosched() // widen the window in which an overlap would be seen
	}
	if r.URL.Query().Get("block") == "1" {
		a.entered <- id
		select {
		case <-a.leave:
		case <-r.Context().Done():
		}
	}
	_, _ = io.WriteString(w, "ok "+id)
}

// waitEntered waits until the request whose result arrives on ch is inside the handler, and
// returns what the handler sent; it fails the test if the request ends first.
func (a *account) waitEntered(t *testing.T, ch <-chan result) string {
	t.Helper()
	select {
	case id := <-a.entered:
		return id
	case res := <-ch:
		t.Fatalf("the request ended before it entered the handler: %d %s %v", res.status, res.body, res.err)
	}
	return ""
}

func testSameAccountBusy(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		acct := newAccount()
		// Two instances of the service behind a load balancer.
		tmpl := prefix(t) + "account:{id}"
		srv1 := serve(t, rt.mount("POST", "/accounts/{id}/withdraw", rt.lock(newGuard(t), tmpl), acct))
		srv2 := serve(t, rt.mount("POST", "/accounts/{id}/withdraw", rt.lock(newGuard(t), tmpl), acct))

		first := goSend(t, srv1, "POST", "/accounts/7/withdraw?block=1")
		acct.waitEntered(t, first)

		res := send(t, srv2, "POST", "/accounts/7/withdraw")
		p := requireProblem(t, res, http.StatusLocked)
		assert.NotContains(t, p.Detail, "account", "the body does not carry the lock name")
		secs, err := strconv.Atoi(res.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After: %q", res.header.Get("Retry-After"))
		assert.Positive(t, secs)
		assert.LessOrEqual(t, secs, int(guard.DefaultWatchdogTimeout/time.Second))

		res = send(t, srv1, "POST", "/accounts/7/withdraw")
		requireProblem(t, res, http.StatusLocked)

		close(acct.leave)
		r1 := <-first
		require.NoError(t, r1.err)
		assert.Equal(t, http.StatusOK, r1.status)
		assert.Equal(t, int32(1), acct.calls.Load(), "busy requests never reach the handler")
		assert.Zero(t, acct.overlaps.Load())

		res = send(t, srv2, "POST", "/accounts/7/withdraw")
		assert.Equal(t, http.StatusOK, res.status, "free again after the first request")
	})
}

func testSameAccountSerializes(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		const requests = 12
		acct := newAccount()
		tmpl := prefix(t) + "account:{id}"
		// arrive reports each request that reaches the lock middleware.
		arrived := make(chan struct{}, requests)
		arrive := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				next.ServeHTTP(w, r)
			})
		}
		var servers []*httptest.Server
		for range 2 {
			lock := rt.lock(newGuard(t), tmpl, guard.WaitTime(time.Minute))
			mw := func(h http.Handler) http.Handler { return arrive(lock(h)) }
			servers = append(servers, serve(t, rt.mount("POST", "/accounts/{id}/withdraw", mw, acct)))
		}

		// The first request holds the lock while all the others arrive and wait for it.
		first := goSend(t, servers[0], "POST", "/accounts/7/withdraw?block=1")
		acct.waitEntered(t, first)
		<-arrived
		var wg sync.WaitGroup
		for i := 1; i < requests; i++ {
			wg.Go(func() {
				res, err := do(t.Context(), servers[i%len(servers)], "POST", "/accounts/7/withdraw")
				if assert.NoError(t, err) {
					assert.Equal(t, http.StatusOK, res.status, res.body)
				}
			})
		}
		for i := 1; i < requests; i++ {
			<-arrived
		}
		close(acct.leave)
		wg.Wait()
		r1 := <-first
		require.NoError(t, r1.err)
		assert.Equal(t, http.StatusOK, r1.status)
		assert.Equal(t, int32(requests), acct.calls.Load())
		assert.Zero(t, acct.overlaps.Load(), "two requests for one account ran at once")
	})
}

func testDifferentAccounts(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		acct := newAccount()
		srv := serve(t, rt.mount("POST", "/accounts/{id}/withdraw", rt.lock(newGuard(t), prefix(t)+"account:{id}"), acct))
		r1 := goSend(t, srv, "POST", "/accounts/1/withdraw?block=1")
		r2 := goSend(t, srv, "POST", "/accounts/2/withdraw?block=1")
		// One attempt each: if the accounts shared a lock, one request would be answered 423
		// instead of entering.
		inside := map[string]bool{}
		for len(inside) < 2 {
			select {
			case id := <-acct.entered:
				inside[id] = true
			case res := <-r1:
				t.Fatalf("a request ended before both were inside: %d %s %v", res.status, res.body, res.err)
			case res := <-r2:
				t.Fatalf("a request ended before both were inside: %d %s %v", res.status, res.body, res.err)
			}
		}
		close(acct.leave)
		for _, ch := range []<-chan result{r1, r2} {
			res := <-ch
			require.NoError(t, res.err)
			assert.Equal(t, http.StatusOK, res.status)
		}
	})
}

func testLockContext(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		tmpl := prefix(t) + "account:{id}"
		type seen struct {
			name, label, param string
			fence              uint64
			err                error
		}
		got := make(chan seen, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l, ok := guard.FromContext(r.Context())
			if !ok {
				got <- seen{err: errors.New("no lock")}
				return
			}
			// The request's own context values (chi's route) are still there.
			got <- seen{name: l.Name(), label: l.Label(), param: param(r, "id"), fence: l.Fence(), err: r.Context().Err()}
		})
		srv := serve(t, rt.mount("GET", "/accounts/{id}", rt.lock(newGuard(t), tmpl), h))
		res := send(t, srv, "GET", "/accounts/42")
		require.Equal(t, http.StatusOK, res.status)
		s := <-got
		require.NoError(t, s.err)
		assert.Equal(t, prefix(t)+"account:42", s.name)
		assert.Equal(t, tmpl, s.label)
		assert.Equal(t, "42", s.param)
		assert.NotZero(t, s.fence)
	})
}

func testSources(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		p := prefix(t)
		tests := []struct {
			name, template, path string
			header               []string
			want                 string
		}{
			{"path", "acct:{id}", "/t/7/x", nil, "acct:7"},
			{"explicit path", "acct:{path.id}", "/t/7/x", nil, "acct:7"},
			{"query", "acct:{id}:page:{query.page}", "/t/7/x?page=2&page=3", nil, "acct:7:page:2"},
			{"header", "tenant:{header.x-tenant}:{id}", "/t/7/x", []string{"X-Tenant: acme"}, "tenant:acme:7"},
			{"method", "{method} {id}", "/t/7/x", nil, "GET 7"},
			{"route", "route={route}", "/t/7/x", nil, "route=%2Ft%2F%7Bid%7D%2Fx"},
			{"escaped value", "acct:{id}", "/t/a:b%7B/x", nil, "acct:a%3Ab%7B"},
			{"encoded query", "q:{query.k}", "/t/7/x?k=a%3Ab%25", nil, "q:a%3Ab%25"},
			{"literal braces", "{{acct:{id}}}", "/t/7/x", nil, "{acct:7}"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				srv := serve(t, rt.mount("GET", "/t/{id}/x", rt.lock(newGuard(t), p+tt.template), lockName))
				res := send(t, srv, "GET", tt.path, tt.header...)
				require.Equal(t, http.StatusOK, res.status, res.body)
				want := p + tt.want
				if tt.name == "route" && rt.name == "ServeMux" {
					want = p + "route=GET%20%2Ft%2F%7Bid%7D%2Fx" // http.Request.Pattern has the method
				}
				if tt.name == "route" && rt.name == "varsRouter" {
					want = p + "route=%2Ft%2F%3Aid%2Fx"
				}
				assert.Equal(t, want, res.body)
			})
		}
	})
}

func testInjective(t *testing.T, newGuard guardtest.Factory) {
	// The known failure of annotation libraries: ("x:y", "z") and ("x", "y:z") must be two
	// locks. Both are held at once here: with one lock, the second request would get 423.
	acct := newAccount()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, _ := guard.FromContext(r.Context())
		if r.URL.Query().Get("a") == "x:y" {
			acct.entered <- l.Name()
			select {
			case <-acct.leave:
			case <-r.Context().Done(): // the test failed and ended
			}
		}
		_, _ = io.WriteString(w, l.Name())
	})
	p := prefix(t)
	srv := serve(t, http.HandlerFunc(middleware.Lock(newGuard(t), p+"{query.a}:{query.b}")(h).ServeHTTP))
	first := goSend(t, srv, "GET", "/?a=x:y&b=z")
	name1 := acct.waitEntered(t, first)
	res := send(t, srv, "GET", "/?a=x&b=y:z")
	require.Equal(t, http.StatusOK, res.status, res.body)
	close(acct.leave)
	r1 := <-first
	require.NoError(t, r1.err)
	require.Equal(t, http.StatusOK, r1.status)
	assert.Equal(t, p+"x%3Ay:z", name1)
	assert.Equal(t, p+"x:y%3Az", res.body)
}

func testMissingValues(t *testing.T, newGuard guardtest.Factory) {
	p := prefix(t)
	acct := newAccount()
	tests := []struct {
		name    string
		handler func(t *testing.T) http.Handler
		path    string
		detail  string
	}{
		{"missing header", func(t *testing.T) http.Handler {
			return middleware.Lock(newGuard(t), p+"tenant:{header.X-Tenant}")(acct)
		}, "/", "{header.X-Tenant}: empty value"},
		{"empty query", func(t *testing.T) http.Handler {
			return middleware.Lock(newGuard(t), p+"page:{query.page}")(acct)
		}, "/?page=", "{query.page}: empty value"},
		{"too long", func(t *testing.T) http.Handler {
			return middleware.Lock(newGuard(t), p+"q:{query.q}")(acct)
		}, "/?q=" + strings.Repeat("x", guard.MaxNameLen), "more than 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := serve(t, tt.handler(t))
			res := send(t, srv, "GET", tt.path)
			pr := requireProblem(t, res, http.StatusBadRequest)
			assert.Contains(t, pr.Detail, tt.detail)
			assert.NotContains(t, pr.Detail, "xxxx", "the body does not carry request data")
		})
	}
	assert.Zero(t, acct.calls.Load(), "requests without a lock name never reach the handler")
}

func testPanic(t *testing.T, newGuard guardtest.Factory) {
	for _, value := range []any{"boom", http.ErrAbortHandler} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			g := newGuard(t)
			name := prefix(t) + "account:7"
			h := middleware.Lock(g, prefix(t)+"account:{id}")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				panic(value)
			}))
			mux := http.NewServeMux()
			mux.Handle("GET /accounts/{id}", h)
			req := httptest.NewRequestWithContext(t.Context(), "GET", "/accounts/7", nil)
			assert.PanicsWithValue(t, value, func() { mux.ServeHTTP(httptest.NewRecorder(), req) }, "the panic goes on")

			l, err := newGuard(t).TryAcquire(t.Context(), name)
			require.NoError(t, err, "released after the panic")
			require.NoError(t, l.Release(t.Context()))
		})
	}
}

func testReentrant(t *testing.T, newGuard guardtest.Factory) {
	// The same lock in a route group and on the route: the inner one re-enters.
	g := newGuard(t)
	tmpl := prefix(t) + "account:{id}"
	r := chi.NewRouter()
	r.Route("/accounts/{id}", func(r chi.Router) {
		r.Use(middleware.Lock(g, tmpl))
		r.With(middleware.Lock(g, tmpl)).Get("/", lockName.ServeHTTP)
	})
	srv := serve(t, r)
	res := send(t, srv, "GET", "/accounts/7/")
	require.Equal(t, http.StatusOK, res.status, res.body)
	assert.Equal(t, prefix(t)+"account:7", res.body)
}

func testLeaseExpired(t *testing.T, newGuard guardtest.Factory) {
	cause := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		cause <- context.Cause(r.Context())
	})
	mw := middleware.Lock(newGuard(t), prefix(t)+"account:{id}", guard.LeaseTime(50*time.Millisecond))
	mux := http.NewServeMux()
	mux.Handle("GET /accounts/{id}", mw(h))
	send(t, serve(t, mux), "GET", "/accounts/7")
	assert.ErrorIs(t, <-cause, guard.ErrLeaseExpired)
}

func testBusyOptions(t *testing.T, newGuard guardtest.Factory) {
	hold := func(t *testing.T, name string) {
		l, err := newGuard(t).TryAcquire(t.Context(), name)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Release(context.Background()) })
	}
	t.Run("BusyStatus", func(t *testing.T) {
		hold(t, prefix(t)+"account:7")
		mux := http.NewServeMux()
		mux.Handle("GET /accounts/{id}", middleware.Lock(newGuard(t), prefix(t)+"account:{id}",
			middleware.BusyStatus(http.StatusConflict))(lockName))
		res := send(t, serve(t, mux), "GET", "/accounts/7")
		requireProblem(t, res, http.StatusConflict)
		assert.NotEmpty(t, res.header.Get("Retry-After"))
	})
	t.Run("OnBusy", func(t *testing.T) {
		hold(t, prefix(t)+"account:7")
		mux := http.NewServeMux()
		mux.Handle("GET /accounts/{id}", middleware.Lock(newGuard(t), prefix(t)+"account:{id}",
			guard.WaitTime(10*time.Millisecond),
			middleware.OnBusy(func(w http.ResponseWriter, r *http.Request, err error) {
				var busy *guard.BusyError
				if !errors.Is(err, guard.ErrNotAcquired) || !errors.As(err, &busy) {
					http.Error(w, "unexpected "+err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusTooManyRequests)
				if busy.Remaining > 0 {
					_, _ = io.WriteString(w, "busy for a while")
				}
			}))(lockName))
		res := send(t, serve(t, mux), "GET", "/accounts/7")
		assert.Equal(t, http.StatusTooManyRequests, res.status)
		assert.Equal(t, "busy for a while", res.body)
	})
}

func testLockFunc(t *testing.T, newGuard guardtest.Factory) {
	p := prefix(t)
	mw := middleware.LockFunc(newGuard(t), "by-user", func(r *http.Request) (string, error) {
		user, _, ok := r.BasicAuth()
		if !ok {
			return "", errors.New("no user")
		}
		return p + "user/" + user, nil
	})
	srv := serve(t, mw(lockName))

	req, err := http.NewRequestWithContext(t.Context(), "GET", srv.URL, nil)
	require.NoError(t, err)
	req.SetBasicAuth("ann", "secret")
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, p+"user/ann", string(body))

	pr := requireProblem(t, send(t, srv, "GET", "/"), http.StatusBadRequest)
	assert.NotContains(t, pr.Detail, "no user", "the key function's error is not shown")
}

func TestBackendFailure(t *testing.T) {
	g := guard.New(failing{})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	var calls atomic.Int32
	srv := serve(t, middleware.Lock(g, "x:{query.x}")(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) })))
	pr := requireProblem(t, send(t, srv, "GET", "/?x=1"), http.StatusServiceUnavailable)
	assert.NotContains(t, pr.Detail, "10.0.0.9", "the backend's error is not shown")
	assert.Zero(t, calls.Load())
}

// failing is a backend whose server is down.
type failing struct{}

var errDown = errors.New("dial tcp 10.0.0.9:40001: connection refused")

func (failing) Acquire(context.Context, guard.Request) (uint64, error) {
	return 0, errDown
}

func (failing) Extend(_ context.Context, leases []guard.Lease) []error {
	errs := make([]error, len(leases))
	for i := range errs {
		errs[i] = errDown
	}
	return errs
}

func (failing) Release(context.Context, string, string, time.Duration) error { return errDown }

func TestConstructionPanics(t *testing.T) {
	g := guard.New(failing{})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	assert.NotPanics(t, func() {
		_ = []guard.LockOption{middleware.BusyStatus(200), middleware.OnBusy(nil), middleware.PathValues(nil), guard.WaitTime(-1)}
	}, "options only record their values: Lock checks them")
	tests := []struct {
		name  string
		build func()
		msg   string
	}{
		{"unclosed", func() { middleware.Lock(g, "account:{id") }, `guard/middleware: Lock("account:{id"): unclosed '{'`},
		{"stray brace", func() { middleware.Lock(g, "account:id}") }, "unmatched '}'"},
		{"adjacent", func() { middleware.Lock(g, "account:{id}{query.x}") }, "need literal text between them"},
		{"unknown source", func() { middleware.Lock(g, "account:{cookie.id}") }, `{cookie.id}: unknown request source "cookie"`},
		{"empty name", func() { middleware.Lock(g, "account:{query.}") }, `{query.}: no name after "query."`},
		{"bad header", func() { middleware.Lock(g, "account:{header.X:Y}") }, "not a header name"},
		{"bad param", func() { middleware.Lock(g, "account:{a/b}") }, "not a path parameter name"},
		{"empty", func() { middleware.Lock(g, "") }, "empty template"},
		{"fixed name too long", func() { middleware.Lock(g, strings.Repeat("x", guard.MaxNameLen+1)) }, "more than 1024"},
		{"no room for a value", func() { middleware.Lock(g, strings.Repeat("x", guard.MaxNameLen)+":{id}") }, "no name fits in 1024 bytes"},
		{"letter next to a placeholder", func() { middleware.Lock(g, "account{id}") }, "'t' right before {id}"},
		{"bad option", func() { middleware.Lock(g, "a:{id}", guard.WaitTime(-1)) }, "WaitTime"},
		{"bad status", func() { middleware.Lock(g, "a:{id}", middleware.BusyStatus(200)) }, "BusyStatus(200)"},
		{"nil guard", func() { middleware.Lock(nil, "a:{id}") }, "nil *guard.Guard"},
		{"nil PathValues", func() { middleware.Lock(g, "a:{id}", middleware.PathValues(nil)) }, "PathValues(nil)"},
		{"negative MaxBodyBytes", func() { middleware.Lock(g, "a:{id}", middleware.MaxBodyBytes(-1)) }, "MaxBodyBytes(-1): negative"},
		{"negative BodyTimeout", func() { middleware.Lock(g, "a:{id}", middleware.BodyTimeout(-time.Second)) }, "BodyTimeout(-1s): negative"},
		{"nil OnBusy", func() {
			middleware.LockFunc(g, "k", func(*http.Request) (string, error) { return "k", nil }, middleware.OnBusy(nil))
		}, "OnBusy(nil)"},
		{"nil handler", func() { middleware.Lock(g, "a:{id}")(nil) }, "nil http.Handler"},
		{"nil key", func() { middleware.LockFunc(g, "k", nil) }, "nil key function"},
		{"no label", func() {
			middleware.LockFunc(g, "", func(*http.Request) (string, error) { return "k", nil })
		}, "empty label"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				v := recover()
				require.NotNil(t, v, "no panic")
				msg := fmt.Sprint(v)
				assert.True(t, strings.HasPrefix(msg, "guard/middleware: "), msg)
				assert.Contains(t, msg, tt.msg)
			}()
			tt.build()
		})
	}
}
