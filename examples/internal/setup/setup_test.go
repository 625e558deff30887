package setup

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clearEnv unsets every variable this package reads, for the test.
func clearEnv(t *testing.T) {
	for _, env := range Variables() {
		t.Setenv(env, "")
	}
}

// open parses args as a program's flags and opens the backend they select.
func open(t *testing.T, args ...string) (guard.Backend, string, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	b := BackendFlags(fs)
	require.NoError(t, fs.Parse(args))
	backend, desc, disconnect, err := b.Open(t.Context())
	if err == nil {
		t.Cleanup(func() { assert.NoError(t, disconnect(context.Background())) })
	}
	return backend, desc, err
}

// lockOnce checks that a Guard on backend can take and give back a lock.
func lockOnce(t *testing.T, backend guard.Backend) {
	t.Helper()
	g := guard.New(backend)
	defer func() { assert.NoError(t, g.Close(context.Background())) }()
	l, err := g.TryAcquire(t.Context(), "setup:test")
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
}

func TestBackendDefaultIsInProcess(t *testing.T) {
	clearEnv(t)
	backend, desc, err := open(t)
	require.NoError(t, err)
	assert.IsType(t, &memstore.Store{}, backend)
	assert.Contains(t, desc, "embedded in-process backend (memstore)")
	lockOnce(t, backend)
}

func TestBackendRedis(t *testing.T) {
	clearEnv(t)
	srv := testserver.StartRedis(t)
	t.Run("flag", func(t *testing.T) {
		backend, desc, err := open(t, "-redis", srv.Addr)
		require.NoError(t, err)
		assert.IsType(t, &redisstore.Store{}, backend)
		assert.Equal(t, "Redis at "+srv.Addr+" (redisstore)", desc)
		lockOnce(t, backend)
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv(RedisEnv, srv.Addr)
		backend, _, err := open(t)
		require.NoError(t, err)
		assert.IsType(t, &redisstore.Store{}, backend)
	})
	t.Run("no server", func(t *testing.T) {
		ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // nothing listens there any more
		_, _, err = open(t, "-redis", addr)
		assert.ErrorContains(t, err, "Redis at "+addr)
	})
}

func TestBackendMongo(t *testing.T) {
	clearEnv(t)
	srv := testserver.StartMongo(t)
	u, err := url.Parse(srv.URI)
	require.NoError(t, err, "a single-host URI")
	u.Path = "/" + srv.Database
	backend, desc, err := open(t, "-mongo", u.String())
	require.NoError(t, err)
	assert.IsType(t, &mongostore.Store{}, backend)
	assert.Contains(t, desc, "collection "+srv.Database+".locks")
	lockOnce(t, backend)
}

func TestBackendBoth(t *testing.T) {
	clearEnv(t)
	t.Setenv(MongoEnv, "mongodb://127.0.0.1/")
	_, _, err := open(t, "-redis", "127.0.0.1:6379")
	assert.ErrorContains(t, err, "not both")
}

func TestTracingOff(t *testing.T) {
	clearEnv(t)
	shutdown, desc, err := Tracing(t.Context(), "guard-test")
	require.NoError(t, err)
	assert.Contains(t, desc, "tracing off")
	assert.NoError(t, shutdown(t.Context()))
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

func TestTracingExportsOverOTLPHTTP(t *testing.T) {
	clearEnv(t)
	recv := &otlpReceiver{bodies: map[string][]byte{}}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	t.Setenv(EndpointEnv, srv.URL)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	shutdown, desc, err := Tracing(t.Context(), "guard-test")
	require.NoError(t, err)
	assert.Equal(t, "tracing: OTLP/HTTP to "+srv.URL+" as service guard-test", desc)
	_, span := otel.Tracer("test").Start(t.Context(), "the-span")
	span.End()
	require.NoError(t, shutdown(t.Context())) // flushes

	recv.mu.Lock()
	defer recv.mu.Unlock()
	body := recv.bodies["/v1/traces"]
	assert.True(t, bytes.Contains(body, []byte("the-span")), "the span was exported")
	assert.True(t, bytes.Contains(body, []byte("guard-test")), "under the service name")
}

// Close releases the locks of the program's Guards.
func TestProgramCloseReleases(t *testing.T) {
	clearEnv(t)
	p, err := Start(t.Context(), "guard-test", Backend{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	l, err := p.Guard().TryAcquire(t.Context(), "setup:held")
	require.NoError(t, err)
	require.NoError(t, p.Close())
	<-l.Done()
	assert.ErrorIs(t, context.Cause(l.Context()), guard.ErrClosed)
}
