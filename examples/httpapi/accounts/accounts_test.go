package accounts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/examples/httpapi/accounts"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
	"github.com/guardlock/guard/tracing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// service is several instances of the account service — each its own Guard and HTTP server —
// on one lock backend and one ledger, as a deployment shares a Redis and a database.
type service struct {
	ledger *accounts.Ledger
	urls   []string // one per instance
	guards []*guard.Guard
	spans  *tracetest.SpanRecorder
}

// backends are the lock backends the tests run on: each call gives a fresh one.
var backends = []struct {
	name string
	new  func(t *testing.T) guard.Backend
}{
	{"memstore", func(*testing.T) guard.Backend { return memstore.New() }},
	{"redis", func(t *testing.T) guard.Backend {
		srv := testserver.StartRedis(t)
		client := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = client.Close() }) // after the Guards: cleanups run last first
		return redisstore.New(client)
	}},
}

func newService(t *testing.T, backend guard.Backend, instances int, opts ...accounts.Option) *service {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s := &service{ledger: &accounts.Ledger{}, spans: spans}
	for range instances {
		g := guard.New(backend, guard.WithObserver(tracing.New(tracing.WithTracerProvider(tp))))
		t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
		srv := httptest.NewServer(accounts.NewHandler(g, s.ledger, append(opts, accounts.WithTracerProvider(tp))...))
		t.Cleanup(srv.Close)
		s.urls = append(s.urls, srv.URL)
		s.guards = append(s.guards, g)
	}
	return s
}

// response is what a request got back.
type response struct {
	status  int
	balance accounts.Balance
	problem map[string]any
}

// do sends a request to instance i: op is "deposit", "withdraw" or "" for the balance.
func (s *service) do(t *testing.T, i int, tenant, account, op string, amount int64) response {
	t.Helper()
	method, url, body := http.MethodGet, s.urls[i]+"/accounts/"+account, ""
	if op != "" {
		method, url, body = http.MethodPost, url+"/"+op, fmt.Sprintf(`{"amount": %d}`, amount)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	if tenant != "" {
		req.Header.Set(accounts.TenantHeader, tenant)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	r := response{status: res.StatusCode}
	if res.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(res.Body).Decode(&r.balance))
	} else {
		assert.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(res.Body).Decode(&r.problem))
	}
	return r
}

// waited counts the acquire spans that waited for a release and were woken by it.
func (s *service) waited() int {
	n := 0
	for _, span := range s.spans.Ended() {
		if !strings.HasPrefix(span.Name(), "guard.acquire ") {
			continue
		}
		for _, kv := range span.Attributes() {
			if kv.Key == tracing.WakeupsKey && kv.Value.AsInt64() > 0 {
				n++
			}
		}
	}
	return n
}

func TestConcurrentWithdrawalsOnOneAccount(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			const (
				instances   = 3
				withdrawals = 16
				amount      = 10
				deposit     = 100 // enough for 10 of the 16
			)
			s := newService(t, b.new(t), instances, accounts.WithWork(5*time.Millisecond), accounts.WithWaitTime(20*time.Second))
			require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "42", "deposit", deposit).status)

			// One account, however its URL spells it: one lock, and one balance.
			spellings := []string{"42", "%34%32", "4%32"}
			start := make(chan struct{})
			results := make(chan response, withdrawals)
			var wg sync.WaitGroup
			for i := range withdrawals {
				wg.Go(func() {
					<-start
					results <- s.do(t, i%instances, "acme", spellings[i%len(spellings)], "withdraw", amount)
				})
			}
			close(start)
			wg.Wait()
			close(results)

			var balances []int64
			var fences []uint64
			overdrawn := 0
			for r := range results {
				switch r.status {
				case http.StatusOK:
					balances = append(balances, r.balance.Balance)
					fences = append(fences, r.balance.Fence)
				case http.StatusConflict:
					assert.Contains(t, r.problem["detail"], "Insufficient funds")
					overdrawn++
				default:
					t.Errorf("status %d: %v", r.status, r.problem)
				}
			}
			// Every successful withdrawal saw the one before it: the balances they report
			// are 90, 80, … 0, each once, and nobody overdrew.
			slices.Sort(balances)
			assert.Equal(t, []int64{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}, balances)
			assert.Equal(t, withdrawals-deposit/amount, overdrawn)
			assert.Len(t, slices.Compact(slices.Sorted(slices.Values(fences))), len(fences), "one fence per write")
			balance, _ := s.ledger.Balance(accounts.Account{Tenant: "acme", ID: "42"})
			assert.Equal(t, int64(0), balance)
			assert.Zero(t, s.ledger.Overlaps(), "read-modify-writes of one account overlapped")
			// The test contended: requests waited for one another and were woken by releases.
			assert.Positive(t, s.waited(), "no request waited for the lock")
		})
	}
}

