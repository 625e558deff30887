package routers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// ginLock mounts a net/http lock middleware on gin routes. It gives the middleware gin's path
// parameters (decoded, unless the engine was told UseRawPath without UnescapePathValues) and
// the route's pattern the way chi and http.ServeMux do, as Request.PathValue and
// Request.Pattern, then runs the rest of gin's chain inside the middleware, under the lock.
func ginLock(lock func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		for _, p := range c.Params {
			c.Request.SetPathValue(p.Key, p.Value)
		}
		c.Request.Pattern = c.FullPath()
		ran := false
		lock(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			c.Request = r // its context is the lock's
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
		if !ran {
			c.Abort() // the middleware answered: busy, or no lock name
		}
	}
}

func Example_gin() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/accounts/:id/withdraw", ginLock(middleware.Lock(g, "account:{id}")), func(c *gin.Context) {
		withdraw(c.Writer, c.Request)
	})

	for _, path := range []string{"/accounts/42/withdraw", "/accounts/%61/withdraw"} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("POST", path, nil))
		fmt.Println(rec.Code, rec.Body)
	}
	// Output:
	// 200 withdrawn under account:42
	// 200 withdrawn under account:a
}
