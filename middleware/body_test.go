package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/middleware"
)

// A client that is slow to send its body never holds the lock: the middleware takes it once
// the body is in, so the next live request gets it at once — its first attempt, a try-once
// lock — however long the slow client takes. Each case sends its body in pieces; between two
// pieces, a live request for the same account must be served.
func TestSlowBodies(t *testing.T) {
	const body = `{"amount":10}`
	bytewise := func(s string) []string { return strings.Split(s, "") }
	tests := []struct {
		name, header string
		pieces       []string // the body as it goes on the wire, piece by piece
	}{
		{"idle", "Content-Length: 13", []string{`{"amount":`, `10}`}},
		{"dribbled", "Content-Length: 13", bytewise(body)},
		{"chunked idle", "Transfer-Encoding: chunked", []string{chunk(`{"amount":`), chunk(`10}`) + chunk("")}},
		{"chunked dribbled", "Transfer-Encoding: chunked", append(
			[]string{chunk(`{"a`), "3\r\n", `mou`, "\r\n"}, chunk(`nt":10}`), "0\r\n", "\r\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := guard.New(memstore.New())
			t.Cleanup(func() { _ = g.Close(context.Background()) })
			bk, arrived := newBank(), make(chan string, 16)
			srv := lockedBank(t, false, middleware.Lock(g, "account:{id}"), bk, arrived)

			slow := startRaw(t, srv, depositPath("slow"), tt.header, tt.pieces[0])
			require.Equal(t, "slow", <-arrived)
			for i, piece := range tt.pieces[1:] {
				res, err := post(t.Context(), srv, depositPath("live"), `{"amount":1}`)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, res.status, "live request %d, while the slow body is not in: %s", i, res.body)
				require.Equal(t, "live", <-arrived)
				slow.send(t, piece)
			}
			status, got := slow.response(t)
			require.Equal(t, http.StatusOK, status, got)
			assert.Equal(t, "deposited "+body, got, "the handler reads the whole body")
			assert.Equal(t, int32(len(tt.pieces)), bk.calls.Load(), "the live requests and the slow one")
		})
	}
}

