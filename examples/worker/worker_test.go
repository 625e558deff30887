package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
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

// startRedis starts a redis-server of the test's own on a free loopback port, keeping
// nothing on disk, and returns its address. It is killed when the test ends.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not on PATH (%v): install Redis (apt-get install redis-server, brew install redis); "+
			"the test starts its own on a free port", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if strings.Contains(s.Text(), "Ready to accept connections") {
				ready <- true
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
		ready <- false
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "redis-server on %s exited before it was ready", addr)
	case <-time.After(30 * time.Second):
		t.Fatalf("redis-server on %s was not ready within 30s", addr)
	}
	return addr
}

// small is a demonstration that takes about three seconds: windows of a second leave room for
// the delays of a loaded machine (with 500 ms windows, etcd's fsync-bound requests under -race
// and other tests' load once missed one).
var small = config{instances: 3, windows: 3, window: time.Second, tasks: 12, work: 20 * time.Millisecond}

// backends are the lock backends and journals the tests run on: each call of open returns a
// fresh client to one server (one memstore), as each process has its own.
var backends = []struct {
	name  string
	start func(t *testing.T) (open func(t *testing.T) (guard.Backend, journal))
}{
	{"memstore", func(*testing.T) func(*testing.T) (guard.Backend, journal) {
		store, j := memstore.New(), newMemJournal()
		return func(*testing.T) (guard.Backend, journal) { return store, j }
	}},
	{"redis", func(t *testing.T) func(*testing.T) (guard.Backend, journal) { return redisClients(startRedis(t)) }},
	{"etcd", func(t *testing.T) func(*testing.T) (guard.Backend, journal) { return etcdClients(startEtcd(t)) }},
}

// redisClients returns a function that opens a client of its own to the Redis server at addr,
// closed when the test that opened it ends, and the backend and journal on it.
func redisClients(addr string) func(*testing.T) (guard.Backend, journal) {
	return func(t *testing.T) (guard.Backend, journal) {
		client := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = client.Close() }) // after the Guards: cleanups run last first
		return redisstore.New(client), redisJournal{client}
	}
}

// etcdClients returns a function that opens a client of its own to the etcd member at addr,
// closed when the test that opened it ends, and the backend and journal on it.
func etcdClients(addr string) func(*testing.T) (guard.Backend, journal) {
	return func(t *testing.T) (guard.Backend, journal) {
		client, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		require.NoError(t, err)
		store := etcdstore.New(client)
		t.Cleanup(func() { // after the Guards: cleanups run last first
			assert.NoError(t, store.Close())
			assert.NoError(t, client.Close())
		})
		return store, etcdJournal{client}
	}
}

// demoProcess runs one process's part of a demonstration of cfg on a fresh client from open,
// as process pid, and returns it once its instances are done, with the errors they met.
func demoProcess(t *testing.T, cfg config, open func(*testing.T) (guard.Backend, journal), pid int) (*process, error) {
	store, j := open(t)
	guards := make([]*guard.Guard, cfg.instances)
	for i := range guards {
		g := guard.New(store)
		t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
		guards[i] = g
	}
	r, err := join(t.Context(), guards[0], j, cfg)
	if err != nil {
		return nil, err
	}
	p := newProcess(cfg, r, j, slog.New(slog.DiscardHandler))
	p.pid = pid
	p.demo(t.Context(), guards)
	return p, errors.Join(p.errs...)
}

// verdict waits for the end of p's run and returns its outcome, from the journal.
func verdict(t *testing.T, p *process) outcome {
	t.Helper()
	require.NoError(t, pause(t.Context(), time.Until(p.run.end())))
	events, err := p.j.events(t.Context(), p.run.ID)
	require.NoError(t, err)
	return newOutcome(p.run, events, 0, int64(p.run.Windows))
}

