package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

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
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"Bare", bare}, {"Locked", locked}} {
		b.Run(tc.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodPost, "/accounts/42/withdraw", nil)
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
