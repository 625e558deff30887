package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/examples/internal/setup"
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

// The program prints the summary, says OK, and draws a well-formed SVG.
func TestRun(t *testing.T) {
	for _, env := range setup.Variables() {
		t.Setenv(env, "")
	}
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
