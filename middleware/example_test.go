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

// At most two imports per tenant at once: the third is answered 429 while two are inside.
func ExamplePermits() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	inside, leave := make(chan struct{}), make(chan struct{})
	r := chi.NewRouter()
	r.With(middleware.Lock(g, "import:{tenant}", middleware.Permits(2))).Post("/tenants/{tenant}/imports",
		func(w http.ResponseWriter, r *http.Request) {
			inside <- struct{}{}
			<-leave // the import runs
		})

	done := make(chan int, 2)
	for range 2 {
		go func() {
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, httptest.NewRequest("POST", "/tenants/acme/imports", nil))
			done <- rec.Code
		}()
		<-inside
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("POST", "/tenants/acme/imports", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	close(leave)
	fmt.Println(<-done, <-done)
	// Output:
	// 429 application/problem+json
	// 200 200
}

// Reads of one document run side by side; a write runs alone.
func ExampleReadWrite() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	doc := middleware.Lock(g, "doc:{id}", middleware.ReadWrite())
	reading, leave := make(chan struct{}), make(chan struct{})
	r := chi.NewRouter()
	r.With(doc).Get("/docs/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("slow") {
			reading <- struct{}{}
			<-leave
		}
	})
	r.With(doc).Put("/docs/{id}", func(http.ResponseWriter, *http.Request) {})

	slow := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", "/docs/7?slow", nil))
		slow <- rec.Code
	}()
	<-reading
	for _, method := range []string{"GET", "PUT"} { // while the slow read goes on
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(method, "/docs/7", nil))
		fmt.Println(method, rec.Code)
	}
	close(leave)
	fmt.Println("slow GET", <-slow)
	// Output:
	// GET 200
	// PUT 423
	// slow GET 200
}
