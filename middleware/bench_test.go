package middleware_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// BenchmarkRoute serves one chi route bare and behind the lock middleware on the in-process
// backend: the difference is what the lock costs a request.
func BenchmarkRoute(b *testing.B) {
	g := guard.New(memstore.New())
	b.Cleanup(func() { _ = g.Close(context.Background()) })
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	bare := chi.NewRouter()
	bare.Post("/accounts/{id}/withdraw", ok)
	locked := chi.NewRouter()
	locked.With(middleware.Lock(g, "account:{id}")).Post("/accounts/{id}/withdraw", ok)
	// Behind CleanPath and StripSlashes, with an escaped slash in the ID: the middleware works
	// out which path chi routed on (chipath.go) before it decodes the value.
	cleaned := chi.NewRouter()
	cleaned.Use(chimw.CleanPath, chimw.StripSlashes)
	cleaned.Route("/accounts", func(r chi.Router) {
		r.With(middleware.Lock(g, "account:{id}")).Post("/{id}/withdraw", ok)
	})
	for _, tc := range []struct {
		name, path string
		h          http.Handler
	}{
		{"Bare", "/accounts/42/withdraw", bare},
		{"Locked", "/accounts/42/withdraw", locked},
		{"LockedEscaped", "/accounts/a%2Fb/withdraw", locked},
		{"LockedEscapedCleanPath", "/accounts//a%2Fb/withdraw/", cleaned},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodPost, tc.path, nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for range b.N {
				tc.h.ServeHTTP(w, r)
				if w.Code != http.StatusNoContent {
					b.Fatal(w.Code)
				}
			}
		})
	}
}

// BenchmarkLongHeader sends a request whose lock name would come from a 1 MiB header: it is
// answered 400 after a length check, without rendering and escaping the header (issue 23).
func BenchmarkLongHeader(b *testing.B) {
	g := guard.New(memstore.New())
	b.Cleanup(func() { _ = g.Close(context.Background()) })
	h := middleware.Lock(g, "tenant:{header.X-Tenant}")(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		b.Fatal("the handler ran")
	}))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("X-Tenant", strings.Repeat("{x}", 1<<20/3))
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest {
			b.Fatal(w.Code)
		}
	}
}

// BenchmarkNextLiveRequest measures what issue 23 measured on examples/httpapi: how long the
// next live request for an account waits for its lock while other clients of the account
// misbehave. It reports ms-to-lock: from the moment the misbehaving clients are in place to
// the moment the live request's handler runs; the route waits up to 2 s (a live request
// that did not get the lock by then counts 2000 ms).
//
//   - slow-body: a client sent its headers and part of its body, and sends the rest only
//     once the live request is done (HTTP/1.1, Content-Length);
//   - dribble: a client sends its 20-byte body a byte every 10 ms (200 ms);
//   - gone-waiters-h1, -h2: a holder works while 20 requests with bodies wait behind it and
//     the live request behind them; the 20 clients hang up, and the server is given up to 1 s
//     to notice; from the holder's release then. Each handler but the holder's works 20 ms.
func BenchmarkNextLiveRequest(b *testing.B) {
	const wait = 2 * time.Second
	newLock := func(b *testing.B) func(http.Handler) http.Handler {
		g := guard.New(memstore.New())
		b.Cleanup(func() { _ = g.Close(context.Background()) })
		return middleware.Lock(g, "account:{id}", guard.WaitTime(wait))
	}
	// live sends the live request and returns when its handler ran, or after the wait.
	live := func(srv *httptest.Server, bk *bank, start time.Time) time.Duration {
		res := goPost(context.Background(), srv, depositPath("live"), `{"amount":1}`)
		for {
			select {
			case who := <-bk.ran:
				if who == "live" {
					took := time.Since(start)
					<-res
					return took
				}
			case <-res:
				return wait // refused after the wait
			}
		}
	}
	b.Run("slow-body", func(b *testing.B) {
		bk, arrived := newBank(), make(chan string, 16)
		srv := lockedBank(b, false, newLock(b), bk, arrived)
		var total time.Duration
		for b.Loop() {
			c := startRaw(b, srv, depositPath("slow"), "Content-Length: 13", `{"amount":`)
			<-arrived
			total += live(srv, bk, time.Now())
			<-arrived
			c.send(b, `10}`)
			c.response(b)
		}
		b.ReportMetric(float64(total)/float64(time.Millisecond)/float64(b.N), "ms-to-lock")
	})
	b.Run("dribble", func(b *testing.B) {
		bk, arrived := newBank(), make(chan string, 16)
		srv := lockedBank(b, false, newLock(b), bk, arrived)
		const body = `{"amount":123456789}`
		var total time.Duration
		for b.Loop() {
			c := startRaw(b, srv, depositPath("slow"), fmt.Sprintf("Content-Length: %d", len(body)), body[:1])
			<-arrived
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 1; i < len(body); i++ {
					time.Sleep(10 * time.Millisecond) // the client's pace
					_, _ = io.WriteString(c.conn, body[i:i+1])
				}
			}()
			total += live(srv, bk, time.Now())
			<-arrived
			<-done
			c.response(b)
		}
		b.ReportMetric(float64(total)/float64(time.Millisecond)/float64(b.N), "ms-to-lock")
	})
	for _, h2 := range []bool{false, true} {
		name := "gone-waiters-h1"
		if h2 {
			name = "gone-waiters-h2"
		}
		b.Run(name, func(b *testing.B) {
			const waiters = 20
			obs := newAcquisitions()
			g := guard.New(memstore.New(), guard.WithObserver(obs))
			b.Cleanup(func() { _ = g.Close(context.Background()) })
			bk, arrived := newBank(), make(chan string, 64)
			bk.work = 20 * time.Millisecond
			srv := lockedBank(b, h2, middleware.Lock(g, "account:{id}", guard.WaitTime(wait)), bk, arrived)
			var total time.Duration
			for b.Loop() {
				bk.leave = make(chan struct{})
				holder := goPost(context.Background(), srv, depositPath("holder"), `{"amount":1}`)
				for <-bk.ran != "holder" {
				}
				ctx, hangUp := context.WithCancel(context.Background())
				var gone []<-chan result
				for range waiters {
					gone = append(gone, goPost(ctx, srv, depositPath("gone"), `{"amount":2}`))
				}
				for range waiters + 1 {
					<-arrived
				}
				res := goPost(context.Background(), srv, depositPath("live"), `{"amount":3}`)
				<-arrived
				for range waiters + 2 {
					<-obs.started // the holder's, the others', the live request's
				}
				hangUp()
				for _, g := range gone {
					<-g
				}
				// Give the server up to 1 s to notice that the clients left (their waits end).
				noticed := time.After(time.Second)
			notice:
				for range waiters {
					select {
					case <-obs.ended:
					case <-noticed:
						break notice
					}
				}
				start := time.Now()
				close(bk.leave)
				<-holder
				for who := range bk.ran {
					if who == "live" {
						total += time.Since(start)
						break
					}
				}
				<-res
				// Handlers of requests whose clients left may still run; let them end.
				for len(bk.ran) > 0 || len(obs.ended) > 0 {
					select {
					case <-bk.ran:
					case <-obs.ended:
					}
				}
			}
			b.ReportMetric(float64(total)/float64(time.Millisecond)/float64(b.N), "ms-to-lock")
		})
	}
}
