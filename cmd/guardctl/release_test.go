package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/pgstore"
)

// racingStore is a store on which the name changes hands right after guardctl's first look at
// it: once Inspect has answered, between guardctl's look and its release, handOver runs.
type racingStore struct {
	guard.Inspector
	handOver func()
	once     sync.Once
}

func (s *racingStore) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	info, err := s.Inspector.Inspect(ctx, name)
	s.once.Do(s.handOver)
	return info, err
}

// runOn runs the command in-process on store, whatever -backend says.
func runOn(t *testing.T, store guard.Inspector, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	open := func(context.Context, *backend) (guard.Inspector, func(), error) { return store, func() {}, nil }
	code = runWith(t.Context(), open, append([]string{"-backend", "redis://127.0.0.1:1"}, args...),
		strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestReleaseChangedHands: A holds the name; guardctl looks at it; A releases and B takes the
// name; then guardctl releases. B's lock must survive, and guardctl must say what it found.
func TestReleaseChangedHands(t *testing.T) {
	for _, srv := range guardtest.Servers() {
		t.Run(srv.Name, func(t *testing.T) {
			open := srv.Start(t)
			a := guardtest.Instance(t, open, guard.WithInstance("worker-A"))
			b := guardtest.Instance(t, open, guard.WithInstance("worker-B"))
			store, ok := open(t).(guard.Inspector)
			require.True(t, ok, "the store is no guard.Inspector")
			for _, args := range [][]string{{"-yes"}, {"-yes", "-json"}} {
				t.Run(strings.Join(args, " "), func(t *testing.T) {
					name := "ctl-race:" + strings.Join(args, "")
					la, err := a.TryAcquire(t.Context(), name)
					require.NoError(t, err)
					var lb *guard.Lock
					racing := &racingStore{Inspector: store, handOver: func() {
						require.NoError(t, la.Release(t.Context()))
						lb, err = b.TryAcquire(t.Context(), name)
						require.NoError(t, err)
					}}
					code, stdout, stderr := runOn(t, racing, append(args, "release", name)...)
					require.NotNil(t, lb, "B never took the name")
					t.Logf("exit %d, stdout %q, stderr %q", code, stdout, stderr)

					info, err := store.Inspect(t.Context(), name)
					require.NoError(t, err)
					assert.True(t, info.Held, "B's lock was released")
					assert.Equal(t, lb.Fence(), info.Fence, "B's lock was released")
					assert.NoError(t, lb.Err(), "B's lock was released")
					assert.Equal(t, 1, code)
					assert.Empty(t, stdout)
					assertOneLine(t, stderr, "changed hands")
					assert.Contains(t, stderr, strconv.FormatUint(la.Fence(), 10), "the fence guardctl saw")
					assert.Contains(t, stderr, strconv.FormatUint(lb.Fence(), 10), "the fence it found")
					require.NoError(t, lb.Release(t.Context()))
				})
			}
		})
	}
}

// TestReleaseForce: with -force, release frees whoever holds the name when it gets there, and
// says which lock that was: when the lock shown changed hands, it reports the holder it freed
// instead, and exits 1; a name freed after guardctl looked at it is reported, not released
// again.
func TestReleaseForce(t *testing.T) {
	store := memstore.New()
	a, b := guard.New(store, guard.WithInstance("worker-A")), guard.New(store, guard.WithInstance("worker-B"))
	t.Cleanup(func() { _ = a.Close(context.Background()); _ = b.Close(context.Background()) })

	for _, json := range []bool{false, true} {
		t.Run(fmt.Sprintf("json %v", json), func(t *testing.T) {
			name := fmt.Sprintf("forced-%v", json)
			la, err := a.TryAcquire(t.Context(), name)
			require.NoError(t, err)
			var lb *guard.Lock
			racing := &racingStore{Inspector: store, handOver: func() {
				require.NoError(t, la.Release(t.Context()))
				lb, err = b.TryAcquire(t.Context(), name)
				require.NoError(t, err)
			}}
			args := []string{"-yes", "-force", "release", name}
			if json {
				args = append([]string{"-json"}, args...)
			}
			code, stdout, stderr := runOn(t, racing, args...)
			t.Logf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			assert.Equal(t, 1, code, "the lock shown was not the one released")
			if json {
				got := decode[lockJSON](t, stdout)
				assert.Equal(t, lb.Fence(), got.Fence, "-json prints the lock released")
				assert.Equal(t, "worker-B", got.Instance, "-json prints the lock released")
			} else {
				assert.Equal(t, fmt.Sprintf("released %s, held by worker-B, fence %d, 30s left\n", name, lb.Fence()), stdout)
			}
			assertOneLine(t, stderr, "changed hands")
			assert.Contains(t, stderr, strconv.FormatUint(la.Fence(), 10), "the fence shown")
			assert.Contains(t, stderr, "worker-B", "the holder released instead")
			info, err := store.Inspect(t.Context(), name)
			require.NoError(t, err)
			assert.False(t, info.Held, "-force released nothing")
			require.ErrorIs(t, lb.Release(t.Context()), guard.ErrNotHeld)
		})
	}

	ld, err := a.TryAcquire(t.Context(), "forced-shown")
	require.NoError(t, err)
	code, stdout, stderr := runOn(t, store, "-yes", "-force", "release", "forced-shown")
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, fmt.Sprintf("released forced-shown, held by worker-A, fence %d, 30s left\n", ld.Fence()), stdout)

	sem, err := a.Semaphore("forced-shared", 2)
	require.NoError(t, err)
	for range 2 {
		_, err := sem.TryAcquire(t.Context())
		require.NoError(t, err)
	}
	code, stdout, stderr = runOn(t, store, "-yes", "-force", "release", "forced-shared")
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "released every holder of forced-shared (-force; 2 were shown")
	info, err := store.Inspect(t.Context(), "forced-shared")
	require.NoError(t, err)
	assert.False(t, info.Held, "a holder of the shared name survived -force")

	lc, err := a.TryAcquire(t.Context(), "freed")
	require.NoError(t, err)
	for _, force := range []bool{false, true} {
		racing := &racingStore{Inspector: store, handOver: func() { _ = lc.Release(t.Context()) }}
		args := []string{"-yes", "release", "freed"}
		if force {
			args = append([]string{"-force"}, args...)
		}
		code, stdout, stderr = runOn(t, racing, args...)
		assert.Equal(t, 1, code)
		assert.Empty(t, stdout)
		assert.Equal(t, "guardctl: release freed: guard: lock not held (it was freed after it was shown)\n", stderr)
		lc, err = a.TryAcquire(t.Context(), "freed")
		require.NoError(t, err)
	}
}

