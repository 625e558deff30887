package decorators_test

import (
	"context"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/decorators"
	"github.com/guardlock/guard/internal/guardtest"
	"github.com/guardlock/guard/memstore"
)

// runPrimitives runs the tests of Permits, Read, Write and FuncAll on the backend behind
// newGuard. Those of shared holds skip on a backend that grants none.
func runPrimitives(t *testing.T, newGuard guardtest.Factory) {
	t.Run("PermitsContention", func(t *testing.T) { testPermitsContention(t, newGuard) })
	t.Run("PermitsBusy", func(t *testing.T) { testPermitsBusy(t, newGuard) })
	t.Run("JobPermits", func(t *testing.T) { testJobPermits(t, newGuard) })
	t.Run("ReadWrite", func(t *testing.T) { testReadWrite(t, newGuard) })
	t.Run("ReadWriteContention", func(t *testing.T) { testReadWriteContention(t, newGuard) })
	t.Run("FuncAllContention", func(t *testing.T) { testFuncAllContention(t, newGuard) })
	t.Run("FuncAllBusy", func(t *testing.T) { testFuncAllBusy(t, newGuard) })
}

// requireShared fails the test on err: every backend the tests run grants shared holds, and
// a decorator built with Permits, Read or Write on it must build.
func requireShared(t *testing.T, err error) {
	t.Helper()
	require.NoError(t, err)
}

// occupancy counts the calls inside a section, and the most there ever were at once.
type occupancy struct{ inside, most atomic.Int32 }

func (o *occupancy) enter() {
	n := o.inside.Add(1)
	for m := o.most.Load(); n > m && !o.most.CompareAndSwap(m, n); m = o.most.Load() {
	}
}

func (o *occupancy) leave() { o.inside.Add(-1) }

