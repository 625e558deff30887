package decorators_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/internal/guardtest"
)

func TestMemstore(t *testing.T) { runSuite(t, guardtest.Memory()) }

func TestRedis(t *testing.T) { runSuite(t, guardtest.Redis(t)) }

// runSuite runs the decorator tests on the backend behind newGuard.
func runSuite(t *testing.T, newGuard guardtest.Factory) {
	t.Run("LockContext", func(t *testing.T) { testLockContext(t, newGuard) })
	t.Run("Busy", func(t *testing.T) { testBusy(t, newGuard) })
	t.Run("WaitTimeout", func(t *testing.T) { testWaitTimeout(t, newGuard) })
	t.Run("WaitThenRun", func(t *testing.T) { testWaitThenRun(t, newGuard) })
	t.Run("Contention", func(t *testing.T) { testContention(t, newGuard) })
	t.Run("DifferentKeysInParallel", func(t *testing.T) { testDifferentKeys(t, newGuard) })
	t.Run("Injective", func(t *testing.T) { testInjective(t, newGuard) })
	t.Run("Reentrant", func(t *testing.T) { testReentrant(t, newGuard) })
	t.Run("ReleaseAfterPanic", func(t *testing.T) { testPanic(t, newGuard) })
	t.Run("ReleaseAfterCallerCancel", func(t *testing.T) { testCallerCancel(t, newGuard) })
	t.Run("LeaseExpired", func(t *testing.T) { testLeaseExpired(t, newGuard) })
	t.Run("RenderErrors", func(t *testing.T) { testRenderErrors(t, newGuard) })
	t.Run("ScheduledJob", func(t *testing.T) { testScheduledJob(t, newGuard) })
	t.Run("Batch", func(t *testing.T) { testBatch(t, newGuard) })
	runPrimitives(t, newGuard)
}

type Tenant struct{ ID string }

type Order struct {
	ID     string
	Tenant *Tenant
	Labels map[string]string
	Kind   string
}

// held reports the lock a decorated function runs under.
func held(ctx context.Context, o Order) (string, error) {
	l, ok := guard.FromContext(ctx)
	if !ok {
		return "", errors.New("no lock in context")
	}
	return l.Name(), nil
}

func testLockContext(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	tmpl := prefix(t) + "tenant:{Tenant.ID}:import:{Kind}"
	var lock *guard.Lock
	f, err := decorators.Func(g, tmpl, func(ctx context.Context, o Order) (uint64, error) {
		l, ok := guard.FromContext(ctx)
		require.True(t, ok)
		assert.NoError(t, ctx.Err())
		lock = l
		return l.Fence(), nil
	})
	require.NoError(t, err)

	fence, err := f(t.Context(), Order{Tenant: &Tenant{ID: "acme"}, Kind: "invoices"})
	require.NoError(t, err)
	assert.Equal(t, prefix(t)+"tenant:acme:import:invoices", lock.Name())
	assert.Equal(t, tmpl, lock.Label(), "telemetry label is the template")
	assert.NotZero(t, fence)
	assert.Equal(t, lock.Fence(), fence)
	<-lock.Done() // released when f returned
	assert.ErrorIs(t, context.Cause(lock.Context()), guard.ErrReleased)

	fence2, err := f(t.Context(), Order{Tenant: &Tenant{ID: "acme"}, Kind: "invoices"})
	require.NoError(t, err)
	assert.Greater(t, fence2, fence, "fences increase per name")
}

func testBusy(t *testing.T, newGuard guardtest.Factory) {
	g, other := newGuard(t), newGuard(t)
	var calls atomic.Int32
	f := decorators.MustFunc(g, prefix(t)+"orders:{ID}", func(ctx context.Context, o Order) (string, error) {
		calls.Add(1)
		return "done", nil
	})
	l, err := other.TryAcquire(t.Context(), prefix(t)+"orders:7")
	require.NoError(t, err)

	r, err := f(t.Context(), Order{ID: "7"})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, prefix(t)+"orders:7", busy.Name)
	assert.Empty(t, r)
	assert.Zero(t, calls.Load(), "fn must not run when the lock is busy")

	require.NoError(t, l.Release(t.Context()))
	r, err = f(t.Context(), Order{ID: "7"})
	require.NoError(t, err)
	assert.Equal(t, "done", r)
}