func TestDemo(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			p, err := demoProcess(t, small, b.start(t), 1)
			require.NoError(t, err)
			o := verdict(t, p)
			require.NoError(t, o.check(true))

			jobs, tasks := o.runs(jobRun), o.runs(taskRun)
			assert.Len(t, jobs, small.windows)
			assert.Len(t, tasks, small.tasks)
			assert.Equal(t, int64(small.windows), p.windows.Load())
			assert.Equal(t, int64(small.tasks), p.tasks.Load())
			// Every instance fired the job at every tick: the others found the window taken.
			busy := o.runs(busyJob)
			for k := range int64(small.windows) {
				assert.Len(t, busy[k], small.instances-1, "instances that found window %d taken", k)
			}
			// Fences increase with every acquisition of the job's name.
			for k := int64(1); k < int64(small.windows); k++ {
				assert.Greater(t, jobs[k][0].Fence, jobs[k-1][0].Fence)
			}
		})
	}
}

// Processes that share a server share one run: each runs a part, and the journal, read by
// any of them, has every window and every task exactly once. The processes here are in one
// test, each with its own clients and Guards; the end-to-end test of the repository runs the
// built program as separate processes on every backend.
func TestProcessesShareARun(t *testing.T) {
	for _, b := range backends[1:] { // the servers
		t.Run(b.name, func(t *testing.T) {
			open := b.start(t)
			cfg := small
			cfg.instances = 2
			var wg sync.WaitGroup
			procs := make([]*process, 3)
			errs := make([]error, len(procs))
			for i := range procs {
				wg.Go(func() { procs[i], errs[i] = demoProcess(t, cfg, open, 100+i) })
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			windows, tasks := int64(0), int64(0)
			for _, p := range procs {
				assert.Equal(t, procs[0].run.ID, p.run.ID, "one run")
				windows += p.windows.Load()
				tasks += p.tasks.Load()
			}
			assert.Equal(t, int64(cfg.windows), windows, "windows run, by all processes")
			assert.Equal(t, int64(cfg.tasks), tasks, "tasks run, by all processes")
			o := verdict(t, procs[0])
			require.NoError(t, o.check(true))
			names, _ := o.instances()
			assert.Len(t, names, 6, "instances of all processes")
			assert.Len(t, o.processes(100), 3)
		})
	}
}

// A journal decides each claim and done record on its own, atomically, whoever holds the
// task's lock: of many holders that record one task done at once — without a lock between
// them, as holders whose leases ran out while they worked — exactly one is accepted, the
// one with the highest fence or one that came before it; the others are refused and
// recorded as refused.
func TestJournalRecordsATaskDoneOnce(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			_, j := b.start(t)(t)
			ctx := t.Context()
			require.NoError(t, j.setup(ctx))
			id := "once-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			const tasks, holders = 8, 8
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([][]error, tasks)
			for task := range int64(tasks) {
				errs[task] = make([]error, holders)
				for h := range holders {
					wg.Go(func() {
						<-start
						fence := uint64(h + 1)
						e := event{Instance: fmt.Sprintf("1/%d", h+1), Kind: taskRun, Key: task, Fence: fence, Start: time.Now(), End: time.Now()}
						err := j.claim(ctx, id, task, fence)
						if err == nil {
							err = j.finish(ctx, id, e)
						}
						errs[task][h] = err
					})
				}
			}
			close(start)
			wg.Wait()
			o := newOutcome(runRecord{ID: id, Tasks: tasks, Windows: 1, Window: time.Second}, mustEvents(t, j, id), 0, 0)
			for task := range int64(tasks) {
				accepted := 0
				for _, err := range errs[task] {
					switch {
					case err == nil:
						accepted++
					case !errors.Is(err, errStale) && !errors.Is(err, errDone):
						t.Errorf("task %d: %v", task, err)
					}
				}
				assert.Equal(t, 1, accepted, "task %d: done records accepted", task)
				assert.Len(t, o.runs(taskRun)[task], 1, "task %d: runs in the journal", task)
				done, err := j.done(ctx, id, task)
				require.NoError(t, err)
				assert.True(t, done, "task %d", task)
			}
			require.NoError(t, o.check(false))
		})
	}
}