// testPermitsContention: workers on three Guards call a function decorated with Permits(3) on
// two tenants' names; never more than 3 calls of one tenant run at once, and more than one do.
func testPermitsContention(t *testing.T, newGuard guardtest.Factory) {
	const permits, workers, calls = 3, 8, 8
	tenants := []string{"acme", "globex"}
	occ := map[string]*occupancy{"acme": {}, "globex": {}}
	guards := []*guard.Guard{newGuard(t), newGuard(t), newGuard(t)}
	tmpl := prefix(t) + "tenant:{.}:import"
	var wg sync.WaitGroup
	for w := range workers {
		f, err := decorators.Func(guards[w%len(guards)], tmpl, func(ctx context.Context, tenant string) (struct{}, error) {
			l, ok := guard.FromContext(ctx)
			if assert.True(t, ok) {
				assert.Equal(t, guard.KindPermit, l.Kind())
			}
			occ[tenant].enter()
			defer occ[tenant].leave()
			time.Sleep(2 * time.Millisecond) // the work: long enough for others to come in
			return struct{}{}, nil
		}, decorators.Permits(permits), guard.WaitTime(time.Minute))
		requireShared(t, err)
		wg.Go(func() {
			for range calls {
				_, err := f(t.Context(), tenants[w%len(tenants)])
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	for _, tenant := range tenants {
		most := occ[tenant].most.Load()
		assert.LessOrEqual(t, most, int32(permits), "%s: more calls inside than permits", tenant)
		assert.Greater(t, most, int32(1), "%s: the permits admitted one call at a time", tenant)
	}
}

// block is a decorated body that signals entered and stays inside until leave is closed.
func block(entered chan<- struct{}, leave <-chan struct{}) func(context.Context, string) (string, error) {
	return func(ctx context.Context, s string) (string, error) {
		select {
		case entered <- struct{}{}:
		case <-ctx.Done(): // the test failed and ended
			return "", ctx.Err()
		}
		select {
		case <-leave:
		case <-ctx.Done():
		}
		return s, nil
	}
}

// testPermitsBusy: with every permit of a name taken, a call finds it busy — a *BusyError
// whose Kind is KindPermit — and does not run; another name's permits are free.
func testPermitsBusy(t *testing.T, newGuard guardtest.Factory) {
	const permits = 2
	g, other := newGuard(t), newGuard(t)
	tmpl := prefix(t) + "partner:{.}"
	entered, leave := make(chan struct{}), make(chan struct{})
	holder, err := decorators.Func(other, tmpl, block(entered, leave), decorators.Permits(permits))
	requireShared(t, err)
	var calls atomic.Int32
	f := decorators.MustFunc(g, tmpl, func(ctx context.Context, s string) (string, error) {
		calls.Add(1)
		return s, nil
	}, decorators.Permits(permits))

	var wg sync.WaitGroup
	for range permits {
		wg.Go(func() {
			_, err := holder(t.Context(), "api")
			assert.NoError(t, err)
		})
		<-entered
	}
	_, err = f(t.Context(), "api")
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.ErrorIs(t, err, guard.ErrNotAcquired)
	assert.Equal(t, guard.KindPermit, busy.Kind)
	assert.Equal(t, prefix(t)+"partner:api", busy.Name)
	assert.Zero(t, calls.Load(), "fn ran without a permit")

	r, err := f(t.Context(), "other")
	require.NoError(t, err, "another name has permits of its own")
	assert.Equal(t, "other", r)

	close(leave)
	wg.Wait()
	_, err = f(t.Context(), "api")
	require.NoError(t, err, "the permits came back")
}

// testJobPermits: Job with Permits(2) runs two calls at once, and a third finds it busy.
func testJobPermits(t *testing.T, newGuard guardtest.Factory) {
	g := newGuard(t)
	entered, leave := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	job, err := decorators.Job(g, prefix(t)+"reindex", func(ctx context.Context) error {
		if calls.Add(1) > 2 {
			return nil // a third call inside: the test fails below
		}
		select {
		case entered <- struct{}{}:
		case <-ctx.Done(): // the test failed and ended
			return ctx.Err()
		}
		select {
		case <-leave:
		case <-ctx.Done():
		}
		return nil
	}, decorators.Permits(2))
	requireShared(t, err)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { assert.NoError(t, job(t.Context())) })
		<-entered
	}
	var busy *guard.BusyError
	err = job(t.Context())
	close(leave)
	require.ErrorAs(t, err, &busy, "a third call ran beside two with two permits")
	assert.Equal(t, guard.KindPermit, busy.Kind)
	wg.Wait()
}

// testReadWrite: readers run together; a writer finds readers busy, and a reader a writer,
// with the Kind of what each asked for.
func testReadWrite(t *testing.T, newGuard guardtest.Factory) {
	g1, g2 := newGuard(t), newGuard(t)
	tmpl := prefix(t) + "doc:{.}"
	entered, leave := make(chan struct{}), make(chan struct{})
	reader, err := decorators.Func(g1, tmpl, block(entered, leave), decorators.Read())
	requireShared(t, err)
	var wrote atomic.Int32
	writer := decorators.MustFunc(g2, tmpl, func(ctx context.Context, s string) (string, error) {
		l, _ := guard.FromContext(ctx)
		assert.Equal(t, guard.KindWrite, l.Kind())
		wrote.Add(1)
		return s, nil
	}, decorators.Write())
	quickReader := decorators.MustFunc(g2, tmpl, func(ctx context.Context, s string) (string, error) {
		l, _ := guard.FromContext(ctx)
		assert.Equal(t, guard.KindRead, l.Kind())
		return s, nil
	}, decorators.Read())

	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := reader(t.Context(), "7")
		assert.NoError(t, err)
	})
	<-entered
	_, err = quickReader(t.Context(), "7")
	require.NoError(t, err, "a second reader runs beside the first")
	_, err = writer(t.Context(), "7")
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy, "a writer ran beside a reader")
	assert.Equal(t, guard.KindWrite, busy.Kind)
	assert.Zero(t, wrote.Load())
	close(leave)
	wg.Wait()

	// A writer inside: readers find the name busy.
	wEntered, wLeave := make(chan struct{}), make(chan struct{})
	longWriter := decorators.MustFunc(g1, tmpl, block(wEntered, wLeave), decorators.Write())
	wg.Go(func() {
		_, err := longWriter(t.Context(), "7")
		assert.NoError(t, err)
	})
	<-wEntered
	_, err = quickReader(t.Context(), "7")
	require.ErrorAs(t, err, &busy, "a reader ran beside a writer")
	assert.Equal(t, guard.KindRead, busy.Kind)
	close(wLeave)
	wg.Wait()
	_, err = writer(t.Context(), "7")
	require.NoError(t, err)
}

