// Package e2e runs guard end to end against real servers: here, lock telemetry exported over
// OTLP/HTTP to a real Jaeger and read back from Jaeger's query API.
package e2e

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/tracing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// service is the service.name the test's spans are exported under.
const service = "guard-e2e"

// requestSpan is the name of the span each request of the traffic runs in: the parent of
// the lock's acquire and hold spans.
const requestSpan = "request"

// traffic sends requests that contend for one lock, each in a root span called requestSpan,
// with spans from tp (for the locks: tracing.New(tracing.WithTracerProvider(tp))), and returns
// what Jaeger should show once they are exported. It is the part of the test to swap for
// another entry point (a decorator, an HTTP handler behind the middleware).
type traffic func(t *testing.T, tp trace.TracerProvider) expected

// expected is what a traffic run must leave in Jaeger.
type expected struct {
	requests int            // request spans
	outcomes map[string]int // acquire spans by guard.lock.outcome
	waited   int            // acquire spans that waited and were woken by a release, at least
	label    string         // the lock's label: span names end with it
	backend  string         // the guard.lock.backend attribute
}

func TestJaeger(t *testing.T) {
	begin := time.Now()
	j := testserver.StartJaeger(t)
	t.Logf("jaeger ready in %v: OTLP on %s, query on %s", time.Since(begin).Round(time.Millisecond), j.OTLPEndpoint, j.QueryURL)

	ctx := t.Context()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(j.OTLPEndpoint), otlptracehttp.WithInsecure())
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, tp.Shutdown(sctx))
	})

	since := time.Now()
	run := contendInProcess
	want := run(t, tp)
	require.NoError(t, tp.ForceFlush(ctx))
	exported := time.Now()

	acquireName, holdName, releaseName := "guard.acquire "+want.label, "guard.hold "+want.label, "guard.release "+want.label
	wantAcquires := 0
	for _, n := range want.outcomes {
		wantAcquires += n
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	spans, err := j.WaitSpans(wctx, service, since, func(spans []testserver.Span) bool {
		n := count(spans)
		return n[requestSpan] >= want.requests && n[acquireName] >= wantAcquires &&
			n[releaseName] >= want.outcomes["acquired"]
	})
	require.NoError(t, err, "spans found: %v", count(spans))
	t.Logf("%d spans in Jaeger %v after the flush, %v after start: %v",
		len(spans), time.Since(exported).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), count(spans))

	byID := make(map[string]testserver.Span, len(spans))
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	parent := func(s testserver.Span) testserver.Span {
		t.Helper()
		p, ok := byID[s.ParentSpanID]
		require.True(t, ok, "span %s %q: parent %q not found", s.SpanID, s.Name, s.ParentSpanID)
		require.Equal(t, s.TraceID, p.TraceID)
		return p
	}

	outcomes := map[string]int{}
	waited := 0
	var holds []testserver.Span
	for _, s := range spans {
		assert.Equal(t, service, s.Service)
		switch s.Name {
		case acquireName:
			outcome, _ := s.Attributes[string(tracing.OutcomeKey)].(string)
			outcomes[outcome]++
			wait, ok := s.Attributes[string(tracing.WaitKey)].(float64)
			assert.True(t, ok, "acquire span has a wait: %v", s.Attributes)
			wakeups, _ := s.Attributes[string(tracing.WakeupsKey)].(int64)
			if wait > 0 && wakeups >= 1 {
				waited++
			}
			assert.Equal(t, want.label, s.Attributes[string(tracing.LabelKey)])
			assert.Equal(t, want.backend, s.Attributes[string(tracing.BackendKey)])
			assert.Equal(t, requestSpan, parent(s).Name, "acquire span's parent")
		case holdName:
			holds = append(holds, s)
			assert.Equal(t, requestSpan, parent(s).Name, "hold span's parent")
			_, fenced := s.Attributes[string(tracing.FenceKey)].(int64)
			assert.True(t, fenced, "hold span has the fence: %v", s.Attributes)
		case releaseName:
			assert.Equal(t, holdName, parent(s).Name, "release span's parent")
			assert.NotEqual(t, "error", s.Status, "release status: %s", s.StatusMessage)
		case "work":
			assert.Equal(t, holdName, parent(s).Name, "locked work's parent")
		}
	}
	assert.Equal(t, want.outcomes, outcomes, "acquire spans by outcome")
	assert.GreaterOrEqual(t, waited, want.waited, "acquire spans that waited and were woken")
	assert.Len(t, holds, want.outcomes["acquired"])

	// The locked sections of one name never overlap: each hold starts after the work under
	// the previous one ended.
	sort.Slice(holds, func(a, b int) bool { return holds[a].Start.Before(holds[b].Start) })
	work := map[string]testserver.Span{} // by parent hold span
	for _, s := range spans {
		if s.Name == "work" {
			work[s.ParentSpanID] = s
		}
	}
	for i := 1; i < len(holds); i++ {
		prev, ok := work[holds[i-1].SpanID]
		require.True(t, ok, "hold span %s has a work span", holds[i-1].SpanID)
		assert.False(t, holds[i].Start.Before(prev.End), "hold %d starts at %v, before the work under hold %d ended at %v",
			i, holds[i].Start, i-1, prev.End)
	}
}

