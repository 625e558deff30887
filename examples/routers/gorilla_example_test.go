package routers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gorilla/mux"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// gorillaVars is the PathValues function for gorilla/mux: the variables of the matched
// route, which gorilla/mux decodes unless the router was told UseEncodedPath.
func gorillaVars(r *http.Request, name string) (string, bool) {
	v, ok := mux.Vars(r)[name]
	return v, ok
}

func Example_gorilla() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	r := mux.NewRouter()
	accounts := r.PathPrefix("/accounts/{id}").Subrouter()
	// A subrouter's middleware runs once its route has matched: {id} is known.
	accounts.Use(middleware.Lock(g, "account:{id}", middleware.PathValues(gorillaVars)))
	accounts.HandleFunc("/withdraw", withdraw).Methods("POST")

	for _, path := range []string{"/accounts/42/withdraw", "/accounts/%61/withdraw"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("POST", path, nil))
		fmt.Println(rec.Code, rec.Body)
	}
	// Output:
	// 200 withdrawn under account:42
	// 200 withdrawn under account:a
}

// withdraw answers with the name of the lock it runs under.
func withdraw(w http.ResponseWriter, r *http.Request) {
	l, _ := guard.FromContext(r.Context())
	fmt.Fprintf(w, "withdrawn under %s", l.Name())
}
