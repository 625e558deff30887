package middleware_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
)

// The helpers of this file play the clients of issue 23 against a real net/http server: a
// client that sends its headers and part of its body and then goes silent or dribbles the
// rest, and clients that hang up while their requests wait for the lock.

// bank is a handler for POST /accounts/{id}/deposit that reads the whole body, as a JSON API
// does. Every request reports on ran, with its "who" query value, once inside; a request
// with who=holder then holds the lock until leave is closed; work is spent in every other
// handler (benchmarks only: the work a real handler does).
type bank struct {
	calls atomic.Int32
	ran   chan string
	leave chan struct{}
	work  time.Duration
}

func newBank() *bank { return &bank{ran: make(chan string, 1024), leave: make(chan struct{})} }

func (b *bank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.calls.Add(1)
	who := r.URL.Query().Get("who")
	b.ran <- who
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if who == "holder" {
		select {
		case <-b.leave:
		case <-r.Context().Done():
		}
	} else if b.work > 0 {
		time.Sleep(b.work) // the handler's work (benchmarks only)
	}
	fmt.Fprintf(w, "deposited %s", body)
}

// depositPath is the path a request for account 7 goes to, with who in its query.
func depositPath(who string) string { return "/accounts/7/deposit?who=" + who }

// lockedBank serves b behind the lock middleware built by lock on a real server, HTTP/1.1 or
// (h2) HTTP/2 over TLS. arrived, when not nil, hears of each request that reaches the lock
// middleware, by its who value.
func lockedBank(tb testing.TB, h2 bool, lock func(http.Handler) http.Handler, b *bank, arrived chan<- string) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/deposit", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived != nil {
			arrived <- r.URL.Query().Get("who")
		}
		lock(b).ServeHTTP(w, r)
	}))
	srv := httptest.NewUnstartedServer(mux)
	// Servers close idle connections; a handler cut short by the test's end is not waited for.
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	tb.Cleanup(srv.Close)
	return srv
}

// rawClient is an HTTP/1.1 client on a connection of its own, whose request body the test
// sends piece by piece.
type rawClient struct {
	conn net.Conn
	resp chan *http.Response // the response, or nil when the connection ended first
}

// startRaw connects to srv and sends the head of a POST to path with the body framing given
// by header ("Content-Length: 14" or "Transfer-Encoding: chunked"), and first, the body's
// first piece as it goes on the wire.
func startRaw(tb testing.TB, srv *httptest.Server, path, header, first string) *rawClient {
	tb.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	c := &rawClient{conn: conn, resp: make(chan *http.Response, 1)}
	c.send(tb, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: bank\r\nContent-Type: application/json\r\n%s\r\n\r\n%s", path, header, first))
	go func() {
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			c.resp <- nil
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body = io.NopCloser(strings.NewReader(string(body)))
		c.resp <- res
	}()
	return c
}

// send writes s to the connection.
func (c *rawClient) send(tb testing.TB, s string) {
	tb.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		tb.Fatal(err)
	}
}

// response waits for the response, and returns its status and body.
func (c *rawClient) response(tb testing.TB) (int, string) {
	tb.Helper()
	select {
	case res := <-c.resp:
		if res == nil {
			tb.Fatal("the connection ended without a response")
		}
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	case <-time.After(requestTimeout):
		tb.Fatalf("no response in %v", requestTimeout)
	}
	return 0, ""
}

// chunk returns s as one chunk of a chunked body.
func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// post sends a POST with body to srv's path under ctx.
func post(ctx context.Context, srv *httptest.Server, path, body string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	return exchange(srv, req)
}

// goPost sends a POST from a new goroutine under ctx and returns where its result arrives.
func goPost(ctx context.Context, srv *httptest.Server, path, body string) <-chan result {
	return async(func() (response, error) { return post(ctx, srv, path, body) })
}

// acquisitions is an Observer that reports every acquisition that starts and ends.
type acquisitions struct {
	started chan struct{}
	ended   chan guard.Acquisition
	// atGrant, when set, runs in AcquireEnd when a lock was granted, with the context of the
	// acquisition.
	atGrant func(ctx context.Context)
}

func newAcquisitions() *acquisitions {
	return &acquisitions{started: make(chan struct{}, 1024), ended: make(chan guard.Acquisition, 1024)}
}

func (o *acquisitions) AcquireStart(ctx context.Context, _ *guard.Acquisition) context.Context {
	o.started <- struct{}{}
	return ctx
}

func (o *acquisitions) AcquireEnd(ctx context.Context, a *guard.Acquisition, l *guard.Lock, _ error) context.Context {
	if l != nil && o.atGrant != nil {
		o.atGrant(ctx)
	}
	o.ended <- *a
	return ctx
}

func (o *acquisitions) LockEvent(*guard.Lock, guard.LockEvent) {}

// await receives n values from ch, or fails naming what did not happen.
func await[T any](tb testing.TB, ch <-chan T, n int, what string) []T {
	tb.Helper()
	var got []T
	timeout := time.After(requestTimeout)
	for len(got) < n {
		select {
		case v := <-ch:
			got = append(got, v)
		case <-timeout:
			tb.Fatalf("%s: %d of %d in %v", what, len(got), n, requestTimeout)
		}
	}
	return got
}

// backend is a lock backend the tests of this file run on, with an observer.
type backend struct {
	name  string
	guard func(tb testing.TB, obs guard.Observer) *guard.Guard
}

var backends = []backend{
	{"memstore", func(tb testing.TB, obs guard.Observer) *guard.Guard {
		return closing(tb, guard.New(memstore.New(), guard.WithObserver(obs)))
	}},
	{"redis", func(tb testing.TB, obs guard.Observer) *guard.Guard {
		srv := testserver.StartRedis(tb)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr})
		tb.Cleanup(func() { _ = client.Close() })
		return closing(tb, guard.New(redisstore.New(client), guard.WithObserver(obs)))
	}},
}

// closing closes g when the test ends.
func closing(tb testing.TB, g *guard.Guard) *guard.Guard {
	tb.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}