// testReadWriteContention: readers and writers on three Guards, one name, waiting for each
// other; never a writer beside anyone.
func testReadWriteContention(t *testing.T, newGuard guardtest.Factory) {
	const workers, calls = 6, 10
	guards := []*guard.Guard{newGuard(t), newGuard(t), newGuard(t)}
	tmpl := prefix(t) + "doc:{.}"
	var readers, writers, overlaps atomic.Int32
	var version int // written only by writers: the race detector sees a writer beside a reader
	read := func(ctx context.Context, id int) (int, error) {
		readers.Add(1)
		defer readers.Add(-1)
		if writers.Load() != 0 {
			overlaps.Add(1)
		}
		v := version
		time.Sleep(time.Millisecond)
		return v, nil
	}
	write := func(ctx context.Context, id int) (int, error) {
		defer writers.Add(-1)
		if writers.Add(1) != 1 || readers.Load() != 0 {
			overlaps.Add(1)
		}
		version++
		time.Sleep(time.Millisecond)
		return version, nil
	}
	var wg sync.WaitGroup
	for w := range workers {
		g := guards[w%len(guards)]
		r, err := decorators.Func(g, tmpl, read, decorators.Read(), guard.WaitTime(time.Minute))
		requireShared(t, err)
		wr := decorators.MustFunc(g, tmpl, write, decorators.Write(), guard.WaitTime(time.Minute))
		wg.Go(func() {
			for i := range calls {
				f := r
				if (w+i)%3 == 0 {
					f = wr
				}
				_, err := f(t.Context(), 1)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, overlaps.Load(), "a writer ran beside another caller")
}

// Accounts names the two accounts of a transfer.
type Accounts struct{ From, To int }

// testFuncAllContention: transfers among three accounts, in both directions, from three
// Guards: each account's name is held by one transfer at a time, and callers whose sets
// overlap in different orders never deadlock (the test ends).
func testFuncAllContention(t *testing.T, newGuard guardtest.Factory) {
	const accounts, workers, calls = 3, 6, 10
	guards := []*guard.Guard{newGuard(t), newGuard(t), newGuard(t)}
	templates := []string{prefix(t) + "account:{From}", prefix(t) + "account:{To}"}
	var inside [accounts]atomic.Int32
	var overlaps atomic.Int32
	var balance [accounts]int // written only under both accounts' locks
	for i := range balance {
		balance[i] = 100
	}
	transfer := func(ctx context.Context, tr Accounts) (struct{}, error) {
		l, ok := guard.FromContext(ctx)
		if assert.True(t, ok) {
			assert.Len(t, l.Members(), 2)
		}
		for _, a := range []int{tr.From, tr.To} {
			if inside[a].Add(1) != 1 {
				overlaps.Add(1)
			}
		}
		balance[tr.From]--
		balance[tr.To]++
		time.Sleep(time.Millisecond)
		for _, a := range []int{tr.From, tr.To} {
			inside[a].Add(-1)
		}
		return struct{}{}, nil
	}
	var wg sync.WaitGroup
	for w := range workers {
		f := decorators.MustFuncAll(guards[w%len(guards)], templates, transfer, guard.WaitTime(time.Minute))
		wg.Go(func() {
			for range calls {
				from := mrand.N(accounts)
				to := (from + 1 + mrand.N(accounts-1)) % accounts
				_, err := f(t.Context(), Accounts{From: from, To: to})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, overlaps.Load(), "two transfers held one account at once")
	sum := 0
	for _, b := range balance {
		sum += b
	}
	assert.Equal(t, 100*accounts, sum)
}

// testFuncAllBusy: one busy name makes the call fail with that name's BusyError, holding none;
// a name rendered twice is taken once.
func testFuncAllBusy(t *testing.T, newGuard guardtest.Factory) {
	g, other := newGuard(t), newGuard(t)
	templates := []string{prefix(t) + "account:{From}", prefix(t) + "account:{To}"}
	var calls atomic.Int32
	f := decorators.MustFuncAll(g, templates, func(ctx context.Context, tr Accounts) (int, error) {
		calls.Add(1)
		l, _ := guard.FromContext(ctx)
		return len(l.Members()), nil
	})
	held, err := other.TryAcquire(t.Context(), prefix(t)+"account:2")
	require.NoError(t, err)

	_, err = f(t.Context(), Accounts{From: 1, To: 2})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, prefix(t)+"account:2", busy.Name)
	assert.Zero(t, calls.Load(), "fn ran without every lock")
	free, err := other.TryAcquire(t.Context(), prefix(t)+"account:1")
	require.NoError(t, err, "a failed call left the other account locked")
	require.NoError(t, free.Release(t.Context()))
	require.NoError(t, held.Release(t.Context()))

	n, err := f(t.Context(), Accounts{From: 1, To: 1})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "an account named twice is locked once")
	n, err = f(t.Context(), Accounts{From: 2, To: 1})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
}

// exclusiveOnly is a backend without shared holds.
type exclusiveOnly struct{ guard.Backend }

func TestPrimitiveOptionErrors(t *testing.T) {
	g := newMemGuard(t)
	fn := func(ctx context.Context, tr Accounts) (int, error) { return 0, nil }
	job := func(context.Context) error { return nil }
	tests := []struct {
		name   string
		build  func() error
		option string
	}{
		{"no permits", func() error {
			_, err := decorators.Func(g, "t:{From}", fn, decorators.Permits(0))
			return err
		}, "Permits"},
		{"job without permits", func() error {
			_, err := decorators.Job(g, "job", job, decorators.Permits(-1))
			return err
		}, "Permits"},
		{"permits with a side", func() error {
			_, err := decorators.Func(g, "t:{From}", fn, decorators.Permits(2), decorators.Read())
			return err
		}, "Permits"},
		{"FuncAll with permits", func() error {
			_, err := decorators.FuncAll(g, []string{"t:{From}"}, fn, decorators.Permits(2))
			return err
		}, "Permits"},
		{"FuncAll with a side", func() error {
			_, err := decorators.FuncAll(g, []string{"t:{From}"}, fn, decorators.Write())
			return err
		}, "Write"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.build()
			var oe *guard.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tt.option, oe.Option)
		})
	}
	t.Run("side message", func(t *testing.T) {
		_, err := decorators.FuncAll(g, []string{"t:{From}"}, fn, decorators.Read())
		assert.ErrorContains(t, err, "invalid option Read(): ")
	})

	t.Run("FuncAll names", func(t *testing.T) {
		_, err := decorators.FuncAll(g, nil, fn)
		assert.ErrorIs(t, err, guard.ErrInvalidName)
		_, err = decorators.FuncAll(g, []string{"t:{From}", "t:{Nope}"}, fn)
		var ne *guard.NameError
		require.ErrorAs(t, err, &ne)
		assert.Equal(t, "t:{Nope}", ne.Name)
		assert.PanicsWithValue(t, "guard/decorators: "+err.Error(), func() {
			decorators.MustFuncAll(g, []string{"t:{From}", "t:{Nope}"}, fn)
		})
	})

	t.Run("backend without shared holds", func(t *testing.T) {
		plain := guard.New(exclusiveOnly{memstore.New()})
		t.Cleanup(func() { _ = plain.Close(context.Background()) })
		_, err := decorators.Func(plain, "t:{From}", fn, decorators.Permits(2))
		assert.ErrorIs(t, err, guard.ErrUnsupported)
		_, err = decorators.Job(plain, "job", job, decorators.Read())
		assert.ErrorIs(t, err, guard.ErrUnsupported)
		_, err = decorators.FuncAll(plain, []string{"t:{From}", "t:{To}"}, fn)
		assert.NoError(t, err, "FuncAll takes locks, which every backend grants")
	})
}
