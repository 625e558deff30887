package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// small is a demonstration that takes about a second.
var small = config{instances: 3, windows: 3, window: 300 * time.Millisecond, tasks: 12, work: 20 * time.Millisecond}

func TestDemo(t *testing.T) {
	backends := []struct {
		name string
		new  func(t *testing.T) guard.Backend
	}{
		{"memstore", func(*testing.T) guard.Backend { return memstore.New() }},
		{"redis", func(t *testing.T) guard.Backend {
			client := redis.NewClient(&redis.Options{Addr: testserver.StartRedis(t).Addr})
			t.Cleanup(func() { _ = client.Close() })
			return redisstore.New(client)
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			backend := b.new(t)
			rec := demo(t.Context(), small, func() *guard.Guard {
				g := guard.New(backend)
				t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
				return g
			}, slog.New(slog.DiscardHandler))
			require.NoError(t, rec.check(true))

			events, errs := rec.snapshot()
			require.Empty(t, errs)
			jobs, tasks := runs(events, jobRun), runs(events, taskRun)
			for k := range small.windows {
				assert.Len(t, jobs[k], 1, "window %d", k)
			}
			assert.Len(t, jobs, small.windows)
			for id := range small.tasks {
				assert.Len(t, tasks[id], 1, "task %d", id)
			}
			assert.Len(t, tasks, small.tasks)
			// Every instance fired the job at every tick: the others found the window taken.
			busy := runs(events, busyJob)
			for k := range small.windows {
				assert.Len(t, busy[k], small.instances-1, "instances that found window %d taken", k)
			}
			// Fences increase with every acquisition of the job's name.
			for k := 1; k < small.windows; k++ {
				assert.Greater(t, jobs[k][0].fence, jobs[k-1][0].fence)
			}
		})
	}
}

// clearEnv unsets, for the test, every variable the program reads.
func clearEnv(t *testing.T) {
	for _, env := range []string{"GUARD_REDIS_ADDR", "GUARD_MONGO_URI", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(env, "")
	}
}

// The program prints the summary, says OK, and draws a well-formed SVG.
func TestRun(t *testing.T) {
	clearEnv(t)
	svg := filepath.Join(t.TempDir(), "timeline.svg")
	var out bytes.Buffer
	err := run(t.Context(), []string{"-windows", "2", "-window", "200ms", "-tasks", "6", "-work", "10ms", "-timeline", svg},
		&out, slog.New(slog.DiscardHandler))
	require.NoError(t, err, out.String())
	assert.Contains(t, out.String(), "3 instances on the embedded in-process backend (memstore)")
	assert.Contains(t, out.String(), "OK: every window ran exactly once, and every task ran exactly once.")

	f, err := os.Open(svg)
	require.NoError(t, err)
	defer f.Close()
	requireSVG(t, f)
}

// requireSVG checks that r holds well-formed XML whose root is an svg element.
func requireSVG(t *testing.T, r io.Reader) {
	t.Helper()
	dec := xml.NewDecoder(r)
	var root string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
			assert.Equal(t, "http://www.w3.org/2000/svg", se.Name.Space)
		}
	}
	assert.Equal(t, "svg", root)
}

// check fails a run in which a window or a task ran twice, or not at all, and the timeline
// says so.
func TestCheckFails(t *testing.T) {
	epoch := time.Now()
	rec := &record{cfg: config{instances: 2, windows: 2, window: time.Second, tasks: 2}, epoch: epoch}
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	rec.add(event{instance: 1, kind: jobRun, key: 0, fence: 1, start: at(0), end: at(100)})
	rec.add(event{instance: 2, kind: jobRun, key: 0, fence: 2, start: at(600), end: at(700)})
	rec.add(event{instance: 1, kind: taskRun, key: 0, fence: 1, start: at(0), end: at(50)})
	rec.add(event{instance: 2, kind: busyTask, key: 0, start: at(10)})
	rec.add(event{instance: 2, kind: taskRun, key: 1, fence: 1, start: at(10), end: at(50)})
	rec.add(event{instance: 1, kind: taskRun, key: 1, fence: 2, start: at(60), end: at(90)})

	err := rec.check(true)
	require.Error(t, err)
	for _, want := range []string{"window 0 ran 2 times", "window 1 did not run", "task 1 ran 2 times"} {
		assert.ErrorContains(t, err, want)
	}
	assert.NotContains(t, err.Error(), "task 0")
	assert.ErrorContains(t, rec.check(false), "window 0 ran 2 times")
	assert.NotContains(t, rec.check(false).Error(), "did not run")

	var svg bytes.Buffer
	writeTimeline(&svg, rec, "memstore")
	assert.Contains(t, svg.String(), "✗ window 0 ran 2 times")
	requireSVG(t, &svg)
}

