package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/redisstore"
	"github.com/guardlock/guard/tracing"
)

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

// fleet is several instances of the account service — each its own Guard, store client
// and HTTP server — on one lock backend and one store, as a deployment shares a Redis.
type fleet struct {
	store  Store    // the first instance's, to read the balances
	urls   []string // one per instance
	guards []*guard.Guard
	spans  *tracetest.SpanRecorder
}

// backends are the lock backends and stores the tests run on: start starts a server (none
// for memstore) and returns open, which opens an instance's clients to it.
var backends = []struct {
	name  string
	start func(t *testing.T) (open func(t *testing.T) (guard.Backend, Store))
}{
	{"memstore", func(*testing.T) func(*testing.T) (guard.Backend, Store) {
		store, ledger := memstore.New(), &Ledger{}
		return func(*testing.T) (guard.Backend, Store) { return store, ledger }
	}},
	{"redis", func(t *testing.T) func(*testing.T) (guard.Backend, Store) {
		addr := startRedis(t)
		return func(t *testing.T) (guard.Backend, Store) {
			client := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { _ = client.Close() }) // after the Guards: cleanups run last first
			return redisstore.New(client), NewRedisStore(client)
		}
	}},
	{"etcd", func(t *testing.T) func(*testing.T) (guard.Backend, Store) {
		addr := startEtcd(t)
		return func(t *testing.T) (guard.Backend, Store) {
			client, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			require.NoError(t, err)
			store := etcdstore.New(client)
			t.Cleanup(func() { // after the Guards: cleanups run last first
				assert.NoError(t, store.Close())
				assert.NoError(t, client.Close())
			})
			return store, NewEtcdStore(client)
		}
	}},
}

func newService(t *testing.T, open func(t *testing.T) (guard.Backend, Store), instances int, opts ...Option) *fleet {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s := &fleet{spans: spans}
	for range instances {
		backend, store := open(t)
		if s.store == nil {
			s.store = store
		}
		g := guard.New(backend, guard.WithObserver(tracing.New(tracing.WithTracerProvider(tp))))
		t.Cleanup(func() { assert.NoError(t, g.Close(context.Background())) })
		srv := httptest.NewServer(NewHandler(g, store, append(opts, WithTracerProvider(tp))...))
		t.Cleanup(srv.Close)
		s.urls = append(s.urls, srv.URL)
		s.guards = append(s.guards, g)
	}
	return s
}

// memService is a fleet on the embedded backend, with its ledger.
func memService(t *testing.T, instances int, opts ...Option) (*fleet, *Ledger) {
	t.Helper()
	store, ledger := memstore.New(), &Ledger{}
	return newService(t, func(*testing.T) (guard.Backend, Store) { return store, ledger }, instances, opts...), ledger
}

// balance returns the balance of account id of tenant in s's store.
func (s *fleet) balance(t *testing.T, tenant, id string) (int64, uint64) {
	t.Helper()
	balance, fence, err := s.store.Balance(t.Context(), Account{Tenant: tenant, ID: id})
	require.NoError(t, err)
	return balance, fence
}

// response is what a request got back.
type response struct {
	status  int
	balance Balance
	problem map[string]any
}

// do sends a request to instance i: op is "deposit", "withdraw" or "" for the balance.
func (s *fleet) do(t *testing.T, i int, tenant, account, op string, amount int64) response {
	t.Helper()
	method, url, body := http.MethodGet, s.urls[i]+"/accounts/"+account, ""
	if op != "" {
		method, url, body = http.MethodPost, url+"/"+op, fmt.Sprintf(`{"amount": %d}`, amount)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	if tenant != "" {
		req.Header.Set(TenantHeader, tenant)
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
func (s *fleet) waited() int {
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
			s := newService(t, b.start(t), instances, WithWork(5*time.Millisecond), WithWaitTime(20*time.Second))
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
			balance, _ := s.balance(t, "acme", "42")
			assert.Equal(t, int64(0), balance)
			if ledger, ok := s.store.(*Ledger); ok {
				assert.Zero(t, ledger.Overlaps(), "read-modify-writes of one account overlapped")
			}
			// The test contended: requests waited for one another and were woken by releases.
			assert.Positive(t, s.waited(), "no request waited for the lock")
		})
	}
}

