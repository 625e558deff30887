package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
)

// TestMain checks that no goroutine outlives the tests, and removes the etcd they built.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if etcdBuild.dir != "" {
			_ = os.RemoveAll(etcdBuild.dir)
		}
		os.Exit(code)
	}))
}

// clearEnv unsets, for the test, every variable the program reads.
func clearEnv(t *testing.T) {
	for _, env := range []string{"GUARD_REDIS_ADDR", "GUARD_MONGO_URI", "GUARD_ETCD_ENDPOINTS", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(env, "")
	}
}

// serve runs the program with args until the deposit, the withdrawal and the balance of one
// account were answered, shuts it down, and returns its log and what it printed.
func serve(t *testing.T, args ...string) (logs, stdout string) {
	t.Helper()
	var logBuf, out bytes.Buffer // read once run has returned
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-work", "0"}, args...), &out,
			slog.New(slog.NewTextHandler(&logBuf, nil)), func(a net.Addr) { addrs <- a })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logBuf.String())
	}

	client := &http.Client{Transport: &http.Transport{}}
	for _, step := range []struct{ method, path, body string }{
		{http.MethodPost, "/accounts/42/deposit", `{"amount": 100}`},
		{http.MethodPost, "/accounts/%34%32/withdraw", `{"amount": 30}`}, // account 42, spelled otherwise
		{http.MethodGet, "/accounts/42", ""},
	} {
		req, err := http.NewRequestWithContext(t.Context(), step.method, base+step.path, strings.NewReader(step.body))
		require.NoError(t, err)
		req.Header.Set("X-Tenant", "acme")
		res, err := client.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, "%s %s: %s", step.method, step.path, body)
		if step.method == http.MethodGet {
			assert.Contains(t, string(body), `"tenant":"acme","account":"42","balance":70`)
		}
	}
	client.CloseIdleConnections()

	cancel()
	require.NoError(t, <-done, logBuf.String())
	assert.Contains(t, logBuf.String(), "closed: locks released")
	return logBuf.String(), out.String()
}

// With no flags and no environment the program serves on the embedded backend, says so, and
// shuts down cleanly when its context ends.
func TestRunWithoutConfiguration(t *testing.T) {
	clearEnv(t)
	logs, _ := serve(t)
	assert.Contains(t, logs, "lock backend and balances: the embedded in-process backend (memstore)")
	assert.Contains(t, logs, "tracing off")
}

// With -etcd the program locks on etcd and keeps the balances there.
func TestRunOnEtcd(t *testing.T) {
	clearEnv(t)
	addr := startEtcd(t)
	logs, _ := serve(t, "-etcd", addr)
	assert.Contains(t, logs, "lock backend and balances: etcd at "+addr+", keys guard/ (etcdstore)")
	assert.Contains(t, logs, "closed: locks released")
}