// short is the arguments of a run that takes about half a second.
var short = []string{"-windows", "2", "-window", "200ms", "-tasks", "6", "-work", "10ms"}

// Each backend flag makes the program run its instances on that server, which the test starts.
func TestRunOnServers(t *testing.T) {
	tests := []struct {
		name  string
		flags func(t *testing.T) []string
		desc  string
	}{
		{"redis", func(t *testing.T) []string {
			return []string{"-redis", testserver.StartRedis(t).Addr}
		}, "3 instances on Redis at 127.0.0.1:"},
		{"mongo", func(t *testing.T) []string {
			srv := testserver.StartMongo(t)
			u, err := url.Parse(srv.URI)
			require.NoError(t, err, "a single-host URI")
			u.Path = "/" + srv.Database
			return []string{"-mongo", u.String()}
		}, "3 instances on MongoDB at "},
		{"postgres", func(t *testing.T) []string {
			return []string{"-postgres", testserver.StartPostgresServer(t).DSN}
		}, "3 instances on PostgreSQL at 127.0.0.1:"},
		{"mysql", func(t *testing.T) []string {
			return []string{"-mysql", testserver.StartMariaDB(t).DSN}
		}, "3 instances on MySQL at 127.0.0.1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			var out, logs bytes.Buffer
			err := run(t.Context(), append(short, tt.flags(t)...), &out, slog.New(slog.NewTextHandler(&logs, nil)))
			require.NoError(t, err, "%s\n%s", out.String(), logs.String())
			assert.Contains(t, out.String(), tt.desc)
			assert.Contains(t, out.String(), "OK: every window ran exactly once, and every task ran exactly once.")
			assert.Contains(t, logs.String(), "closed: locks released")
		})
	}
}

func TestBackendErrors(t *testing.T) {
	clearEnv(t)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"two backends", []string{"-mongo", "mongodb://127.0.0.1/", "-postgres", "postgres://127.0.0.1/db"}, "choose one of"},
		{"bad PostgreSQL DSN", []string{"-postgres", "postgres://%zz"}, "PostgreSQL DSN"},
		{"bad MongoDB URI", []string{"-mongo", "http://x"}, "MongoDB URI"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := run(t.Context(), append(short, tt.args...), io.Discard, slog.New(slog.DiscardHandler))
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

// With OTEL_EXPORTER_OTLP_ENDPOINT the program exports the spans of its locks, and flushes
// them before it exits.
func TestTracingExportsOverOTLPHTTP(t *testing.T) {
	clearEnv(t)
	recv := &otlpReceiver{bodies: map[string][]byte{}}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	var logs bytes.Buffer
	require.NoError(t, run(t.Context(), short, io.Discard, slog.New(slog.NewTextHandler(&logs, nil))))
	assert.Contains(t, logs.String(), "tracing: OTLP/HTTP to "+srv.URL+" as service guard-worker")
	recv.mu.Lock()
	defer recv.mu.Unlock()
	body := recv.bodies["/v1/traces"]
	assert.True(t, bytes.Contains(body, []byte("guard-worker")), "under the service name")
	assert.True(t, bytes.Contains(body, []byte("guard.hold task:{ID}")), "the tasks' lock spans were exported")
}