func TestAccountsInParallel(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			open := b.start(t)
			s := newService(t, open, 2, WithWaitTime(0))
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
			s = newService(t, open, 2, WithWork(time.Millisecond), WithWaitTime(20*time.Second))
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
				balance, _ := s.balance(t, "bravo", fmt.Sprint(100+a))
				assert.Equal(t, int64(5), balance, "account %d", 100+a)
			}
		})
	}
}

// A holder whose lock ran out while it paused cannot write over the holder after it: the
// store refuses its fence, lower than one it accepted, both when the newer write came between
// the stale holder's read and its write, and at the stale holder's next read.
func TestStaleFenceRejected(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			backend, store := b.start(t)(t)
			first, second := guard.New(backend), guard.New(backend)
			t.Cleanup(func() { _ = first.Close(context.Background()); _ = second.Close(context.Background()) })
			acct := Account{Tenant: "acme", ID: "42"}
			const name = "tenant:acme:account:42"

			stale, err := first.Acquire(ctx, name, guard.LeaseTime(50*time.Millisecond))
			require.NoError(t, err)
			var next *guard.Lock
			_, err = store.Update(ctx, acct, stale.Fence(), func(balance int64) (int64, error) {
				<-stale.Done() // the holder pauses (a GC, a slow disk) past its lease
				require.ErrorIs(t, context.Cause(stale.Context()), guard.ErrLeaseExpired)
				next, err = second.Acquire(ctx, name)
				require.NoError(t, err)
				require.Greater(t, next.Fence(), stale.Fence())
				_, err := store.Update(ctx, acct, next.Fence(), func(balance int64) (int64, error) { return balance + 100, nil })
				require.NoError(t, err)
				return balance + 1, nil // what the first holder computed, written when it wakes up
			})
			require.ErrorIs(t, err, ErrStaleFence)
			defer next.Release(ctx)
			_, err = store.Update(ctx, acct, stale.Fence(), func(balance int64) (int64, error) {
				t.Error("a stale holder read the balance")
				return balance, nil
			})
			require.ErrorIs(t, err, ErrStaleFence)

			balance, fence, err := store.Balance(ctx, acct)
			require.NoError(t, err)
			assert.Equal(t, int64(100), balance)
			assert.Equal(t, next.Fence(), fence)
		})
	}
}

// What a store keeps: nothing for an account never written; a change's error writes nothing;
// a fence equal to the last one is accepted; tenants and IDs that would spell one key in a
// naive encoding stay apart.
func TestStores(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			_, store := b.start(t)(t)
			add := func(n int64) func(int64) (int64, error) {
				return func(balance int64) (int64, error) { return balance + n, nil }
			}
			a := Account{Tenant: "acme:1", ID: "2"}
			balance, fence, err := store.Balance(ctx, a)
			require.NoError(t, err)
			assert.Equal(t, []any{int64(0), uint64(0)}, []any{balance, fence}, "never written")

			got, err := store.Update(ctx, a, 7, add(5))
			require.NoError(t, err)
			assert.Equal(t, int64(5), got)
			_, err = store.Update(ctx, a, 7, func(int64) (int64, error) { return 0, ErrInsufficientFunds })
			require.ErrorIs(t, err, ErrInsufficientFunds)
			got, err = store.Update(ctx, a, 7, add(1)) // the same fence again
			require.NoError(t, err)
			assert.Equal(t, int64(6), got)
			got, err = store.Update(ctx, Account{Tenant: "acme", ID: "1:2"}, 1<<62, add(3))
			require.NoError(t, err)
			assert.Equal(t, int64(3), got)

			balance, fence, err = store.Balance(ctx, a)
			require.NoError(t, err)
			assert.Equal(t, []any{int64(6), uint64(7)}, []any{balance, fence})
		})
	}
}