// What the journals keep comes back as it was; a task is done once its done record is
// accepted, and the fences decide which is.
func TestJournals(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			_, j := b.start(t)(t)
			ctx := t.Context()
			require.NoError(t, j.setup(ctx))
			_, ok, err := j.current(ctx)
			require.NoError(t, err)
			assert.False(t, ok, "no run yet")

			epoch := time.UnixMilli(time.Now().UnixMilli())
			r := runRecord{ID: newRunID(epoch), Epoch: epoch, Windows: 2, Window: time.Second, Tasks: 3}
			require.NoError(t, j.begin(ctx, r))
			got, ok, err := j.current(ctx)
			require.NoError(t, err)
			require.True(t, ok)
			assert.True(t, got.Epoch.Equal(r.Epoch))
			got.Epoch = r.Epoch
			assert.Equal(t, r, got)

			ran := event{Instance: "7/1", Kind: taskRun, Key: 2, Fence: 1 << 40, Start: epoch, End: epoch.Add(time.Millisecond)}
			busy := event{Instance: "7/2", Kind: busyTask, Key: 2, Start: epoch}
			done, err := j.done(ctx, r.ID, 2)
			require.NoError(t, err)
			assert.False(t, done)
			require.NoError(t, j.add(ctx, r.ID, busy))
			// Claims and done records: a lower fence than the last claim's is refused, and
			// so is any claim or record once the task is done — but the same record again.
			require.NoError(t, j.claim(ctx, r.ID, 2, ran.Fence-1))
			require.NoError(t, j.claim(ctx, r.ID, 2, ran.Fence))
			require.NoError(t, j.claim(ctx, r.ID, 2, ran.Fence)) // the same holder again
			assert.ErrorIs(t, j.claim(ctx, r.ID, 2, ran.Fence-1), errStale)
			stale := ran
			stale.Instance, stale.Fence = "7/3", ran.Fence-1
			assert.ErrorIs(t, j.finish(ctx, r.ID, stale), errStale)
			require.NoError(t, j.finish(ctx, r.ID, ran))
			require.NoError(t, j.finish(ctx, r.ID, ran), "a record made again")
			assert.ErrorIs(t, j.claim(ctx, r.ID, 2, ran.Fence+1), errDone)
			late := ran
			late.Instance, late.Fence = "7/4", ran.Fence+1
			assert.ErrorIs(t, j.finish(ctx, r.ID, late), errDone)
			require.NoError(t, j.claim(ctx, "another run", 1, 1))
			require.NoError(t, j.finish(ctx, "another run", event{Instance: "8/1", Kind: taskRun, Key: 1, Fence: 1, Start: epoch, End: epoch}))
			for task, want := range map[int64]bool{1: false, 2: true} {
				done, err := j.done(ctx, r.ID, task)
				require.NoError(t, err)
				assert.Equal(t, want, done, "task %d done", task)
			}
			events, err := j.events(ctx, r.ID)
			require.NoError(t, err)
			require.Len(t, events, 4)
			for _, e := range events {
				want := busy
				switch {
				case e.Kind == taskRun:
					want = ran
				case e.Kind == staleTask && e.Instance == stale.Instance:
					want = stale
					want.Kind = staleTask
				case e.Kind == staleTask:
					want = late
					want.Kind = staleTask
				}
				assert.True(t, want.Start.Equal(e.Start) && want.End.Equal(e.End), "%v", e)
				e.Start, e.End = want.Start, want.End
				assert.Equal(t, want, e)
			}
		})
	}
}

