// Package e2e runs guard end to end against real servers: here, lock telemetry exported over
// OTLP/HTTP to a real Jaeger and read back from Jaeger's query API.
package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
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
// through programs that export their spans to the OTLP/HTTP receiver at otlpEndpoint as
// service, and returns what Jaeger should show of the traces that started from since on. It
// is the part of the test to swap for another entry point.
type traffic func(t *testing.T, otlpEndpoint string) (want expected, since time.Time)

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
	var run traffic = withdrawOverHTTP
	want, since := run(t, j.OTLPEndpoint)
	sent := time.Now()

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
	t.Logf("%d spans in Jaeger %v after the traffic (the programs export every 5 s), %v after start: %v",
		len(spans), time.Since(sent).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), count(spans))
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

// withdrawOverHTTP is traffic through the httpapi example: three processes of it on one Redis
// take withdrawals, and a fourth that does not wait for a lock. Once account 42 and 7 have
// their deposits, the spans count from then on. While another instance holds account 42 (a
// Guard without telemetry, as a batch job would), six concurrent withdrawals on it are sent;
// once all of them are queued for its release, two withdrawals on it to the process that does
// not wait are answered 423, three withdrawals on account 7 go through without waiting, and
// then account 42 is released: the six take it one after another, each woken by the release
// before its turn.
func withdrawOverHTTP(t *testing.T, otlpEndpoint string) (expected, time.Time) {
	const (
		instances = 3
		waiters   = 6 // on account 42
		busy      = 2 // on account 42, to an instance that does not wait
		others    = 3 // on account 7
		amount    = 10
	)
	_, bin := exampleBinaries(t)
	srv := testserver.StartRedis(t)
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + otlpEndpoint, "OTEL_SERVICE_NAME=" + service}
	bases := make([]string, instances+1) // the last one does not wait
	for i := range bases {
		wait := "10s"
		if i == instances {
			wait = "0s"
		}
		bases[i] = startHTTPAPIWithEnv(t, bin, []string{"-addr", "127.0.0.1:0", "-work", "5ms", "-wait", wait, "-redis", srv.Addr}, env...)
	}
	for _, account := range []string{"42", "7"} {
		status, body := accountsRequest(t, bases[0], "deposit", account, 1000)
		require.Equal(t, http.StatusOK, status, body)
	}
	since := time.Now()

	// withdraw sends a withdrawal to process i and checks that it got status.
	withdraw := func(i int, account string, status int) error {
		got, body := accountsRequest(t, bases[i], "withdraw", account, amount)
		if got != status {
			return fmt.Errorf("withdraw from %s: %d: %s", account, got, body)
		}
		return nil
	}

	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client)
	holder := guard.New(store) // another instance, untraced
	t.Cleanup(func() { assert.NoError(t, holder.Close(context.Background())) })
	const name = "tenant:acme:account:42"
	held, err := holder.TryAcquire(t.Context(), name)
	require.NoError(t, err)

	// The withdrawals on 42 wait, queued for the name.
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for i := range waiters {
		wg.Go(func() { errs <- withdraw(i%instances, "42", http.StatusOK) })
	}
	require.Eventually(t, func() bool {
		info, err := store.Inspect(t.Context(), name)
		return err == nil && info.Waiting >= waiters
	}, 10*time.Second, 10*time.Millisecond, "the withdrawals on 42 queue for its lock")
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

	// The balances, from the example's store on the server: a balance request would add the
	// acquire and hold spans of the read side of the account's lock.
	for account, want := range map[string]int64{"42": 1000 - waiters*amount, "7": 1000 - others*amount} {
		balance, err := client.HGet(t.Context(), `httpapi:account:["acme","`+account+`"]`, "balance").Int64()
		require.NoError(t, err)
		assert.Equal(t, want, balance, "account %s", account)
	}
	return expected{
		requests: waiters + busy + others,
		outcomes: map[string]int{"acquired": waiters + others, "busy": busy},
		waited:   waiters,
		label:    "tenant:{header.X-Tenant}:account:{id}",
		backend:  "redisstore",
	}, since
}
