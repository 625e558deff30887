package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/guardlock/guard/internal/testserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clearEnv unsets, for the test, every variable the program reads.
func clearEnv(t *testing.T) {
	for _, env := range []string{"GUARD_REDIS_ADDR", "GUARD_MONGO_URI", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(env, "")
	}
}

// serve runs the program with args until the deposit, the withdrawal and the balance of one
// account were answered, shuts it down, and returns its log.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	var logs bytes.Buffer // read once run has returned
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-work", "0"}, args...),
			slog.New(slog.NewTextHandler(&logs, nil)), func(a net.Addr) { addrs <- a })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs.String())
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
			// The fence of a store that keeps rows per name (SQL) or counts per name starts
			// anywhere: it only increases.
			assert.Contains(t, string(body), `"tenant":"acme","account":"42","balance":70`)
		}
	}
	client.CloseIdleConnections()

	cancel()
	require.NoError(t, <-done, logs.String())
	out := logs.String()
	assert.Contains(t, out, "closed: locks released")
	return out
}

// With no flags and no environment the program serves on the embedded backend, says so, and
// shuts down cleanly when its context ends.
func TestRunWithoutConfiguration(t *testing.T) {
	clearEnv(t)
	out := serve(t)
	assert.Contains(t, out, "lock backend: the embedded in-process backend (memstore)")
	assert.Contains(t, out, "tracing off")
}

// Each backend flag makes the program lock on that server, which the test starts.
func TestRunOnServers(t *testing.T) {
	tests := []struct {
		name  string
		flags func(t *testing.T) []string
		desc  string
	}{
		{"redis", func(t *testing.T) []string {
			return []string{"-redis", testserver.StartRedis(t).Addr}
		}, "lock backend: Redis at 127.0.0.1:"},
		{"mongo", func(t *testing.T) []string {
			srv := testserver.StartMongo(t)
			u, err := url.Parse(srv.URI)
			require.NoError(t, err, "a single-host URI")
			u.Path = "/" + srv.Database
			return []string{"-mongo", u.String()}
		}, "lock backend: MongoDB at "},
		{"postgres", func(t *testing.T) []string {
			return []string{"-postgres", testserver.StartPostgresServer(t).DSN}
		}, "lock backend: PostgreSQL at 127.0.0.1:"},
		{"mysql", func(t *testing.T) []string {
			return []string{"-mysql", testserver.StartMariaDB(t).DSN}
		}, "lock backend: MySQL at 127.0.0.1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			out := serve(t, tt.flags(t)...)
			assert.Contains(t, out, tt.desc)
			assert.NotContains(t, out, "in-process")
		})
	}
	t.Run("environment", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("GUARD_REDIS_ADDR", testserver.StartRedis(t).Addr)
		assert.Contains(t, serve(t), "lock backend: Redis at 127.0.0.1:")
	})
}

func TestBackendErrors(t *testing.T) {
	clearEnv(t)
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there any more

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"two backends", []string{"-redis", nobody, "-mysql", "u@tcp(" + nobody + ")/db"}, "choose one of"},
		{"no Redis", []string{"-redis", nobody}, "Redis at " + nobody},
		{"no PostgreSQL", []string{"-postgres", "postgres://u@" + nobody + "/db?connect_timeout=1"}, "PostgreSQL at " + nobody + "/db"},
		{"no MySQL", []string{"-mysql", "u@tcp(" + nobody + ")/db?timeout=1s"}, "MySQL at " + nobody + "/db"},
		{"bad MySQL DSN", []string{"-mysql", "not a dsn"}, "MySQL DSN"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := run(t.Context(), append([]string{"-addr", "127.0.0.1:0"}, tt.args...), slog.New(slog.DiscardHandler), nil)
			assert.ErrorContains(t, err, tt.want)
		})
	}
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

	out := serve(t)
	assert.Contains(t, out, "tracing: OTLP/HTTP to "+srv.URL+" as service guard-httpapi")
	recv.mu.Lock()
	defer recv.mu.Unlock()
	body := recv.bodies["/v1/traces"]
	assert.True(t, bytes.Contains(body, []byte("guard-httpapi")), "under the service name")
	assert.True(t, bytes.Contains(body, []byte("guard.hold")), "the lock's spans were exported")
}