// count returns how many spans there are of each name.
func count(spans []testserver.Span) map[string]int {
	n := map[string]int{}
	for _, s := range spans {
		n[s.Name]++
	}
	return n
}

// contendInProcess is traffic through Guard.Do: three instances of a service (three Guards
// on one shared memstore) run nine requests on one lock name, so that all but one wait, plus
// two requests that find it busy and give up at once. The first request holds the lock until
// every other has been told it is busy and has parked waiting for a release.
func contendInProcess(t *testing.T, tp trace.TracerProvider) expected {
	const (
		instances   = 3
		requests    = 9
		busy        = 2
		label       = "invoice:{id}"
		name        = "invoice:42"
		workingTime = 5 * time.Millisecond
	)
	tracer := tp.Tracer("github.com/guardlock/guard/internal/e2e")
	obs := tracing.New(tracing.WithTracerProvider(tp))
	store := &spy{Store: memstore.New(), busy: make(chan struct{}, 2*requests+busy)}
	guards := make([]*guard.Guard, instances)
	for i := range guards {
		guards[i] = guard.New(store, guard.WithObserver(obs))
	}
	t.Cleanup(func() {
		for _, g := range guards {
			assert.NoError(t, g.Close(context.Background()))
		}
	})

	// request runs one request on instance i: its span, the lock, the work under it.
	request := func(i int, acquire func(ctx context.Context, g *guard.Guard) (*guard.Lock, error), work func(context.Context)) error {
		ctx, span := tracer.Start(context.Background(), requestSpan,
			trace.WithAttributes(attribute.Int("request.instance", i%instances)))
		defer span.End()
		l, err := acquire(ctx, guards[i%instances])
		if err != nil {
			span.RecordError(err)
			return err
		}
		wctx, ws := tracer.Start(l.Context(), "work")
		work(wctx)
		ws.End()
		return l.Release(ctx)
	}
	wait := func(ctx context.Context, g *guard.Guard) (*guard.Lock, error) {
		return g.Acquire(ctx, name, guard.Label(label))
	}
	sleep := func(context.Context) { time.Sleep(workingTime) } // stands for the work

	// The first request takes the lock and holds it until the others are parked.
	granted, unblock := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- request(0, wait, func(context.Context) { close(granted); <-unblock })
	}()
	<-granted

	// Two requests find it busy and give up.
	for i := range busy {
		err := request(i+1, func(ctx context.Context, g *guard.Guard) (*guard.Lock, error) {
			return g.TryAcquire(ctx, name, guard.Label(label))
		}, sleep)
		require.ErrorIs(t, err, guard.ErrNotAcquired)
	}
	for range busy {
		<-store.busy
	}

	// The rest wait. Each is parked once it was told "busy" twice: once before it asked for
	// release notifications, once after.
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for i := 1; i < requests; i++ {
		wg.Go(func() { errs <- request(i, wait, sleep) })
	}
	for range 2 * (requests - 1) {
		<-store.busy
	}
	close(unblock)
	require.NoError(t, <-firstDone)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return expected{
		requests: requests + busy,
		outcomes: map[string]int{"acquired": requests, "busy": busy},
		waited:   requests - 1,
		label:    label,
		backend:  "e2e", // the spy's package
	}
}

// spy wraps a store and reports busy answers to Acquire, so that the traffic knows when its
// waiters are parked without sleeping. Make busy large enough for the answers counted. Embedding *memstore.Store keeps its release
// notifications.
type spy struct {
	*memstore.Store
	busy chan struct{} // one value per busy answer; buffered
}

func (s *spy) Acquire(ctx context.Context, name, token string, ttl time.Duration) (uint64, error) {
	fence, err := s.Store.Acquire(ctx, name, token, ttl)
	if errors.Is(err, guard.ErrNotAcquired) {
		select {
		case s.busy <- struct{}{}:
		default: // once the waiters are parked, nobody counts any more
		}
	}
	return fence, err
}