func testWaitTimeout(t *testing.T, newGuard guardtest.Factory) {
	g, other := newGuard(t), newGuard(t)
	l, err := other.TryAcquire(t.Context(), prefix(t)+"orders:7")
	require.NoError(t, err)
	defer l.Release(context.Background())

	const wait = 100 * time.Millisecond
	f := decorators.MustFunc(g, prefix(t)+"orders:{ID}", held, guard.WaitTime(wait))
	start := time.Now()
	_, err = f(t.Context(), Order{ID: "7"})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	assert.GreaterOrEqual(t, time.Since(start), wait, "WaitTime makes the call wait")
}

func testWaitThenRun(t *testing.T, newGuard guardtest.Factory) {
	g1, g2 := newGuard(t), newGuard(t)
	var inside atomic.Int32
	var overlaps atomic.Int32
	entered, leave := make(chan struct{}), make(chan struct{})
	body := func(ctx context.Context, o Order) (string, error) {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		defer inside.Add(-1)
		if o.Kind == "first" {
			close(entered)
			select {
			case <-leave:
			case <-ctx.Done(): // the test failed and ended
			}
		}
		return o.Kind, nil
	}
	first := decorators.MustFunc(g1, prefix(t)+"orders:{ID}", body)
	second := decorators.MustFunc(g2, prefix(t)+"orders:{ID}", body, guard.WaitTime(time.Minute))

	done := make(chan error, 1)
	go func() {
		_, err := first(t.Context(), Order{ID: "7", Kind: "first"})
		done <- err
	}()
	<-entered
	result := make(chan error, 1)
	go func() {
		_, err := second(t.Context(), Order{ID: "7", Kind: "second"})
		result <- err
	}()
	close(leave)
	require.NoError(t, <-done)
	require.NoError(t, <-result, "the waiting call runs once the holder is done")
	assert.Zero(t, overlaps.Load())
}