// TestReleaseWakesWaiterOfAnotherSpelling: the services reach their PostgreSQL lock table
// through their search_path, the operator names it with its schema; a service waiting for the
// name guardctl releases must hear of the release — the holder's lease is an hour.
func TestReleaseWakesWaiterOfAnotherSpelling(t *testing.T) {
	pg := testserver.StartPostgres(t)
	require.Contains(t, pg.DSN, "://", "guardctl takes a postgres:// URL; %s must be one", testserver.PostgresDSNEnv)
	schema := "ctl_" + strings.ToLower(rand.Text()[:8])
	service := func(t *testing.T) guard.Backend {
		cfg, err := pgxpool.ParseConfig(pg.DSN)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pgstore.New(pool, pgstore.WithTable("locks"))
	}
	admin := service(t).(*pgstore.Store)
	_, err := pgxpoolOf(t, pg.DSN).Exec(t.Context(), "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	require.NoError(t, admin.CreateTable(t.Context()))

	holder := guardtest.Instance(t, service, guard.WithInstance("worker-A"))
	l, err := holder.TryAcquire(t.Context(), "nightly", guard.LeaseTime(time.Hour))
	require.NoError(t, err)
	spy := locktest.NewSpy(service(t), 16)
	waiter := guard.New(spy, guard.WithInstance("worker-B"))
	t.Cleanup(func() { _ = waiter.Close(context.Background()) })
	got := make(chan *guard.Lock, 1)
	go func() {
		w, err := waiter.Acquire(t.Context(), "nightly", guard.WaitTime(time.Minute))
		assert.NoError(t, err)
		got <- w
	}()
	<-spy.Busy() // waiting

	sep := "?"
	if strings.Contains(pg.DSN, "?") {
		sep = "&"
	}
	var stdout, stderr bytes.Buffer
	released := time.Now()
	code := run(t.Context(), []string{"-backend", pg.DSN + sep + "table=" + schema + ".locks", "-yes", "release", "nightly"},
		strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	select {
	case w := <-got:
		t.Logf("the waiter took the name %v after guardctl released it", time.Since(released))
		require.NotNil(t, w)
		assert.Greater(t, w.Fence(), l.Fence())
		require.NoError(t, w.Release(t.Context()))
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not hear guardctl's release: another channel")
	}
}

// pgxpoolOf returns a pool on dsn, closed when the test ends.
func pgxpoolOf(t *testing.T, dsn string) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