// A process that comes while a run is under way joins it; one with other flags is told; one
// that comes after the run's end starts a new run.
func TestJoin(t *testing.T) {
	store, j := memstore.New(), newMemJournal()
	g := guard.New(store)
	t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
	ctx := t.Context()
	cfg := config{instances: 1, windows: 1, window: 100 * time.Millisecond, tasks: 1}

	first, err := join(ctx, g, j, cfg)
	require.NoError(t, err)
	assert.True(t, first.Epoch.After(time.Now()), "window 0 starts a moment from now")
	second, err := join(ctx, g, j, cfg)
	require.NoError(t, err)
	assert.Equal(t, first, second)
	other := cfg
	other.tasks = 2
	_, err = join(ctx, g, j, other)
	assert.ErrorContains(t, err, "give the same flags")

	require.NoError(t, pause(ctx, time.Until(first.end())))
	third, err := join(ctx, g, j, cfg)
	require.NoError(t, err)
	assert.NotEqual(t, first.ID, third.ID)

	cfg.windows = 0
	forever, err := join(ctx, g, j, cfg)
	require.NoError(t, err)
	assert.Equal(t, "every-100ms-1-0-0", forever.ID)
	assert.Equal(t, time.Unix(0, 0), forever.Epoch)
}

// clearEnv unsets, for the test, every variable the program reads.
func clearEnv(t *testing.T) {
	for _, env := range []string{"GUARD_REDIS_ADDR", "GUARD_MONGO_URI", "GUARD_ETCD_ENDPOINTS", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(env, "")
	}
}

// short is the arguments of a run that takes about a second.
var short = []string{"-windows", "2", "-window", "500ms", "-tasks", "6", "-work", "10ms"}

// The program prints the summary, says OK, and draws a well-formed SVG — on the embedded
// backend and on Redis.
func TestRun(t *testing.T) {
	for _, tt := range []struct {
		name  string
		flags func(t *testing.T) []string
		desc  string
	}{
		{"memstore", func(*testing.T) []string { return nil }, "3 instances on the embedded in-process backend (memstore)"},
		{"redis", func(t *testing.T) []string { return []string{"-redis", startRedis(t)} }, "3 instances on Redis at 127.0.0.1:"},
		{"etcd", func(t *testing.T) []string { return []string{"-etcd", startEtcd(t)} }, "3 instances on etcd at 127.0.0.1:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			svg := filepath.Join(t.TempDir(), "timeline.svg")
			var out, logs bytes.Buffer
			err := run(t.Context(), append(append(short, "-timeline", svg), tt.flags(t)...), &out, slog.New(slog.NewTextHandler(&logs, nil)))
			require.NoError(t, err, "%s\n%s", out.String(), logs.String())
			assert.Contains(t, out.String(), tt.desc)
			assert.Contains(t, out.String(), "instances 1–3: process "+strconv.Itoa(os.Getpid())+" (this one)")
			assert.Contains(t, out.String(), "this process ran 2 of 2 windows and 6 of 6 tasks")
			assert.Contains(t, out.String(), "OK: every window ran exactly once, and every task ran exactly once.")
			assert.Contains(t, logs.String(), "closed: locks released")

			f, err := os.Open(svg)
			require.NoError(t, err)
			defer f.Close()
			requireSVG(t, f)
		})
	}
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
	r := runRecord{ID: "1", Epoch: epoch, Windows: 2, Window: time.Second, Tasks: 2}
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	o := newOutcome(r, []event{
		{Instance: "1/1", Kind: jobRun, Key: 0, Fence: 1, Start: at(0), End: at(100)},
		{Instance: "2/1", Kind: jobRun, Key: 0, Fence: 2, Start: at(600), End: at(700)},
		{Instance: "1/1", Kind: taskRun, Key: 0, Fence: 1, Start: at(0), End: at(50)},
		{Instance: "2/1", Kind: busyTask, Key: 0, Start: at(10)},
		{Instance: "2/1", Kind: taskRun, Key: 1, Fence: 1, Start: at(10), End: at(50)},
		{Instance: "1/1", Kind: taskRun, Key: 1, Fence: 2, Start: at(60), End: at(90)},
	}, 0, 2)

	err := o.check(true)
	require.Error(t, err)
	for _, want := range []string{"window 0 ran 2 times", "window 1 did not run", "task 1 ran 2 times"} {
		assert.ErrorContains(t, err, want)
	}
	// Who ran each, when and under which fence: a run 600 ms into the window, after a 500 ms
	// hold had ended, is a scheduler that fired late, not a lock that failed.
	assert.ErrorContains(t, err, "window 0 ran 2 times (instance 1/1 at +0ms, fence 1; instance 2/1 at +600ms, fence 2)")
	assert.ErrorContains(t, err, "task 1 ran 2 times (instance 2/1 at +10ms, fence 1; instance 1/1 at +60ms, fence 2)")
	assert.NotContains(t, err.Error(), "task 0")
	assert.ErrorContains(t, o.check(false), "window 0 ran 2 times")
	assert.NotContains(t, o.check(false).Error(), "did not run")
	assert.Equal(t, []string{"instance 1: process 1 (this one)", "instance 2: process 2"}, o.processes(1))

	var svg bytes.Buffer
	writeTimeline(&svg, o, config{window: time.Second}, "memstore", true)
	assert.Contains(t, svg.String(), "✗ window 0 ran 2 times; window 1 did not run; task 1 ran 2 times<")
	requireSVG(t, &svg)
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
		{"two backends", []string{"-mongo", "mongodb://127.0.0.1/", "-postgres", "postgres://127.0.0.1/db"}, "choose one of"},
		{"bad PostgreSQL DSN", []string{"-postgres", "postgres://%zz"}, "PostgreSQL DSN"},
		{"bad MongoDB URI", []string{"-mongo", "http://x"}, "MongoDB URI"},
		{"etcd and Redis", []string{"-etcd", "127.0.0.1:2379", "-redis", "127.0.0.1:6379"}, "choose one of"},
		// A dead etcd says why: the last dial's error, not only the timeout.
		{"no etcd", []string{"-etcd", nobody}, "connection refused"},
		// Endpoints that cannot be an etcd's are refused at once.
		{"etcd: empty entries", []string{"-etcd", ","}, "endpoint 1 is empty"},
		{"etcd: an empty entry", []string{"-etcd", nobody + ","}, "endpoint 2 is empty"},
		{"etcd: no port", []string{"-etcd", "garbage"}, "want host:port"},
		{"etcd: colons", []string{"-etcd", "::::"}, "want host:port"},
		{"etcd: port out of range", []string{"-etcd", "127.0.0.1:99999"}, "a port from 1 to 65535"},
		{"etcd: port not a number", []string{"-etcd", "http://127.0.0.1:DEAD"}, "a port from 1 to 65535"},
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
	assert.True(t, bytes.Contains(body, []byte("guard.hold task:{Run}:{ID}")), "the tasks' lock spans were exported")
}

