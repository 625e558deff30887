package routers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// echoLock mounts a net/http lock middleware on echo routes. It gives the middleware echo's
// path parameters and the route's pattern the way chi and http.ServeMux do, as
// Request.PathValue and Request.Pattern. echo matches the escaped path when it has escapes
// (URL.RawPath) and then hands out raw segments: decode them, so that "%61" is "a".
func echoLock(lock func(http.Handler) http.Handler) echo.MiddlewareFunc {
	wrap := echo.WrapMiddleware(lock)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		h := wrap(next)
		return func(c echo.Context) error {
			r := c.Request()
			for i, name := range c.ParamNames() {
				v := c.ParamValues()[i]
				if r.URL.RawPath != "" {
					if d, err := url.PathUnescape(v); err == nil {
						v = d
					}
				}
				r.SetPathValue(name, v)
			}
			r.Pattern = c.Path()
			return h(c)
		}
	}
}

func Example_echo() {
	g := guard.New(memstore.New())
	defer g.Close(context.Background())

	e := echo.New()
	e.POST("/accounts/:id/withdraw", func(c echo.Context) error {
		withdraw(c.Response(), c.Request())
		return nil
	}, echoLock(middleware.Lock(g, "account:{id}")))

	for _, path := range []string{"/accounts/42/withdraw", "/accounts/%61/withdraw"} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest("POST", path, nil))
		fmt.Println(rec.Code, rec.Body)
	}
	// Output:
	// 200 withdrawn under account:42
	// 200 withdrawn under account:a
}
