package middleware_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// A request whose context's deadline passes — a deadline of the server's, set by a middleware
// before the lock — is answered 503 with a problem, whether the deadline passed while it
// waited for the lock, as the lock was granted, or while its body came; never an empty 200.
// The handler does not run.
func TestServerDeadline(t *testing.T) {
	const deadline = 100 * time.Millisecond
	tests := []struct {
		name string
		// setup holds the lock or slows the request down, before the request is sent.
		setup func(t *testing.T, g *guard.Guard, obs *acquisitions)
		body  string
	}{
		{"while waiting", func(t *testing.T, g *guard.Guard, _ *acquisitions) {
			l, err := g.Acquire(t.Context(), "account:7")
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Release(context.Background()) })
		}, ""},
		{"at the grant", func(t *testing.T, _ *guard.Guard, obs *acquisitions) {
			obs.atGrant = func(ctx context.Context) { <-ctx.Done() } // the deadline passes now
		}, ""},
		{"while the body came", func(t *testing.T, _ *guard.Guard, _ *acquisitions) {}, "slow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs := newAcquisitions()
			g := guard.New(memstore.New(), guard.WithObserver(obs))
			t.Cleanup(func() { _ = g.Close(context.Background()) })
			tt.setup(t, g, obs)
			bk := newBank()
			lock := middleware.Lock(g, "account:{id}", guard.WaitTime(requestTimeout))
			withDeadline := func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ctx, cancel := context.WithTimeout(r.Context(), deadline)
					defer cancel()
					lock(next).ServeHTTP(w, r.WithContext(ctx))
				})
			}
			srv := lockedBank(t, false, withDeadline, bk, nil)
			var res response
			if tt.body == "" {
				var err error
				res, err = post(t.Context(), srv, depositPath("late"), `{"amount":1}`)
				require.NoError(t, err)
			} else {
				c := startRaw(t, srv, depositPath("late"), "Content-Length: 12", `{"amount":`)
				time.Sleep(2 * deadline) // the deadline passes while the body is not in
				c.send(t, `1}`)
				status, body := c.response(t)
				res = response{status: status, header: http.Header{"Content-Type": {"application/problem+json"}}, body: body}
			}
			p := requireProblem(t, res, http.StatusServiceUnavailable)
			assert.Contains(t, p.Detail, "time")
			assert.Zero(t, bk.calls.Load(), "the handler did not run")
		})
	}
}

// A client that sends a request and never reads its response holds the lock while the
// handler's Write is blocked — until the server's WriteTimeout fails the write, as
// docs/templates.md says; the next request then gets the lock.
func TestUnreadResponse(t *testing.T) {
	g := closing(t, guard.New(memstore.New()))
	big := strings.Repeat("x", 32<<20) // more than every buffer on the way
	mux := http.NewServeMux()
	var wrote atomic.Int32
	mux.Handle("GET /reports/{id}", middleware.Lock(g, "report:{id}", guard.WaitTime(requestTimeout))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("big") == "1" {
				wrote.Add(1)
				_, _ = io.WriteString(w, big)
				return
			}
			// This request waited for the lock for most of its own WriteTimeout: the write gets a
			// deadline of its own, as a handler that may wait should.
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(requestTimeout))
			_, _ = io.WriteString(w, "small")
		})))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.WriteTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = io.WriteString(conn, "GET /reports/7?big=1 HTTP/1.1\r\nHost: x\r\n\r\n") // and never reads
	require.NoError(t, err)
	for wrote.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	res, err := do(t.Context(), srv, "GET", "/reports/7")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, res.status, res.body)
	assert.Equal(t, "small", res.body, "the lock came free once the write failed")
}
