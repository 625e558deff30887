// Package e2e runs guard end to end against real servers: here, lock telemetry exported over
// OTLP/HTTP to a real Jaeger and read back from Jaeger's query API.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
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
	"github.com/guardlock/guard/examples/httpapi/accounts"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/tracing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// service is the service.name the test's spans are exported under.
const service = "guard-e2e"

// requestSpan is the name of the server span each request of the traffic runs in: the parent
// of the lock's acquire and hold spans. workSpan is the span of the work under the lock.
const (
	requestSpan = "POST /accounts/{id}/withdraw"
	workSpan    = "accounts.withdraw"
)

// traffic sends requests that contend for a lock, each in a server span called requestSpan,
// with spans from tp (for the locks: tracing.New(tracing.WithTracerProvider(tp))), and returns
// what Jaeger should show once they are exported. It is the part of the test to swap for
// another entry point.
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
	var run traffic = withdrawOverHTTP
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
	writeDocsWaterfall(t, spans)

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
		case workSpan:
			assert.Equal(t, holdName, parent(s).Name, "locked work's parent")
		}
	}
	assert.Equal(t, want.outcomes, outcomes, "acquire spans by outcome")
	assert.GreaterOrEqual(t, waited, want.waited, "acquire spans that waited and were woken")
	assert.Len(t, holds, want.outcomes["acquired"])

	// The locked sections of one name never overlap: each hold starts after the work under
	// the previous hold of that name ended.
	sort.Slice(holds, func(a, b int) bool { return holds[a].Start.Before(holds[b].Start) })
	work := map[string]testserver.Span{} // by parent hold span
	for _, s := range spans {
		if s.Name == workSpan {
			work[s.ParentSpanID] = s
		}
	}
	previous := map[string]testserver.Span{} // the last hold of each lock name
	for _, h := range holds {
		name, _ := h.Attributes[string(tracing.NameKey)].(string)
		require.NotEmpty(t, name, "hold span %s has the lock name", h.SpanID)
		if prev, ok := previous[name]; ok {
			w, ok := work[prev.SpanID]
			require.True(t, ok, "hold span %s has a work span", prev.SpanID)
			assert.False(t, h.Start.Before(w.End), "a hold of %q starts at %v, before the work under the one before ended at %v",
				name, h.Start, w.End)
		}
		previous[name] = h
	}
	assert.Len(t, previous, 2, "lock names held")
}

// count returns how many spans there are of each name.
func count(spans []testserver.Span) map[string]int {
	n := map[string]int{}
	for _, s := range spans {
		n[s.Name]++
	}
	return n
}

// withdrawOverHTTP is traffic through the httpapi example's handler: three instances of the
// account service (three Guards on one shared memstore, each behind its own HTTP server, one
// ledger) take withdrawals. While another instance holds account 42 (a Guard without
// telemetry, as a batch job would), six concurrent withdrawals on it are sent; once all of them
// are parked waiting for its release, two withdrawals on it to an instance that does not wait
// are answered 423, three withdrawals on account 7 go through without waiting, and then
// account 42 is released: the six take it one after another, each woken by the release before
// its turn.
func withdrawOverHTTP(t *testing.T, tp trace.TracerProvider) expected {
	const (
		instances = 3
		waiters   = 6 // on account 42
		busy      = 2 // on account 42, to an instance that does not wait
		others    = 3 // on account 7
		amount    = 10
	)
	store := locktest.NewSpy(memstore.New(), 4*waiters)
	ledger := &accounts.Ledger{}
	a42, a7 := accounts.Account{Tenant: "acme", ID: "42"}, accounts.Account{Tenant: "acme", ID: "7"}
	for _, a := range []accounts.Account{a42, a7} {
		tx, err := ledger.Begin(a, 0)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(1000))
	}

	obs := tracing.New(tracing.WithTracerProvider(tp))
	servers := make([]*httptest.Server, instances+1) // the last one does not wait
	for i := range servers {
		g := guard.New(store, guard.WithObserver(obs))
		t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
		wait := 30 * time.Second
		if i == instances {
			wait = 0
		}
		servers[i] = httptest.NewServer(accounts.NewHandler(g, ledger, accounts.WithTracerProvider(tp),
			accounts.WithWork(5*time.Millisecond), accounts.WithWaitTime(wait)))
		t.Cleanup(servers[i].Close) // before the Guard closes: cleanups run last first
	}
	// withdraw sends a withdrawal to server i and checks that it got status.
	withdraw := func(i int, account string, status int) error {
		srv := servers[i]
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/accounts/"+account+"/withdraw",
			strings.NewReader(fmt.Sprintf(`{"amount": %d}`, amount)))
		if err != nil {
			return err
		}
		req.Header.Set(accounts.TenantHeader, "acme")
		res, err := srv.Client().Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != status {
			return fmt.Errorf("withdraw from %s: %s: %s", account, res.Status, body)
		}
		return nil
	}

	holder := guard.New(store) // another instance, untraced
	t.Cleanup(func() { assert.NoError(t, holder.Close(context.Background())) })
	held, err := holder.TryAcquire(t.Context(), "tenant:acme:account:42")
	require.NoError(t, err)

	// The withdrawals on 42 wait. Each is parked once it was told "busy" twice: once before
	// it asked for release notifications, once after.
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for i := range waiters {
		wg.Go(func() { errs <- withdraw(i%instances, "42", http.StatusOK) })
	}
	for range 2 * waiters {
		<-store.Busy()
	}
	for range busy {
		require.NoError(t, withdraw(instances, "42", http.StatusLocked))
	}
	// Another account is not held up.
	for i := range others {
		require.NoError(t, withdraw(i, "7", http.StatusOK))
	}
	require.NoError(t, held.Release(t.Context()))
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	for a, want := range map[accounts.Account]int64{a42: 1000 - waiters*amount, a7: 1000 - others*amount} {
		balance, _ := ledger.Balance(a)
		assert.Equal(t, want, balance, "balance of %s", a.ID)
	}
	assert.Zero(t, ledger.Overlaps(), "writes of one account overlapped")
	return expected{
		requests: waiters + busy + others,
		outcomes: map[string]int{"acquired": waiters + others, "busy": busy},
		waited:   waiters,
		label:    accounts.LockTemplate,
		backend:  "locktest", // the spy's package
	}
}