// The same over HTTP/2, where the body comes in DATA frames.
func TestSlowBodyHTTP2(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	bk, arrived := newBank(), make(chan string, 16)
	srv := lockedBank(t, true, middleware.Lock(g, "account:{id}"), bk, arrived)

	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	req, err := http.NewRequestWithContext(t.Context(), "POST", srv.URL+depositPath("slow"), pr)
	require.NoError(t, err)
	slow := async(func() (response, error) { return exchange(srv, req) })
	_, err = io.WriteString(pw, `{"amount":`)
	require.NoError(t, err)
	require.Equal(t, "slow", <-arrived)

	res, err := post(t.Context(), srv, depositPath("live"), `{"amount":1}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.status, "the live request, while the slow body is not in: %s", res.body)
	_, err = io.WriteString(pw, `10}`)
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	r := <-slow
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.status, r.body)
	assert.Equal(t, `deposited {"amount":10}`, r.body)
}

// Requests that wait for the lock end when their clients hang up — over HTTP/1.1 too, where
// net/http notices a closed connection only once the body is read — and their handlers never
// run: when the holder is done, the live request queued behind them gets the lock next.
func TestGoneWaiters(t *testing.T) {
	for _, be := range backends {
		for _, h2 := range []bool{false, true} {
			name := be.name + "/HTTP1.1"
			if h2 {
				name = be.name + "/HTTP2"
			}
			t.Run(name, func(t *testing.T) {
				const waiters = 8
				obs := newAcquisitions()
				g := be.guard(t, obs)
				bk, arrived := newBank(), make(chan string, 16)
				srv := lockedBank(t, h2, middleware.Lock(g, "account:{id}", guard.WaitTime(requestTimeout)), bk, arrived)

				holder := goPost(t.Context(), srv, depositPath("holder"), `{"amount":1}`)
				require.Equal(t, "holder", await(t, bk.ran, 1, "the holder inside")[0])
				await(t, obs.ended, 1, "the holder's acquisition")

				ctx, hangUp := context.WithCancel(t.Context())
				var gone []<-chan result
				for range waiters {
					gone = append(gone, goPost(ctx, srv, depositPath("gone"), `{"amount":2}`))
				}
				await(t, obs.started, 1+waiters, "acquisitions started")
				live := goPost(t.Context(), srv, depositPath("live"), `{"amount":3}`)
				await(t, obs.started, 1, "the live request's acquisition")

				hangUp()
				for _, g := range gone {
					r := <-g
					require.ErrorIs(t, r.err, context.Canceled)
				}
				for _, a := range await(t, obs.ended, waiters, "waits ended by the clients that left") {
					assert.Equal(t, guard.OutcomeCanceled, a.Outcome)
				}

				close(bk.leave)
				r := <-holder
				require.NoError(t, r.err)
				require.Equal(t, http.StatusOK, r.status)
				r = <-live
				require.NoError(t, r.err)
				require.Equal(t, http.StatusOK, r.status, r.body)
				a := await(t, obs.ended, 1, "the live request's acquisition")[0]
				assert.Equal(t, guard.OutcomeAcquired, a.Outcome)
				assert.Equal(t, int32(2), bk.calls.Load(), "only the holder's and the live request's handlers ran")
			})
		}
	}
}

// A request whose client leaves as the lock is granted does not run the handler: the lock is
// given back.
func TestGoneAtGrant(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("HTTP2=%v", h2), func(t *testing.T) {
			obs := newAcquisitions()
			g := guard.New(memstore.New(), guard.WithObserver(obs))
			t.Cleanup(func() { _ = g.Close(context.Background()) })
			bk := newBank()
			// The live request waits for the gone one's release, which follows its grant.
			srv := lockedBank(t, h2, middleware.Lock(g, "account:{id}", guard.WaitTime(requestTimeout)), bk, nil)

			ctx, hangUp := context.WithCancel(t.Context())
			noticed := make(chan bool, 1)
			var first sync.Once
			obs.atGrant = func(actx context.Context) {
				first.Do(func() { // the first request's: its client leaves now
					hangUp()
					select {
					case <-actx.Done(): // the server noticed
						noticed <- true
					case <-time.After(requestTimeout):
						noticed <- false
					}
				})
			}
			_, err := post(ctx, srv, depositPath("gone"), `{"amount":1}`)
			require.ErrorIs(t, err, context.Canceled)
			require.True(t, <-noticed, "the server noticed that the client left")
			await(t, obs.ended, 1, "the acquisition")

			res, err := post(t.Context(), srv, depositPath("live"), `{"amount":2}`)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, res.status, "the lock was given back: %s", res.body)
			assert.Equal(t, int32(1), bk.calls.Load(), "the handler ran for the live request only")
		})
	}
}

// The body options: a body larger than MaxBodyBytes is refused with 413 and one slower than
// BodyTimeout with 408, before the lock and without the handler; StreamBody leaves the body
// to the handler, under the lock.
func TestBodyOptions(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })

	t.Run("MaxBodyBytes", func(t *testing.T) {
		bk := newBank()
		srv := lockedBank(t, false, middleware.Lock(g, "account:{id}", middleware.MaxBodyBytes(8)), bk, nil)
		for _, tc := range []struct {
			name, header, body string
			status             int
		}{
			{"at the limit", "Content-Length: 8", "12345678", http.StatusOK},
			{"over, by its length", "Content-Length: 9", "123456789", http.StatusRequestEntityTooLarge},
			{"over, chunked", "Transfer-Encoding: chunked", chunk("12345") + chunk("6789") + chunk(""), http.StatusRequestEntityTooLarge},
			{"empty", "Content-Length: 0", "", http.StatusOK},
		} {
			t.Run(tc.name, func(t *testing.T) {
				calls := bk.calls.Load()
				status, got := startRaw(t, srv, depositPath(""), tc.header, tc.body).response(t)
				require.Equal(t, tc.status, status, got)
				if status == http.StatusOK {
					return
				}
				var p problem
				require.NoError(t, json.Unmarshal([]byte(got), &p))
				assert.Equal(t, "The request body is larger than this resource accepts (8 bytes).", p.Detail)
				assert.Equal(t, calls, bk.calls.Load(), "the handler is not called")
			})
		}
	})
	t.Run("MaxBodyBytes without a practical limit", func(t *testing.T) {
		// A limit as large as an int64 goes reads the whole body (the read of one byte past
		// the limit, to tell a body over it, must not overflow).
		for _, n := range []int64{math.MaxInt64, math.MaxInt64 - 1} {
			srv := lockedBank(t, false, middleware.Lock(g, "account:{id}", middleware.MaxBodyBytes(n)), newBank(), nil)
			for _, header := range []string{"Content-Length: 13", "Transfer-Encoding: chunked"} {
				body := `{"amount":10}`
				if header != "Content-Length: 13" {
					body = chunk(`{"amount":`) + chunk(`10}`) + chunk("")
				}
				status, got := startRaw(t, srv, depositPath(""), header, body).response(t)
				require.Equal(t, http.StatusOK, status, got)
				assert.Equal(t, `deposited {"amount":10}`, got, "MaxBodyBytes(%d), %s", n, header)
			}
		}
	})
	t.Run("BodyTimeout", func(t *testing.T) {
		bk := newBank()
		srv := lockedBank(t, false, middleware.Lock(g, "account:{id}", middleware.BodyTimeout(50*time.Millisecond)), bk, nil)
		// The client sends half its body and nothing more.
		status, got := startRaw(t, srv, depositPath(""), "Content-Length: 13", `{"amount":`).response(t)
		require.Equal(t, http.StatusRequestTimeout, status, got)
		assert.Contains(t, got, "The request body did not arrive in time.")
		assert.Zero(t, bk.calls.Load())
	})
	t.Run("BodyTimeout HTTP2", func(t *testing.T) {
		// HTTP/2 ends the one stream: the connection goes on serving the client's other
		// requests (Connection: close would make the server close it).
		bk := newBank()
		srv := lockedBank(t, true, middleware.Lock(g, "account:{id}", middleware.BodyTimeout(50*time.Millisecond)), bk, nil)
		pr, pw := io.Pipe()
		t.Cleanup(func() { _ = pw.Close() })
		go func() { _, _ = io.WriteString(pw, `{"amount":`) }() // and no more
		req, err := http.NewRequestWithContext(t.Context(), "POST", srv.URL+depositPath(""), pr)
		require.NoError(t, err)
		var first, second net.Conn
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { first = ci.Conn },
		}))
		res, err := exchange(srv, req)
		require.NoError(t, err)
		requireProblem(t, res, http.StatusRequestTimeout)
		assert.Empty(t, res.header.Get("Connection"))

		req, err = http.NewRequestWithContext(t.Context(), "POST", srv.URL+depositPath(""), strings.NewReader("{}"))
		require.NoError(t, err)
		var reused bool
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { second, reused = ci.Conn, ci.Reused },
		}))
		res, err = exchange(srv, req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.status, res.body)
		assert.True(t, reused && first == second, "the next request goes on the same connection")
		assert.Zero(t, bk.calls.Load()-1, "only the second request ran the handler")
	})
	t.Run("StreamBody", func(t *testing.T) {
		bk, arrived := newBank(), make(chan string, 4)
		srv := lockedBank(t, false, middleware.Lock(g, "account:{id}", middleware.StreamBody()), bk, arrived)
		slow := startRaw(t, srv, depositPath("slow"), "Content-Length: 13", `{"amount":`)
		require.Equal(t, "slow", <-arrived)
		require.Equal(t, "slow", <-bk.ran, "the handler runs before the body is in")
		res, err := post(t.Context(), srv, depositPath("live"), "{}")
		require.NoError(t, err)
		requireProblem(t, res, http.StatusLocked) // the streaming request holds the lock
		slow.send(t, `10}`)
		status, got := slow.response(t)
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, `deposited {"amount":10}`, got)
	})
}

// The handler gets the body from memory, whole, with its length; a LockFunc key may read it
// first. With StreamBody, the handler reads again what the key read, then the rest of the
// body as it comes — over HTTP/1, where the middleware reads ahead, and HTTP/2 — for bodies
// shorter and longer than the read-ahead.
func TestBodyReplay(t *testing.T) {
	g := guard.New(memstore.New())
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	type seen struct {
		body   string
		length int64
		again  string // from GetBody
		lock   string
	}
	got := make(chan seen, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s := seen{body: string(b), length: r.ContentLength}
		if r.GetBody != nil {
			rc, _ := r.GetBody()
			again, _ := io.ReadAll(rc)
			s.again = string(again)
		}
		l, _ := guard.FromContext(r.Context())
		s.lock = l.Name()
		got <- s
	})
	key := func(r *http.Request) (string, error) {
		var v struct{ Account string }
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil || v.Account == "" {
			return "", errors.New("no account")
		}
		return "account:" + v.Account, nil
	}

	t.Run("in memory", func(t *testing.T) {
		srv := serve(t, middleware.LockFunc(g, "account:{json.account}", key)(h))
		const body = `{"account":"7","amount":10}`
		status, res := startRaw(t, srv, "/", "Transfer-Encoding: chunked", chunk(body[:9])+chunk(body[9:])+chunk("")).response(t)
		require.Equal(t, http.StatusOK, status, res)
		assert.Equal(t, seen{body: body, length: int64(len(body)), again: body, lock: "account:7"}, <-got)
	})
	for _, size := range []int{0, 200 << 10} { // padding after the JSON: none, or past the read-ahead
		body := `{"account":"7","amount":10}` + strings.Repeat(" ", size)
		t.Run(fmt.Sprintf("StreamBody HTTP/1 %d", len(body)), func(t *testing.T) {
			srv := serve(t, middleware.LockFunc(g, "account:{json.account}", key, middleware.StreamBody())(h))
			status, res := startRaw(t, srv, "/", "Transfer-Encoding: chunked", chunk(body[:9])+chunk(body[9:])+chunk("")).response(t)
			require.Equal(t, http.StatusOK, status, res)
			s := <-got
			assert.Equal(t, body, s.body, "the handler reads the whole body")
			assert.Equal(t, "account:7", s.lock)
		})
		t.Run(fmt.Sprintf("StreamBody HTTP/2 %d", len(body)), func(t *testing.T) {
			srv := httptest.NewUnstartedServer(middleware.LockFunc(g, "account:{json.account}", key, middleware.StreamBody())(h))
			srv.EnableHTTP2 = true
			srv.StartTLS()
			t.Cleanup(srv.Close)
			res, err := post(t.Context(), srv, "/", body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, res.status, res.body)
			s := <-got
			assert.Equal(t, body, s.body, "the handler reads the whole body")
			assert.Equal(t, int64(len(body)), s.length)
			assert.Equal(t, "account:7", s.lock)
		})
	}
}

// With StreamBody too, a request that waits for the lock ends when its client hangs up —
// one that sent its whole body, and one that sent part of it — and its handler never runs,
// over HTTP/1.1 (where net/http notices a closed connection only when it reads from it) and
// HTTP/2.
func TestGoneWaitersStreamBody(t *testing.T) {
	// keyReads: a LockFunc key reads the start of the body before the wait, which leaves the
	// read-ahead going.
	keyReads := func(r *http.Request) (string, error) {
		if _, err := io.ReadFull(r.Body, make([]byte, 1)); err != nil {
			return "", err
		}
		return "account:" + r.PathValue("id"), nil
	}
	for _, h2 := range []bool{false, true} {
		for _, partial := range []bool{false, true} {
			for _, lockFunc := range []bool{false, true} {
				t.Run(fmt.Sprintf("HTTP2=%v/partial=%v/LockFunc=%v", h2, partial, lockFunc), func(t *testing.T) {
					const waiters = 4
					obs := newAcquisitions()
					g := closing(t, guard.New(memstore.New(), guard.WithObserver(obs)))
					bk := newBank()
					lock := middleware.Lock(g, "account:{id}", guard.WaitTime(requestTimeout), middleware.StreamBody())
					if lockFunc {
						lock = middleware.LockFunc(g, "account", keyReads, guard.WaitTime(requestTimeout), middleware.StreamBody())
					}
					srv := lockedBank(t, h2, lock, bk, nil)

					holder := goPost(t.Context(), srv, depositPath("holder"), `{"amount":1}`)
					require.Equal(t, "holder", await(t, bk.ran, 1, "the holder inside")[0])
					await(t, obs.ended, 1, "the holder's acquisition")

					ctx, hangUp := context.WithCancel(t.Context())
					var (
						gone  []<-chan result
						pipes []*io.PipeWriter
					)
					for range waiters {
						body := io.Reader(strings.NewReader(`{"amount":2}`))
						if partial {
							pr, pw := io.Pipe()
							pipes = append(pipes, pw)
							go func() { _, _ = io.WriteString(pw, `{"amount":`) }() // and no more
							body = pr
						}
						req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+depositPath("gone"), body)
						require.NoError(t, err)
						gone = append(gone, async(func() (response, error) { return exchange(srv, req) }))
					}
					await(t, obs.started, 1+waiters, "acquisitions started")

					hangUp()
					for _, pw := range pipes {
						pw.CloseWithError(context.Canceled) // the client stops sending its body too
					}
					for _, g := range gone {
						require.ErrorIs(t, (<-g).err, context.Canceled)
					}
					for _, a := range await(t, obs.ended, waiters, "waits ended by the clients that left") {
						assert.Equal(t, guard.OutcomeCanceled, a.Outcome)
					}
					close(bk.leave)
					r := <-holder
					require.NoError(t, r.err)
					require.Equal(t, http.StatusOK, r.status)
					res, err := post(t.Context(), srv, depositPath("live"), `{"amount":3}`)
					require.NoError(t, err)
					require.Equal(t, http.StatusOK, res.status, res.body)
					assert.Equal(t, int32(2), bk.calls.Load(), "only the holder's and the live request's handlers ran")
				})
			}
		}
	}
}

// An HTTP/1.1 client that sends its whole request and then half-closes its connection, still
// reading, is one that left for net/http, which cancels the request's context: its wait ends
// without an answer — not a busy one (the holder is still in), nor the 200 of a handler that
// wrote nothing — and its handler never runs. The connection is closed unanswered.
func TestHalfClosedWaiter(t *testing.T) {
	for _, opt := range []struct {
		name string
		opts []guard.LockOption
	}{
		{"Lock", nil},
		{"StreamBody", []guard.LockOption{middleware.StreamBody()}},
		{"ReadWrite", []guard.LockOption{middleware.ReadWrite()}},
	} {
		t.Run(opt.name, func(t *testing.T) {
			obs := newAcquisitions()
			g := closing(t, guard.New(memstore.New(), guard.WithObserver(obs)))
			bk := newBank()
			opts := append([]guard.LockOption{guard.WaitTime(requestTimeout)}, opt.opts...)
			srv := lockedBank(t, false, middleware.Lock(g, "account:{id}", opts...), bk, nil)

			holder := goPost(t.Context(), srv, depositPath("holder"), `{"amount":1}`)
			require.Equal(t, "holder", await(t, bk.ran, 1, "the holder inside")[0])
			await(t, obs.ended, 1, "the holder's acquisition")

			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			_, err = io.WriteString(conn, "POST "+depositPath("half")+" HTTP/1.1\r\nHost: bank\r\n"+
				"Content-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"amount\":2}")
			require.NoError(t, err)
			require.NoError(t, conn.(*net.TCPConn).CloseWrite())
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(requestTimeout)))
			got, err := io.ReadAll(conn)
			require.NoError(t, err, "the server closes the connection")
			assert.Empty(t, string(got), "no response")

			close(bk.leave)
			r := <-holder
			require.NoError(t, r.err)
			require.Equal(t, http.StatusOK, r.status)
			assert.Equal(t, int32(1), bk.calls.Load(), "only the holder's handler ran")
		})
	}
}

// Where the middleware cannot take the connection of a request whose client left (a
// ResponseWriter without Hijack), it answers 499 Client Closed Request: never a busy status
// nor the 200 of a handler that wrote nothing.
func TestClientLeftNoHijack(t *testing.T) {
	g := closing(t, guard.New(memstore.New()))
	held, err := g.Acquire(t.Context(), "account:7")
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release(context.Background()) })
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}", middleware.Lock(g, "account:{id}", guard.WaitTime(requestTimeout))(lockName))
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel) // the client leaves while it waits
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "POST", "/accounts/7", strings.NewReader("{}")))
	require.Equal(t, 499, rec.Code, rec.Body.String())
	assert.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	var p problem
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
	assert.Equal(t, problem{Type: "about:blank", Title: "Client Closed Request", Status: 499,
		Detail: "The client closed the request before the lock on this resource was taken."}, p)
}