func TestAccountsInParallel(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := newService(t, b.new(t), 2, accounts.WithWaitTime(0))
			ctx := t.Context()

			// Another instance holds account 1 of acme, as a long request would.
			held, err := s.guards[1].TryAcquire(ctx, "tenant:acme:account:1")
			require.NoError(t, err)

			busy := s.do(t, 0, "acme", "1", "deposit", 5)
			assert.Equal(t, http.StatusLocked, busy.status, "the held account")
			for _, r := range []struct{ tenant, account string }{
				{"acme", "2"},  // another account of the tenant
				{"bravo", "1"}, // the same account number of another tenant
			} {
				got := s.do(t, 0, r.tenant, r.account, "deposit", 5)
				assert.Equal(t, http.StatusOK, got.status, "%s/%s runs while acme/1 is held", r.tenant, r.account)
			}
			require.NoError(t, held.Release(ctx))

			// Many accounts at once, on instances that wait for the lock: each account ends
			// with its own deposits, and no two writes of one account overlapped.
			s = newService(t, b.new(t), 2, accounts.WithWork(time.Millisecond), accounts.WithWaitTime(20*time.Second))
			var wg sync.WaitGroup
			for a := range 4 {
				for i := range 5 {
					wg.Go(func() {
						r := s.do(t, i%2, "bravo", fmt.Sprint(100+a), "deposit", 1)
						assert.Equal(t, http.StatusOK, r.status, "%v", r.problem)
					})
				}
			}
			wg.Wait()
			for a := range 4 {
				balance, _ := s.ledger.Balance(accounts.Account{Tenant: "bravo", ID: fmt.Sprint(100 + a)})
				assert.Equal(t, int64(5), balance, "account %d", 100+a)
			}
			assert.Zero(t, s.ledger.Overlaps())
		})
	}
}

// A holder whose lock ran out while it paused cannot write over the holder after it: the
// ledger sees a fence lower than one it accepted.
func TestStaleFenceRejected(t *testing.T) {
	ctx := t.Context()
	store := memstore.New()
	a, b := guard.New(store), guard.New(store)
	t.Cleanup(func() { _ = a.Close(context.Background()); _ = b.Close(context.Background()) })
	ledger := &accounts.Ledger{}
	acct := accounts.Account{Tenant: "acme", ID: "42"}
	const name = "tenant:acme:account:42"

	first, err := a.Acquire(ctx, name, guard.LeaseTime(20*time.Millisecond))
	require.NoError(t, err)
	stale, err := ledger.Begin(acct, first.Fence())
	require.NoError(t, err)
	<-first.Done() // the holder pauses (a GC, a slow disk) past its lease
	require.ErrorIs(t, context.Cause(first.Context()), guard.ErrLeaseExpired)

	second, err := b.Acquire(ctx, name)
	require.NoError(t, err)
	defer second.Release(ctx)
	require.Greater(t, second.Fence(), first.Fence())
	tx, err := ledger.Begin(acct, second.Fence())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(tx.Balance()+100))

	// The first holder wakes up and writes what it computed: rejected.
	require.ErrorIs(t, stale.Commit(stale.Balance()+1), accounts.ErrStaleFence)
	_, err = ledger.Begin(acct, first.Fence())
	require.ErrorIs(t, err, accounts.ErrStaleFence)
	balance, fence := ledger.Balance(acct)
	assert.Equal(t, int64(100), balance)
	assert.Equal(t, second.Fence(), fence)
}