// The flags and the environment choose the backend: the program names what it connects to,
// and a server that does not answer stops it at once. (The repository's end-to-end test runs
// the built program on every backend.)
func TestBackendErrors(t *testing.T) {
	clearEnv(t)
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there any more

	for _, tt := range []struct {
		name string
		env  string // GUARD_REDIS_ADDR
		args []string
		want string
	}{
		{"two backends", "", []string{"-redis", nobody, "-mysql", "u@tcp(" + nobody + ")/db"}, "choose one of"},
		{"no Redis", "", []string{"-redis", nobody}, "Redis at " + nobody},
		{"no Redis from the environment", nobody, nil, "Redis at " + nobody},
		{"no PostgreSQL", "", []string{"-postgres", "postgres://u@" + nobody + "/db?connect_timeout=1"}, "PostgreSQL at " + nobody + "/db"},
		{"no MySQL", "", []string{"-mysql", "u@tcp(" + nobody + ")/db?timeout=1s"}, "MySQL at " + nobody + "/db"},
		{"bad MySQL DSN", "", []string{"-mysql", "not a dsn"}, "MySQL DSN"},
		{"no etcd", "", []string{"-etcd", nobody}, "etcd at " + nobody},
		{"no etcd, why", "", []string{"-etcd", nobody}, "last error: dial tcp " + nobody + ": connect: connection refused"},
		{"etcd: empty entries", "", []string{"-etcd", ","}, "endpoint 1 is empty"},
		{"etcd: an empty entry", "", []string{"-etcd", nobody + ","}, "endpoint 2 is empty"},
		{"etcd: no port", "", []string{"-etcd", "garbage"}, "want host:port"},
		{"etcd: colons", "", []string{"-etcd", "::::"}, "want host:port"},
		{"etcd: port out of range", "", []string{"-etcd", "127.0.0.1:99999"}, "a port from 1 to 65535"},
		{"etcd: port not a number", "", []string{"-etcd", "http://127.0.0.1:DEAD"}, "a port from 1 to 65535"},
		{"etcd and Redis", "", []string{"-etcd", nobody, "-redis", nobody}, "choose one of"},
		{"negative wait", "", []string{"-wait", "-1s"}, "-wait must not be negative"},
		{"wait past the write timeout", "", []string{"-wait", "40s"}, "WriteTimeout (30s) would cut a request off"},
		{"wait and work past the write timeout", "", []string{"-wait", "14s", "-work", "2s"}, "-wait 14s and -work 2s add up to more than 15s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GUARD_REDIS_ADDR", tt.env)
			// A program that starts despite the error serves until ctx ends, and returns nil.
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			err := run(ctx, append([]string{"-addr", "127.0.0.1:0"}, tt.args...), io.Discard, slog.New(slog.DiscardHandler), nil)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// A locked route reads its body under the server's ReadTimeout: a client that sends its
// headers and then dribbles the body, or stops, is cut off when ReadTimeout runs out, instead
// of keeping its handler — and the account's lock, with every request on that account behind
// it — for as long as it likes.
func TestSlowBodyIsCutOff(t *testing.T) {
	store, ledger := memstore.New(), &Ledger{}
	g := guard.New(store)
	t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
	short := serverTimeouts
	short.read = 300 * time.Millisecond
	srv := newServer(NewHandler(g, ledger, WithWaitTime(time.Minute)), short)
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		assert.NoError(t, within(srv.Shutdown))
		assert.ErrorIs(t, <-served, http.ErrServerClosed)
	})

	// Headers that promise a body of 16 bytes, and 1 of them.
	conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /accounts/42/deposit HTTP/1.1\r\nHost: x\r\nX-Tenant: acme\r\n"+
		"Content-Length: 16\r\n\r\n{")
	require.NoError(t, err)

	// A request on the same account waits — behind the slow one's lock, if it holds it —
	// and goes through once the slow one is cut off.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+ln.Addr().String()+"/accounts/42/deposit",
		strings.NewReader(`{"amount": 5}`))
	require.NoError(t, err)
	req.Header.Set("X-Tenant", "acme")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode, "%s", body)

	// The slow request got its answer, or its connection closed, without sending the rest.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Minute))) // a bound, should the server never answer
	answer, err := io.ReadAll(conn)
	require.NoError(t, err, "the server left the slow request hanging: %q", answer)
	assert.NotContains(t, string(answer), "200 OK")
	balance, _, err := ledger.Balance(t.Context(), Account{Tenant: "acme", ID: "42"})
	require.NoError(t, err)
	assert.Equal(t, int64(5), balance)
}

// Every timeout of the server is set, and the write timeout leaves room for the request's
// body, its default wait for the lock and its default work.
func TestServerTimeouts(t *testing.T) {
	srv := newServer(http.NotFoundHandler(), serverTimeouts)
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": srv.ReadHeaderTimeout, "ReadTimeout": srv.ReadTimeout,
		"WriteTimeout": srv.WriteTimeout, "IdleTimeout": srv.IdleTimeout,
	} {
		assert.Positive(t, d, name)
	}
	assert.NoError(t, serverTimeouts.checkWait(DefaultWaitTime, 50*time.Millisecond), "the defaults")
	assert.Equal(t, srv.WriteTimeout, srv.ReadTimeout+15*time.Second+writeRoom, "as the comment says")
}

// otlpReceiver is an OTLP/HTTP endpoint that keeps the bodies it receives.
type otlpReceiver struct {
	mu     sync.Mutex // protects bodies
	bodies map[string][]byte
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.bodies[r.URL.Path] = append(o.bodies[r.URL.Path], body...)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
}

// With OTEL_EXPORTER_OTLP_ENDPOINT the program exports its spans, the locks' among them, and
// flushes them when it shuts down.
func TestTracingExportsOverOTLPHTTP(t *testing.T) {
	clearEnv(t)
	recv := &otlpReceiver{bodies: map[string][]byte{}}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	logs, _ := serve(t)
	assert.Contains(t, logs, "tracing: OTLP/HTTP to "+srv.URL+" as service guard-httpapi")
	recv.mu.Lock()
	defer recv.mu.Unlock()
	body := recv.bodies["/v1/traces"]
	assert.True(t, bytes.Contains(body, []byte("guard-httpapi")), "under the service name")
	assert.True(t, bytes.Contains(body, []byte("guard.hold")), "the lock's spans were exported")
}

// With -trace-stdout the program prints a line per span: the request's, and the lock's with
// its attributes.
func TestTraceStdout(t *testing.T) {
	clearEnv(t)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	logs, out := serve(t, "-trace-stdout")
	assert.Contains(t, logs, "tracing: printed to stdout as service guard-httpapi")
	for _, want := range []string{
		" POST /accounts/{id}/deposit ",
		" guard.acquire " + LockTemplate + " ",
		" guard.hold " + LockTemplate + " ",
		" outcome=acquired ", " attempts=1 ", " name=tenant:acme:account:42",
	} {
		assert.Contains(t, out, want)
	}
}
