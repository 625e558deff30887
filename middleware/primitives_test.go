package middleware_test

import (
	"context"
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
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// gate is a handler that counts the requests inside it — readers (safe methods) and writers —
// and records the most at once and every request that found a writer beside it. A request
// with ?block=1 (?block=2) signals entered once inside and stays until leave (leave2) is
// closed.
type gate struct {
	readers, writers atomic.Int32
	most             atomic.Int32 // the most requests inside at once
	withWriter       atomic.Int32 // requests that had a writer beside them
	calls            atomic.Int32
	entered          chan struct{}
	leave, leave2    chan struct{} // for ?block=1 and ?block=2
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 64), leave: make(chan struct{}), leave2: make(chan struct{})}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.calls.Add(1)
	write := r.Method != http.MethodGet && r.Method != http.MethodHead
	if write {
		if g.writers.Add(1) > 1 || g.readers.Load() > 0 {
			g.withWriter.Add(1)
		}
		defer g.writers.Add(-1)
	} else {
		g.readers.Add(1)
		if g.writers.Load() > 0 {
			g.withWriter.Add(1)
		}
		defer g.readers.Add(-1)
	}
	in := g.readers.Load() + g.writers.Load()
	for m := g.most.Load(); in > m && !g.most.CompareAndSwap(m, in); m = g.most.Load() {
	}
	for range 50 {
		runtime.Gosched() // widen the window in which too many would be seen inside
	}
	if b := r.URL.Query().Get("block"); b != "" {
		leave := g.leave
		if b == "2" {
			leave = g.leave2
		}
		g.entered <- struct{}{}
		select {
		case <-leave:
		case <-r.Context().Done():
		}
	}
	_, _ = io.WriteString(w, "ok")
}

// awaitEntered waits until n blocking requests are inside, or fails when one of them ends
// first.
func (g *gate) awaitEntered(t *testing.T, n int, results []<-chan result) {
	t.Helper()
	for range n {
		select {
		case <-g.entered:
		case <-time.After(requestTimeout):
			for _, ch := range results {
				select {
				case res := <-ch:
					t.Fatalf("a request ended before it entered: %d %s %v", res.status, res.body, res.err)
				default:
				}
			}
			t.Fatal("the requests did not enter")
		}
	}
}

// Permits(3): three requests for one account run at once, on two instances; a fourth that
// does not wait is answered 429 with Retry-After; under many concurrent waiting requests,
// never more than three are inside.
func testPermits(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		const permits, requests = 3, 24
		requireSharing(t, newGuard(t))
		gt, other := newGate(), newGate()
		tmpl := prefix(t) + "account:{id}"
		var waiting []*httptest.Server
		for range 2 {
			lock := rt.lock(newGuard(t), tmpl, middleware.Permits(permits), guard.WaitTime(time.Minute))
			waiting = append(waiting, serve(t, rt.mount("POST", "/accounts/{id}/import", lock, gt)))
		}
		tryOnce := serve(t, rt.mount("POST", "/accounts/{id}/import",
			rt.lock(newGuard(t), tmpl, middleware.Permits(permits), guard.LeaseTime(30*time.Second)), gt))

		var blocking []<-chan result
		for i := range permits {
			blocking = append(blocking, goSend(t, waiting[i%2], "POST", "/accounts/7/import?block=1"))
		}
		gt.awaitEntered(t, permits, blocking)
		assert.Equal(t, int32(permits), gt.writers.Load(), "three requests inside at once")

		res := send(t, tryOnce, "POST", "/accounts/7/import")
		p := requireProblem(t, res, http.StatusTooManyRequests)
		assert.Contains(t, p.Detail, "3 requests at a time")
		secs, err := strconv.Atoi(res.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After: %q", res.header.Get("Retry-After"))
		assert.Positive(t, secs)
		assert.LessOrEqual(t, secs, int(guard.DefaultWatchdogTimeout/time.Second), "the holders' remaining lease")
		assert.Equal(t, int32(permits), gt.calls.Load(), "the refused request never reached the handler")
		otherSrv := serve(t, rt.mount("POST", "/accounts/{id}/import",
			rt.lock(newGuard(t), tmpl, middleware.Permits(permits)), other))
		assert.Equal(t, http.StatusOK, send(t, otherSrv, "POST", "/accounts/8/import").status, "another account has its own permits")

		var wg sync.WaitGroup
		for i := range requests {
			wg.Go(func() {
				res, err := do(t.Context(), waiting[i%2], "POST", "/accounts/7/import")
				if assert.NoError(t, err) {
					assert.Equal(t, http.StatusOK, res.status, res.body)
				}
			})
		}
		close(gt.leave)
		wg.Wait()
		for _, ch := range blocking {
			r := <-ch
			require.NoError(t, r.err)
			assert.Equal(t, http.StatusOK, r.status)
		}
		assert.Equal(t, int32(permits+requests), gt.calls.Load())
		assert.LessOrEqual(t, gt.most.Load(), int32(permits), "never more than three inside")
	})
}