// The handler answers a write with a stale fence 409 and writes nothing.
func TestStaleFenceResponse(t *testing.T) {
	s := newService(t, memstore.New(), 1)
	acct := accounts.Account{Tenant: "acme", ID: "42"}
	// A holder with a far higher fence wrote the account (say, the lock moved to a backend
	// whose fences are ahead).
	tx, err := s.ledger.Begin(acct, 1000)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(500))

	r := s.do(t, 0, "acme", "42", "withdraw", 10)
	assert.Equal(t, http.StatusConflict, r.status)
	assert.Contains(t, r.problem["detail"], "newer holder")
	balance, fence := s.ledger.Balance(acct)
	assert.Equal(t, int64(500), balance)
	assert.Equal(t, uint64(1000), fence)
}

func TestLedgerCountsOverlaps(t *testing.T) {
	tests := []struct {
		name  string
		other accounts.Account
		want  int
	}{
		{"same account", accounts.Account{Tenant: "acme", ID: "1"}, 1},
		{"another account", accounts.Account{Tenant: "acme", ID: "2"}, 0},
		{"another tenant", accounts.Account{Tenant: "bravo", ID: "1"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l accounts.Ledger
			first, err := l.Begin(accounts.Account{Tenant: "acme", ID: "1"}, 0)
			require.NoError(t, err)
			second, err := l.Begin(tt.other, 0)
			require.NoError(t, err)
			assert.Equal(t, tt.want, l.Overlaps())
			require.NoError(t, second.Commit(1))
			first.Rollback()
			assert.ErrorIs(t, first.Commit(1), accounts.ErrTxDone)
		})
	}
}

func TestResponses(t *testing.T) {
	s := newService(t, memstore.New(), 1)
	require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "7", "deposit", 50).status)

	tests := []struct {
		name           string
		tenant, op     string
		amount         int64
		status         int
		detail         string
		balance, fence int64
	}{
		{"deposit", "acme", "deposit", 25, http.StatusOK, "", 75, 2},
		{"withdraw", "acme", "withdraw", 70, http.StatusOK, "", 5, 3},
		{"overdraft", "acme", "withdraw", 6, http.StatusConflict, "Insufficient funds", 0, 0},
		{"balance", "acme", "", 0, http.StatusOK, "", 5, 3},
		{"zero amount", "acme", "deposit", 0, http.StatusBadRequest, "amount", 0, 0},
		{"no tenant", "", "withdraw", 1, http.StatusBadRequest, "{header.X-Tenant}: empty value", 0, 0},
		{"no tenant, balance", "", "", 0, http.StatusBadRequest, "X-Tenant header is missing", 0, 0},
		{"other tenant", "bravo", "", 0, http.StatusOK, "", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.do(t, 0, tt.tenant, "7", tt.op, tt.amount)
			require.Equal(t, tt.status, r.status, "%v", r.problem)
			if tt.status != http.StatusOK {
				assert.Contains(t, r.problem["detail"], tt.detail)
				return
			}
			assert.Equal(t, accounts.Balance{Tenant: tt.tenant, Account: "7", Balance: tt.balance, Fence: uint64(tt.fence)}, r.balance)
		})
	}
}

// The request span is the parent of the lock's spans, and its name is the route.
func TestSpans(t *testing.T) {
	s := newService(t, memstore.New(), 1)
	require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "7", "deposit", 50).status)

	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, span := range s.spans.Ended() {
		byID[span.SpanContext().SpanID().String()] = span
	}
	parent := func(name string) string {
		for _, span := range byID {
			if span.Name() == name {
				if p, ok := byID[span.Parent().SpanID().String()]; ok {
					return p.Name()
				}
				return ""
			}
		}
		t.Fatalf("no span %q among %d", name, len(byID))
		return ""
	}
	hold := "guard.hold " + accounts.LockTemplate
	assert.Equal(t, "POST /accounts/{id}/deposit", parent("guard.acquire "+accounts.LockTemplate))
	assert.Equal(t, "POST /accounts/{id}/deposit", parent(hold))
	assert.Equal(t, hold, parent("accounts.deposit"))
	assert.Equal(t, hold, parent("guard.release "+accounts.LockTemplate))
}