func testContention(t *testing.T, newGuard guardtest.Factory) {
	const workers, calls = 6, 15
	var (
		inside   atomic.Int32
		overlaps atomic.Int32
		counter  int // written only under the lock: the race detector catches a failure
	)
	guards := []*guard.Guard{newGuard(t), newGuard(t), newGuard(t)}
	var wg sync.WaitGroup
	for w := range workers {
		f := decorators.MustFunc(guards[w%len(guards)], prefix(t)+"account:{.}",
			func(ctx context.Context, account int) (struct{}, error) {
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				counter++
				for range 20 {
					runtime.Gosched() // widen the window in which an overlap would be seen
				}
				inside.Add(-1)
				return struct{}{}, nil
			}, guard.WaitTime(time.Minute))
		wg.Go(func() {
			for range calls {
				_, err := f(t.Context(), 42)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, overlaps.Load(), "two holders of one name ran at once")
	assert.Equal(t, workers*calls, counter)
}

func testDifferentKeys(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	entered := make(chan string, 2)
	both := make(chan struct{})
	f := decorators.MustFunc(g, prefix(t)+"account:{ID}", func(ctx context.Context, o Order) (string, error) {
		entered <- o.ID
		select {
		case <-both: // returns only once both calls are inside
		case <-ctx.Done():
		}
		return o.ID, nil
	})
	errs := make(chan error, 2)
	for _, id := range []string{"1", "2"} {
		go func() {
			_, err := f(t.Context(), Order{ID: id})
			errs <- err
		}()
	}
	// The default is one attempt: if the two accounts shared a lock, one call would fail
	// instead of entering.
	got := map[string]bool{}
	for range 2 {
		select {
		case id := <-entered:
			got[id] = true
		case err := <-errs:
			t.Fatalf("a call ended before both were inside: %v", err)
		}
	}
	close(both)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	assert.Equal(t, map[string]bool{"1": true, "2": true}, got)
}

type Pair struct{ A, B string }

func testInjective(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	p := prefix(t)
	hold, release := make(chan struct{}), make(chan struct{})
	names := make(chan string, 2)
	f := decorators.MustFunc(g, p+"{A}:{B}", func(ctx context.Context, v Pair) (struct{}, error) {
		l, _ := guard.FromContext(ctx)
		names <- l.Name()
		if v.A == "x:y" {
			close(hold)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return struct{}{}, nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := f(t.Context(), Pair{A: "x:y", B: "z"})
		done <- err
	}()
	<-hold
	// ("x:y","z") is held; ("x","y:z") must be another lock.
	_, err := f(t.Context(), Pair{A: "x", B: "y:z"})
	require.NoError(t, err)
	close(release)
	require.NoError(t, <-done)
	n1, n2 := <-names, <-names
	assert.NotEqual(t, n1, n2)
	assert.ElementsMatch(t, []string{p + "x%3Ay:z", p + "x:y%3Az"}, []string{n1, n2})
}

func testReentrant(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	var depth func(ctx context.Context, o Order) (int, error)
	f := decorators.MustFunc(g, prefix(t)+"orders:{ID}", func(ctx context.Context, o Order) (int, error) {
		if o.Kind == "" {
			return 0, nil
		}
		o.Kind = o.Kind[1:]
		n, err := depth(ctx, o) // the same name, under the lock's context
		return n + 1, err
	})
	depth = f
	n, err := f(t.Context(), Order{ID: "7", Kind: "xxx"})
	require.NoError(t, err, "a nested call on the same name must re-enter, not find itself busy")
	assert.Equal(t, 3, n)

	// The outermost call released the name.
	l, err := newGuard(t).TryAcquire(t.Context(), prefix(t)+"orders:7")
	require.NoError(t, err)
	require.NoError(t, l.Release(t.Context()))
}

func testPanic(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	f := decorators.MustFunc(g, prefix(t)+"orders:{ID}", func(ctx context.Context, o Order) (int, error) {
		panic("boom")
	})
	assert.PanicsWithValue(t, "boom", func() { _, _ = f(t.Context(), Order{ID: "7"}) }, "the panic goes on")

	l, err := newGuard(t).TryAcquire(t.Context(), prefix(t)+"orders:7")
	require.NoError(t, err, "released after the panic")
	require.NoError(t, l.Release(t.Context()))
}

func testCallerCancel(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	ctx, cancel := context.WithCancel(t.Context())
	f := decorators.MustFunc(g, prefix(t)+"orders:{ID}", func(ctx context.Context, o Order) (int, error) {
		cancel()
		<-ctx.Done() // the lock's context follows the caller's
		return 1, nil
	})
	_, _ = f(ctx, Order{ID: "7"})

	l, err := newGuard(t).TryAcquire(t.Context(), prefix(t)+"orders:7")
	require.NoError(t, err, "released although the caller's context was cancelled")
	require.NoError(t, l.Release(t.Context()))
}

func testLeaseExpired(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	f := decorators.MustFunc(g, prefix(t)+"orders:{ID}", func(ctx context.Context, o Order) (int, error) {
		<-ctx.Done()
		return 0, context.Cause(ctx)
	}, guard.LeaseTime(50*time.Millisecond))
	_, err := f(t.Context(), Order{ID: "7"})
	assert.ErrorIs(t, err, guard.ErrLeaseExpired)
}

func testRenderErrors(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	var calls atomic.Int32
	tmpl := prefix(t) + "tenant:{Tenant.ID}:{Labels.region}"
	f := decorators.MustFunc(g, tmpl, func(ctx context.Context, o Order) (int, error) {
		calls.Add(1)
		return 0, nil
	})
	tests := []struct {
		name   string
		order  Order
		reason string
	}{
		{"nil pointer", Order{Labels: map[string]string{"region": "eu"}}, "Tenant is a nil pointer"},
		{"empty value", Order{Tenant: &Tenant{}, Labels: map[string]string{"region": "eu"}}, "{Tenant.ID}: empty value"},
		{"missing map key", Order{Tenant: &Tenant{ID: "a"}}, `Labels has no key "region"`},
		{"empty map value", Order{Tenant: &Tenant{ID: "a"}, Labels: map[string]string{"region": ""}}, "{Labels.region}: empty value"},
		{"too long", Order{Tenant: &Tenant{ID: strings.Repeat("x", guard.MaxNameLen)}, Labels: map[string]string{"region": "eu"}}, "more than 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f(t.Context(), tt.order)
			require.ErrorIs(t, err, guard.ErrInvalidName)
			var ne *guard.NameError
			require.ErrorAs(t, err, &ne)
			assert.Contains(t, ne.Reason, tt.reason)
			assert.Equal(t, tmpl, ne.Name, "the template, as docs/templates.md says")
			assert.NotContains(t, err.Error(), "xxxx", "the error does not carry the argument's data")
		})
	}
	assert.Zero(t, calls.Load(), "fn must not run without its lock")
}

func testScheduledJob(t *testing.T, newGuard guardtest.Factory) {
	// Three instances run the same job on the same schedule.
	run := func(t *testing.T, opts ...guard.LockOption) (runs []int, busy int) {
		var mu sync.Mutex // protects runs
		name := prefix(t) + "report:daily"
		for i := range 3 {
			job := decorators.MustJob(newGuard(t), name, func(ctx context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				runs = append(runs, i)
				return nil
			}, opts...)
			err := job(t.Context()) // each instance's tick comes after the previous job ended
			if errors.Is(err, guard.ErrNotAcquired) {
				busy++
				continue
			}
			require.NoError(t, err)
		}
		return runs, busy
	}
	t.Run("MinHold", func(t *testing.T) {
		runs, busy := run(t, guard.MinHold(time.Hour))
		assert.Equal(t, []int{0}, runs, "once per window across instances")
		assert.Equal(t, 2, busy)
	})
	t.Run("WithoutMinHold", func(t *testing.T) {
		// The control: a fast job without MinHold runs on every instance.
		runs, _ := run(t)
		assert.Equal(t, []int{0, 1, 2}, runs)
	})
	t.Run("Concurrent", func(t *testing.T) {
		var runs atomic.Int32
		start := make(chan struct{})
		errs := make(chan error, 3)
		name := prefix(t) + "report:daily"
		for range 3 {
			job := decorators.MustJob(newGuard(t), name, func(ctx context.Context) error {
				runs.Add(1)
				return nil
			}, guard.MinHold(time.Hour))
			go func() {
				<-start
				errs <- job(t.Context())
			}()
		}
		close(start)
		var busy int
		for range 3 {
			if err := <-errs; errors.Is(err, guard.ErrNotAcquired) {
				busy++
			} else {
				require.NoError(t, err)
			}
		}
		assert.Equal(t, int32(1), runs.Load())
		assert.Equal(t, 2, busy)
	})
}

type Task struct{ ID int }

func testBatch(t *testing.T, newGuard guardtest.Factory) {
	const items, instances = 30, 3
	var (
		inside      [items]atomic.Int32 // per item: callers inside right now
		overlaps    atomic.Int32
		mu          sync.Mutex // protects processedBy
		processedBy = map[int][]int{}
	)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for inst := range instances {
		process := decorators.MustFunc(newGuard(t), prefix(t)+"task:{ID}", func(ctx context.Context, task Task) (struct{}, error) {
			if inside[task.ID].Add(1) != 1 {
				overlaps.Add(1)
			}
			defer inside[task.ID].Add(-1)
			mu.Lock()
			processedBy[task.ID] = append(processedBy[task.ID], inst)
			mu.Unlock()
			return struct{}{}, nil
		}, guard.MinHold(time.Hour))
		wg.Go(func() {
			<-start
			// Every instance walks the whole batch, each from another place.
			for k := range items {
				id := (k + inst*items/instances) % items
				_, err := process(t.Context(), Task{ID: id})
				if err != nil && !errors.Is(err, guard.ErrNotAcquired) {
					t.Errorf("task %d: %v", id, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	assert.Zero(t, overlaps.Load())
	for id := range items {
		assert.Len(t, processedBy[id], 1, "task %d processed by instances %v", id, processedBy[id])
	}
}