// With -trace-stdout the program prints a line per span, with the lock's attributes.
func TestTraceStdout(t *testing.T) {
	clearEnv(t)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	var out, logs bytes.Buffer
	require.NoError(t, run(t.Context(), append(short, "-trace-stdout"), &out, slog.New(slog.NewTextHandler(&logs, nil))))
	assert.Contains(t, logs.String(), "tracing: printed to stdout as service guard-worker")
	var acquires int
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "span ") && strings.Contains(line, " guard.acquire task:{Run}:{ID} ") {
			acquires++
			assert.Contains(t, line, " attempts=")
			assert.Contains(t, line, " outcome=")
		}
	}
	assert.Positive(t, acquires, "acquire spans printed:\n%s", out.String())
	assert.Contains(t, out.String(), "OK: every window ran exactly once")
}

// A task's done record is fenced. An instance that paused past its lease while it ran a task
// (a long GC pause, a SIGSTOP) and wakes up after another instance took the task over does
// not record it done a second time: the journal refuses the record of the older fence, the
// verdict counts one run of the task and one refused stale record, and says OK.
func TestStaleDoneRecordRefused(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			store, j := b.start(t)(t)
			require.NoError(t, j.setup(ctx))
			// Task 0 takes c.work/2: a second, ample time for the other instance to take it
			// over once the first one's lease of 200 ms ran out.
			cfg := config{instances: 1, windows: 1, window: time.Second, tasks: 1, work: 2 * time.Second}
			r := runRecord{ID: "stale-" + strconv.FormatInt(time.Now().UnixNano(), 36), Epoch: time.Now(), Windows: 1,
				Window: cfg.window, Tasks: 1}
			p := newProcess(cfg, r, j, slog.New(slog.DiscardHandler))
			paused, next := &instance{name: "1/1", p: p}, &instance{name: "2/1", p: p}
			gPaused, gNext := guard.New(store), guard.New(store)
			t.Cleanup(func() { _ = gPaused.Close(context.Background()); _ = gNext.Close(context.Background()) })

			held := make(chan *guard.Lock, 1)
			// The paused instance's process does not see its lease end while it is stopped: it
			// goes on with the task as if it still held the lock.
			stale := decorators.MustFunc(gPaused, taskTemplate, func(ctx context.Context, tk task) (struct{}, error) {
				l, _ := guard.FromContext(ctx)
				held <- l
				return paused.runTask(context.WithoutCancel(ctx), tk)
			}, guard.LeaseTime(200*time.Millisecond))
			next.await = decorators.MustFunc(gNext, taskTemplate, next.runTask, guard.WaitTime(awaitBusy))

			tk := p.batch(0)[0]
			staleDone := make(chan error, 1)
			go func() { _, err := stale(ctx, tk); staleDone <- err }()
			l := <-held
			<-l.Done() // the lease ran out; the other instance takes the task over
			_, err := next.await(ctx, tk)
			require.NoError(t, err)
			<-staleDone

			events, err := j.events(ctx, r.ID)
			require.NoError(t, err)
			o := newOutcome(r, events, 0, 1)
			require.NoError(t, o.check(false)) // no window in this run
			runs := o.runs(taskRun)[0]
			require.Len(t, runs, 1)
			assert.Equal(t, "2/1", runs[0].Instance, "the instance that took the task over")
			assert.Equal(t, int64(1), p.tasks.Load())
			refused := o.runs(staleTask)[0]
			require.Len(t, refused, 1, "the stale record, refused")
			assert.Equal(t, "1/1", refused[0].Instance)
			assert.Less(t, refused[0].Fence, runs[0].Fence)
			assert.Equal(t, int64(1), p.stale.Load())
		})
	}
}

