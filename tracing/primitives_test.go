package tracing_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/tracing"
)

var (
	kindPermit = tracing.KindKey.String("permit")
	kindRead   = tracing.KindKey.String("read")
	kindWrite  = tracing.KindKey.String("write")
	kindTerm   = tracing.KindKey.String("term")
)

// spansCalled returns the ended spans called name.
func spansCalled(tel *telemetry, name string) []sdktrace.ReadOnlySpan {
	var found []sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	return found
}

// TestSemaphoreTelemetry: a permit's spans say its kind and the semaphore's permits, and
// guard.lock.permits.used counts the permits held — down at release and at loss.
func TestSemaphoreTelemetry(t *testing.T) {
	tel := newTelemetry(t)
	store := memstore.New()
	g := newGuard(t, store, tel.observer(), guard.WithWatchdogTimeout(60*time.Millisecond))
	sem, err := g.Semaphore("imports:acme", 3)
	require.NoError(t, err)
	lbl := tracing.LabelKey.String("imports:{tenant}")
	p1, err := sem.Acquire(t.Context(), guard.Label("imports:{tenant}"))
	require.NoError(t, err)
	p2, err := sem.Acquire(t.Context(), guard.Label("imports:{tenant}"))
	require.NoError(t, err)

	rm := tel.collect(t)
	assert.Equal(t, int64(2), counter(t, rm, "guard.lock.permits.used", lbl, backendMem, kindPermit, tracing.PermitsKey.Int(3)))
	assert.Equal(t, int64(2), counter(t, rm, "guard.lock.held", lbl, kindPermit))
	assert.Equal(t, int64(2), counter(t, rm, "guard.lock.acquisitions", lbl, kindPermit, tracing.OutcomeKey.String("acquired")))
	assert.Equal(t, int64(0), counter(t, rm, "guard.lock.readers"))

	require.NoError(t, p1.Release(t.Context()))
	acquires := spansCalled(tel, "guard.acquire imports:{tenant}")
	require.Len(t, acquires, 2)
	for _, s := range append(acquires, tel.span(t, "guard.hold imports:{tenant}"), tel.span(t, "guard.release imports:{tenant}")) {
		assert.Equal(t, "permit", requireAttr(t, s, tracing.KindKey).AsString(), s.Name())
		assert.Equal(t, int64(3), requireAttr(t, s, tracing.PermitsKey).AsInt64(), s.Name())
	}
	assert.Equal(t, int64(1), counter(t, tel.collect(t), "guard.lock.permits.used", lbl))

	// The backend forgets p2: its loss gives the permit back in the count.
	require.NoError(t, store.ForceRelease(t.Context(), "imports:acme", p2.Fence()))
	<-p2.Done()
	require.ErrorIs(t, p2.Err(), guard.ErrLockLost)
	assert.Eventually(t, func() bool {
		return counter(t, tel.collect(t), "guard.lock.permits.used", lbl) == 0
	}, 5*time.Second, time.Millisecond, "a lost permit still counts as used")
	assert.Equal(t, int64(1), counter(t, tel.collect(t), "guard.lock.losses", lbl, kindPermit))
}

// TestRWMutexTelemetry: guard.lock.readers counts the readers holding; a writer's waits go to
// guard.lock.writer.wait.duration, by outcome; the spans say each side.
func TestRWMutexTelemetry(t *testing.T) {
	tel := newTelemetry(t)
	g := newGuard(t, memstore.New(), tel.observer())
	rw, err := g.RWMutex("doc:7")
	require.NoError(t, err)
	r1, err := rw.RLock(t.Context())
	require.NoError(t, err)
	r2, err := rw.RLock(t.Context(), guard.NoReentry())
	require.NoError(t, err)
	_, err = rw.Lock(t.Context(), guard.WaitTime(0))
	require.ErrorIs(t, err, guard.ErrNotAcquired)

	rm := tel.collect(t)
	assert.Equal(t, int64(2), counter(t, rm, "guard.lock.readers", backendMem, kindRead))
	n, _ := histogram(t, rm, "guard.lock.writer.wait.duration", kindWrite, tracing.OutcomeKey.String("busy"))
	assert.Equal(t, uint64(1), n)
	n, _ = histogram(t, rm, "guard.lock.writer.wait.duration")
	assert.Equal(t, uint64(1), n, "readers' waits are not a writer's")

	require.NoError(t, r1.Release(t.Context()))
	require.NoError(t, r2.Release(t.Context()))
	w, err := rw.Lock(t.Context())
	require.NoError(t, err)
	require.NoError(t, w.Release(t.Context()))

	rm = tel.collect(t)
	assert.Equal(t, int64(0), counter(t, rm, "guard.lock.readers"))
	n, _ = histogram(t, rm, "guard.lock.writer.wait.duration", kindWrite, tracing.OutcomeKey.String("acquired"))
	assert.Equal(t, uint64(1), n)
	kinds := map[string]int{}
	for _, s := range spansCalled(tel, "guard.hold") {
		kinds[requireAttr(t, s, tracing.KindKey).AsString()]++
		_, ok := attr(s, tracing.PermitsKey)
		assert.False(t, ok, "permits on a span that holds no permit")
	}
	assert.Equal(t, map[string]int{"read": 2, "write": 1}, kinds)
}

// TestElectionTelemetry: guard.lock.terms counts the terms begun; a term's spans say so.
func TestElectionTelemetry(t *testing.T) {
	tel := newTelemetry(t)
	store := memstore.New()
	g1 := newGuard(t, store, tel.observer())
	g2 := newGuard(t, store, tel.observer())
	e1, err := guard.NewElection(g1, "leader")
	require.NoError(t, err)
	e2, err := guard.NewElection(g2, "leader")
	require.NoError(t, err)

	_, err = e1.Campaign(t.Context(), "10.0.0.1:8080")
	require.NoError(t, err)
	require.NoError(t, e1.Resign(t.Context()))
	_, err = e2.Campaign(t.Context(), "10.0.0.2:8080")
	require.NoError(t, err)

	rm := tel.collect(t)
	assert.Equal(t, int64(2), counter(t, rm, "guard.lock.terms", backendMem, kindTerm))
	assert.Equal(t, int64(1), counter(t, rm, "guard.lock.held", kindTerm))
	assert.Equal(t, "term", requireAttr(t, tel.span(t, "guard.hold"), tracing.KindKey).AsString())
	require.NoError(t, e2.Resign(t.Context()))
}

// TestMutexKind: a plain lock's telemetry says "mutex", and counts in no primitive's metric.
func TestMutexKind(t *testing.T) {
	tel := newTelemetry(t)
	g := newGuard(t, memstore.New(), tel.observer())
	require.NoError(t, g.Do(t.Context(), "n", func(ctx context.Context) error { return nil }))
	assert.Equal(t, "mutex", requireAttr(t, tel.span(t, "guard.acquire"), tracing.KindKey).AsString())
	rm := tel.collect(t)
	assert.Equal(t, int64(1), counter(t, rm, "guard.lock.acquisitions", tracing.KindKey.String("mutex")))
	for _, name := range []string{"guard.lock.permits.used", "guard.lock.readers", "guard.lock.terms"} {
		assert.Equal(t, int64(0), counter(t, rm, name), name)
	}
	n, _ := histogram(t, rm, "guard.lock.writer.wait.duration")
	assert.Zero(t, n)
}