// EtcdStore's write is a compare-and-swap on the account's key: deposits and withdrawals made
// at once with no lock at all, under one fence, lose nothing and never overdraw. (The other
// stores leave that to the account's lock, and check only the fence.)
func TestEtcdStoreWithoutLocks(t *testing.T) {
	_, store := backends[2].start(t)(t)
	require.IsType(t, &EtcdStore{}, store)
	ctx := t.Context()
	a := Account{Tenant: "acme", ID: "race"}
	const (
		writers  = 16
		deposits = 5 // each, of 10
	)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			<-start
			for range deposits {
				_, err := store.Update(ctx, a, 1, func(balance int64) (int64, error) { return balance + 10, nil })
				assert.NoError(t, err)
			}
		})
	}
	close(start)
	wg.Wait()
	balance, _, err := store.Balance(ctx, a)
	require.NoError(t, err)
	assert.Equal(t, int64(writers*deposits*10), balance, "deposits lost")

	// As many withdrawals of 10 as the balance holds, and as many more: half are refused.
	start = make(chan struct{})
	var refused atomic.Int64
	for range writers {
		wg.Go(func() {
			<-start
			for range 2 * deposits {
				_, err := store.Update(ctx, a, 2, func(balance int64) (int64, error) {
					if balance < 10 {
						return 0, ErrInsufficientFunds
					}
					return balance - 10, nil
				})
				if errors.Is(err, ErrInsufficientFunds) {
					refused.Add(1)
				} else {
					assert.NoError(t, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	balance, _, err = store.Balance(ctx, a)
	require.NoError(t, err)
	assert.Equal(t, int64(0), balance, "a withdrawal lost, or one too many")
	assert.Equal(t, int64(writers*deposits), refused.Load(), "withdrawals refused")
}

// The handler answers a write with a stale fence 409 and writes nothing.
func TestStaleFenceResponse(t *testing.T) {
	s, ledger := memService(t, 1)
	acct := Account{Tenant: "acme", ID: "42"}
	// A holder with a far higher fence wrote the account (say, the lock moved to a backend
	// whose fences are ahead).
	tx, err := ledger.Begin(acct, 1000)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(500))

	r := s.do(t, 0, "acme", "42", "withdraw", 10)
	assert.Equal(t, http.StatusConflict, r.status)
	assert.Contains(t, r.problem["detail"], "newer holder")
	balance, fence := s.balance(t, "acme", "42")
	assert.Equal(t, int64(500), balance)
	assert.Equal(t, uint64(1000), fence)
}

func TestLedgerCountsOverlaps(t *testing.T) {
	tests := []struct {
		name  string
		other Account
		want  int
	}{
		{"same account", Account{Tenant: "acme", ID: "1"}, 1},
		{"another account", Account{Tenant: "acme", ID: "2"}, 0},
		{"another tenant", Account{Tenant: "bravo", ID: "1"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Ledger
			first, err := l.Begin(Account{Tenant: "acme", ID: "1"}, 0)
			require.NoError(t, err)
			second, err := l.Begin(tt.other, 0)
			require.NoError(t, err)
			assert.Equal(t, tt.want, l.Overlaps())
			require.NoError(t, second.Commit(1))
			first.Rollback()
			assert.ErrorIs(t, first.Commit(1), ErrTxDone)
		})
	}
}

func TestResponses(t *testing.T) {
	s, _ := memService(t, 1)
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
		{"no tenant, balance", "", "", 0, http.StatusBadRequest, "{header.X-Tenant}: empty value", 0, 0},
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
			assert.Equal(t, Balance{Tenant: tt.tenant, Account: "7", Balance: tt.balance, Fence: uint64(tt.fence)}, r.balance)
		})
	}
}

// The request span is the parent of the lock's spans, and its name is the route; a balance
// read takes the lock too (its read side).
func TestSpans(t *testing.T) {
	s, _ := memService(t, 1)
	require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "7", "deposit", 50).status)
	require.Equal(t, http.StatusOK, s.do(t, 0, "acme", "7", "", 0).status)

	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, span := range s.spans.Ended() {
		byID[span.SpanContext().SpanID().String()] = span
	}
	// parents returns the names of the parents of the spans called name, sorted.
	parents := func(name string) []string {
		var names []string
		for _, span := range byID {
			if span.Name() == name {
				p := byID[span.Parent().SpanID().String()]
				if p == nil {
					names = append(names, "")
					continue
				}
				names = append(names, p.Name())
			}
		}
		slices.Sort(names)
		return names
	}
	parent := func(name string) string {
		p := parents(name)
		require.Len(t, p, 1, "spans %q", name)
		return p[0]
	}
	hold := "guard.hold " + LockTemplate
	routes := []string{"GET /accounts/{id}", "POST /accounts/{id}/deposit"}
	assert.Equal(t, routes, parents("guard.acquire "+LockTemplate))
	assert.Equal(t, routes, parents(hold))
	assert.Equal(t, hold, parent("accounts.deposit"))
	assert.Equal(t, []string{hold, hold}, parents("guard.release "+LockTemplate))
}