// Runs on one store share no lock: a -forever run of the same window, going on while a
// demonstration runs, takes none of the demonstration's windows or tasks, and the
// demonstration's verdict is that of a run alone.
func TestRunsShareNoLocks(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			open := b.start(t)
			cfg := small
			cfg.tasks, cfg.window = 3, time.Second // windows a loaded machine does not miss
			forever := cfg
			forever.windows = 0
			store, j := open(t)
			g := guard.New(store)
			t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
			ctx, stop := context.WithCancel(t.Context())
			r, err := join(ctx, g, j, forever)
			require.NoError(t, err)
			other := newProcess(forever, r, j, slog.New(slog.DiscardHandler))
			var wg sync.WaitGroup
			wg.Go(func() { other.demo(ctx, []*guard.Guard{g}) })

			p, err := demoProcess(t, cfg, open, 1)
			require.NoError(t, err)
			o := verdict(t, p)
			stop()
			wg.Wait()
			require.NoError(t, o.check(true))
			assert.Equal(t, int64(cfg.windows), p.windows.Load())
		})
	}
}

// failingJournal is a journal whose done records of one task fail, as a store that stops
// answering would.
type failingJournal struct {
	journal
	task int64
}

func (j failingJournal) finish(ctx context.Context, id string, e event) error {
	if e.Key == j.task {
		return errors.New("the store did not answer")
	}
	return j.journal.finish(ctx, id, e)
}