// ReadWrite: GET requests overlap; a POST waits for them and then runs alone; while it runs,
// a GET or a POST that does not wait is answered 423; under a mix of concurrent waiting
// requests on two instances, a writer is never inside with anyone.
func testReadWrite(t *testing.T, newGuard guardtest.Factory) {
	forEachRouter(t, func(t *testing.T, rt router) {
		const readers, requests = 3, 24
		requireSharing(t, newGuard(t))
		gt := newGate()
		tmpl := prefix(t) + "doc:{id}"
		var waiting []*httptest.Server
		for range 2 {
			waiting = append(waiting, serve(t, rwRoutes(rt, rt.lock(newGuard(t), tmpl, middleware.ReadWrite(), guard.WaitTime(time.Minute)), gt)))
		}
		tryOnce := serve(t, rwRoutes(rt, rt.lock(newGuard(t), tmpl, middleware.ReadWrite()), gt))

		var blocking []<-chan result
		for i := range readers {
			blocking = append(blocking, goSend(t, waiting[i%2], "GET", "/docs/7?block=1"))
		}
		gt.awaitEntered(t, readers, blocking)
		assert.Equal(t, int32(readers), gt.readers.Load(), "readers overlap")
		assert.Equal(t, http.StatusOK, send(t, tryOnce, "GET", "/docs/7").status, "one more reader joins at once")
		requireProblem(t, send(t, tryOnce, "POST", "/docs/7"), http.StatusLocked)
		requireProblem(t, send(t, tryOnce, "DELETE", "/docs/7"), http.StatusLocked)

		writer := goSend(t, waiting[0], "POST", "/docs/7?block=2")
		close(gt.leave) // the readers leave; the writer gets in
		for _, ch := range blocking {
			r := <-ch
			require.NoError(t, r.err)
			assert.Equal(t, http.StatusOK, r.status)
		}
		gt.awaitEntered(t, 1, []<-chan result{writer})
		requireProblem(t, send(t, tryOnce, "GET", "/docs/7"), http.StatusLocked)
		assert.Equal(t, http.StatusLocked, send(t, tryOnce, "HEAD", "/docs/7").status)
		requireProblem(t, send(t, tryOnce, "PUT", "/docs/7"), http.StatusLocked)
		close(gt.leave2)
		r := <-writer
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusOK, r.status)

		var wg sync.WaitGroup
		methods := []string{"GET", "GET", "POST", "GET", "PUT", "HEAD", "GET", "DELETE"}
		for i := range requests {
			wg.Go(func() {
				res, err := do(t.Context(), waiting[i%2], methods[i%len(methods)], "/docs/7")
				if assert.NoError(t, err) {
					assert.Equal(t, http.StatusOK, res.status, res.body)
				}
			})
		}
		wg.Wait()
		assert.Zero(t, gt.withWriter.Load(), "a writer was inside with someone")
	})
}

// rwRoutes mounts h behind lock on /docs/{id}, for GET, HEAD, POST, PUT and DELETE.
func rwRoutes(rt router, lock func(http.Handler) http.Handler, h http.Handler) http.Handler {
	switch rt.name {
	case "chi":
		r := chi.NewRouter()
		r.With(lock).Handle("/docs/{id}", h)
		return r
	case "ServeMux":
		mux := http.NewServeMux()
		mux.Handle("/docs/{id}", lock(h))
		return mux
	}
	vr := &varsRouter{}
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE"} {
		vr.handle(m, "/docs/:id", lock(h))
	}
	return vr
}

// requireSharing fails a test on a backend that grants no shared holds: every backend the
// tests run does.
func requireSharing(t *testing.T, g *guard.Guard) {
	t.Helper()
	_, err := g.Semaphore("probe", 2)
	require.NoError(t, err, "the backend grants no shared holds")
}

// Permits and ReadWrite are checked when the middleware is built.
func TestPrimitiveOptionsPanics(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	plain := guard.New(guardtest.ReleaseFails{Backend: memstore.New()}) // hides memstore's Sharing
	t.Cleanup(func() { _ = plain.Close(context.Background()) })
	for _, tc := range []struct {
		name string
		f    func()
		want string
	}{
		{"zero permits", func() { middleware.Lock(g, "a:{id}", middleware.Permits(0)) }, "Permits(0): must be at least 1"},
		{"both", func() { middleware.Lock(g, "a:{id}", middleware.Permits(2), middleware.ReadWrite()) }, "not both"},
		{"no sharing, permits", func() { middleware.Lock(plain, "a:{id}", middleware.Permits(2)) }, "shared locks"},
		{"no sharing, read-write", func() {
			middleware.LockFunc(plain, "a", func(*http.Request) (string, error) { return "a", nil }, middleware.ReadWrite())
		}, "shared locks"},
		{"bad busy status", func() { middleware.Lock(g, "a:{id}", middleware.Permits(2), middleware.BusyStatus(0)) }, "BusyStatus(0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				msg := fmt.Sprint(recover())
				assert.True(t, strings.HasPrefix(msg, "guard/middleware: "), msg)
				assert.Contains(t, msg, tc.want)
			}()
			tc.f()
		})
	}
}
