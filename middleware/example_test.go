package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

func ExampleLock() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	r := chi.NewRouter()
	// With, not Use: the lock name needs {id}, which exists once chi has routed the request.
	r.With(middleware.Lock(g, "account:{id}")).Post("/accounts/{id}/withdraw",
		func(w http.ResponseWriter, r *http.Request) {
			l, _ := guard.FromContext(r.Context())
			fmt.Fprintf(w, "withdrawn under %s", l.Name())
		})

	// One account, one lock, however the URL spells it: path parameters are decoded.
	for _, path := range []string{"/accounts/42/withdraw", "/accounts/%34%32/withdraw"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("POST", path, nil))
		fmt.Println(rec.Code, rec.Body)
	}
	// Output:
	// 200 withdrawn under account:42
	// 200 withdrawn under account:42
}

// Routers that keep path parameters in the request's context, as gorilla/mux does, give
// Lock a function that reads them. With gorilla/mux it is
//
//	func(r *http.Request, name string) (string, bool) { v, ok := mux.Vars(r)[name]; return v, ok }
//
// docs/templates.md shows gorilla/mux, gin and echo; examples/routers runs them.
func ExamplePathValues() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	// routed stands for a router that matched POST /accounts/{id}/withdraw with id 42.
	type varsKey struct{}
	routed := func(r *http.Request, vars map[string]string) *http.Request {
		return r.WithContext(context.WithValue(r.Context(), varsKey{}, vars))
	}
	vars := func(r *http.Request, name string) (string, bool) {
		v, ok := r.Context().Value(varsKey{}).(map[string]string)[name]
		return v, ok // ok is false when the router matched no route with the parameter
	}
	h := middleware.Lock(g, "account:{id}", middleware.PathValues(vars))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l, _ := guard.FromContext(r.Context())
			fmt.Fprintf(w, "withdrawn under %s", l.Name())
		}))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, routed(httptest.NewRequest("POST", "/accounts/42/withdraw", nil), map[string]string{"id": "42"}))
	fmt.Println(rec.Code, rec.Body)
	// Output: 200 withdrawn under account:42
}

func ExampleLock_busy() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/withdraw", middleware.Lock(g, "account:{id}")(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))

	// Another request holds account 42.
	l, _ := g.TryAcquire(context.Background(), "account:42")
	defer l.Release(context.Background())

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("POST", "/accounts/42/withdraw", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Retry-After") != "")
	fmt.Print(rec.Body)
	// Output:
	// 423 application/problem+json true
	// {"type":"about:blank","title":"Locked","status":423,"detail":"Another request holds the lock on this resource. Try again later."}
}

func ExampleLock_sources() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	mux := http.NewServeMux()
	mux.Handle("PUT /imports/{kind}", middleware.Lock(g,
		"tenant:{header.X-Tenant}:import:{kind}:{query.year}",
		guard.WaitTime(2*time.Second), // wait for the running import instead of 423
		middleware.BusyStatus(http.StatusConflict),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, _ := guard.FromContext(r.Context())
		fmt.Fprint(w, l.Name())
	})))

	req := httptest.NewRequest("PUT", "/imports/invoices?year=2024", nil)
	req.Header.Set("X-Tenant", "acme:eu")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Body) // the ':' in the tenant is escaped: it cannot forge a name

	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("PUT", "/imports/invoices?year=2024", nil))
	fmt.Print(rec.Code, " ", rec.Body) // no X-Tenant: never one lock for all tenants
	// Output:
	// 200 tenant:acme%3Aeu:import:invoices:2024
	// 400 {"type":"about:blank","title":"Bad Request","status":400,"detail":"The lock name for this request cannot be made: {header.X-Tenant}: empty value."}
}

func ExampleLockFunc() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	byUser := middleware.LockFunc(g, "user", func(r *http.Request) (string, error) {
		user, _, ok := r.BasicAuth()
		if !ok {
			return "", fmt.Errorf("no user")
		}
		return "user:" + user, nil
	})
	h := byUser(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, _ := guard.FromContext(r.Context())
		fmt.Fprint(w, l.Name())
	}))

	req := httptest.NewRequest("GET", "/", nil)
	req.SetBasicAuth("ann", "secret")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Body)
	// Output: 200 user:ann
}