// The verdict tells the run's own errors from the locks' failures: a task that did not run
// because the store failed its done record is reported with that error, not as a task that
// the locks lost, and no task ran twice.
func TestVerdictTellsErrorsApart(t *testing.T) {
	clearEnv(t)
	store, mem := memstore.New(), newMemJournal()
	j := failingJournal{journal: mem, task: 1}
	cfg := small
	cfg.tasks, cfg.windows = 3, 1
	g := guard.New(store)
	t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
	r, err := join(t.Context(), g, j, cfg)
	require.NoError(t, err)
	p := newProcess(cfg, r, j, slog.New(slog.DiscardHandler))
	p.demo(t.Context(), []*guard.Guard{g})
	var out bytes.Buffer
	err = p.verdict(t.Context(), &out, "memstore", "")
	assert.Contains(t, out.String(), "ERRORS of this process")
	assert.Contains(t, out.String(), "task 1: journal: the store did not answer")
	assert.NotContains(t, out.String(), "task 1 did not run")
	assert.NotContains(t, out.String(), "ran 2 times")
	// A loaded machine can make the scheduler miss the window; the tasks do not depend on it.
	if !strings.Contains(out.String(), "FAILED") {
		require.ErrorContains(t, err, "no window and no task ran twice, but this process met errors")
	}
}

// The per-tenant import limit holds across instances: never more tasks of a tenant at once
// than its permits, and the verdict says how many ran at once. One tenant and more instances
// than permits make them contend.
func TestImportLimit(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			cfg := config{instances: 4, windows: 1, window: time.Second, tasks: 8, work: 60 * time.Millisecond, tenants: 1, imports: 2}
			p, err := demoProcess(t, cfg, b.start(t), 1)
			require.NoError(t, err)
			require.True(t, p.limited, "%s ran the tasks without their limit: it grants no shared holds", b.name)
			o := verdict(t, p)
			require.NoError(t, o.check(false))
			assert.Equal(t, 2, o.importsAtOnce()[0], "imports of tenant 0 at once: the limit, reached")
			var out bytes.Buffer
			o.summarize(&out, cfg, b.name, 1)
			assert.Contains(t, out.String(), "at most 2 of a tenant at once")
		})
	}
}

// Every instance campaigns for the maintenance loop: one leads at a time, its rounds carry
// its term's fence, and when it resigns another takes over with a higher one.
func TestMaintenanceElection(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			open := b.start(t)
			cfg := config{instances: 2, windows: 1, window: 200 * time.Millisecond, tasks: 0}
			store, j := open(t)
			r := runRecord{ID: "maint-" + strconv.FormatInt(time.Now().UnixNano(), 36), Epoch: time.Now(), Windows: 1, Window: cfg.window}
			p := newProcess(cfg, r, j, slog.New(slog.DiscardHandler))
			ctxs := make([]context.CancelFunc, 3)
			var wg sync.WaitGroup
			for i := range ctxs {
				g := guard.New(store)
				t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
				in := &instance{name: fmt.Sprintf("1/%d", i+1), p: p, g: g}
				ctx, cancel := context.WithCancel(t.Context())
				ctxs[i] = cancel
				wg.Go(func() { in.maintain(ctx, i == 0) })
			}
			rounds := func() []event {
				events, err := j.events(t.Context(), r.ID)
				require.NoError(t, err)
				var m []event
				for _, e := range newOutcome(r, events, 0, 1<<40).events {
					if e.Kind == maintenance {
						m = append(m, e)
					}
				}
				return m
			}
			require.Eventually(t, func() bool { return len(rounds()) >= 2 }, 10*time.Second, 20*time.Millisecond)
			first := rounds()[0]
			var leader int
			_, err := fmt.Sscanf(first.Instance, "1/%d", &leader)
			require.NoError(t, err)
			ctxs[leader-1]() // the leader stops: it resigns, and another takes over
			require.Eventually(t, func() bool {
				m := rounds()
				return m[len(m)-1].Fence > first.Fence
			}, 10*time.Second, 20*time.Millisecond, "a new leader, with a higher fence")
			for _, cancel := range ctxs {
				cancel()
			}
			wg.Wait()
			o := newOutcome(r, mustEvents(t, j, r.ID), 0, 1<<40)
			require.NoError(t, o.checkTerms())
			assert.Empty(t, p.errs)
		})
	}
}

func mustEvents(t *testing.T, j journal, id string) []event {
	events, err := j.events(t.Context(), id)
	require.NoError(t, err)
	return events
}

// check fails a run in which a tenant ran more imports at once than its permits, or a round
// of maintenance by an older term came after one by a newer term.
func TestCheckFailsLimits(t *testing.T) {
	epoch := time.Now()
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	r := runRecord{ID: "1", Epoch: epoch, Windows: 2, Window: time.Second, Tasks: 6, Tenants: 2, Imports: 2}
	o := newOutcome(r, []event{
		{Instance: "1/1", Kind: taskRun, Key: 0, Fence: 1, Start: at(0), End: at(100)},
		{Instance: "1/2", Kind: taskRun, Key: 2, Fence: 1, Start: at(10), End: at(100)},
		{Instance: "2/1", Kind: taskRun, Key: 4, Fence: 1, Start: at(99), End: at(200)},  // the third of tenant 0 at once
		{Instance: "2/2", Kind: taskRun, Key: 1, Fence: 1, Start: at(0), End: at(200)},   // tenant 1
		{Instance: "2/2", Kind: taskRun, Key: 3, Fence: 1, Start: at(200), End: at(300)}, // after the one before it
		{Instance: "1/1", Kind: maintenance, Key: 0, Fence: 5, Start: at(0)},
		{Instance: "2/1", Kind: maintenance, Key: 0, Fence: 7, Start: at(300)},
		{Instance: "1/1", Kind: maintenance, Key: 1, Fence: 5, Start: at(600)},
	}, 0, 2)
	assert.Equal(t, map[int64]int{0: 3, 1: 1}, o.importsAtOnce())
	err := o.check(false)
	for _, want := range []string{"tenant 0 ran 3 imports at once, more than its 2 permits",
		"instance 1/1 ran a round with term fence 5 after instance 2/1 ran one with fence 7: two leaders at once"} {
		assert.ErrorContains(t, err, want)
	}
	assert.NotContains(t, err.Error(), "tenant 1")
}

// The verdict's last word names what failed: a run whose windows and tasks all ran exactly
// once, but whose tenant ran more imports at once than its permits, fails for the permits —
// not for "a window or a task" that did not run exactly once.
func TestVerdictNamesTheFailure(t *testing.T) {
	clearEnv(t)
	epoch := time.Now().Add(-time.Minute) // a run that has ended
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	r := runRecord{ID: "overrun", Epoch: epoch, Windows: 1, Window: time.Second, Tasks: 3, Tenants: 1, Imports: 2}
	j := newMemJournal()
	require.NoError(t, j.begin(t.Context(), r))
	for _, e := range []event{
		{Instance: "1/1", Kind: jobRun, Key: 0, Fence: 1, Start: at(0), End: at(10)},
		{Instance: "1/1", Kind: taskRun, Key: 0, Fence: 1, Start: at(0), End: at(100)},
		{Instance: "1/2", Kind: taskRun, Key: 1, Fence: 1, Start: at(10), End: at(100)},
		{Instance: "2/1", Kind: taskRun, Key: 2, Fence: 1, Start: at(50), End: at(200)}, // the third at once
	} {
		require.NoError(t, j.add(t.Context(), r.ID, e))
	}
	p := newProcess(config{instances: 1, windows: 1, window: time.Second, tasks: 3, tenants: 1, imports: 2}, r, j,
		slog.New(slog.DiscardHandler))
	p.limited = true
	var out bytes.Buffer
	err := p.verdict(t.Context(), &out, "memstore", "")
	assert.Contains(t, out.String(), "tenant 0 ran 3 imports at once, more than its 2 permits")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more imports at once than its permits")
	assert.NotContains(t, err.Error(), "did not run exactly once")
}
