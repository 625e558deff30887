package etcdstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// sharedReq is a shared request of limit for name and tok.
func sharedReq(name, tok string, limit int) guard.Request {
	return guard.Request{Name: name, Token: tok, TTL: 10 * time.Second, Shared: true, Limit: limit}
}

// TestShared: permits up to the limit, each with its own fence, counted in round trips; a
// writer alone, and a waiting writer holds later readers back; Inspect, List and ForceRelease
// per holder.
func TestShared(t *testing.T) {
	c := testserver.StartEtcd(t)
	a, art := newCounted(t, c.Endpoints())
	b, _ := newCounted(t, c.Endpoints())
	ctx := t.Context()

	n := art.Load()
	f1, err := a.Acquire(ctx, sharedReq("sem", "a1", 2))
	require.NoError(t, err)
	assert.EqualValues(t, 1, art.Load()-n, "a free name: one transaction")
	n = art.Load()
	f2, err := a.Acquire(ctx, sharedReq("sem", "a2", 2))
	require.NoError(t, err)
	assert.EqualValues(t, 1, art.Load()-n, "beside a holder: one transaction")
	assert.Greater(t, f2, f1)
	_, err = b.Acquire(ctx, sharedReq("sem", "b1", 2))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a third permit of two")
	info, err := b.Inspect(ctx, "sem")
	require.NoError(t, err)
	assert.Equal(t, 2, info.Holders)
	assert.Equal(t, f2, info.Fence, "the newest holder")
	assert.True(t, info.Shared)
	page, _, err := b.List(ctx, "se", "", 10)
	require.NoError(t, err)
	require.Len(t, page, 2)
	assert.Equal(t, []uint64{f1, f2}, []uint64{page[0].Fence, page[1].Fence})

	n = art.Load()
	require.NoError(t, a.Release(ctx, "sem", "a1", 0))
	assert.EqualValues(t, 1, art.Load()-n, "release")
	f3, err := b.Acquire(ctx, sharedReq("sem", "b1", 2))
	require.NoError(t, err)
	assert.Greater(t, f3, f2)

	// A writer waits for the readers, and readers that come after it wait for it.
	w := guard.Request{Name: "sem", Token: "w", TTL: 10 * time.Second, Wait: true}
	_, err = b.Acquire(ctx, w)
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	_, err = a.Acquire(ctx, sharedReq("sem", "a3", 0))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a reader passed the waiting writer")
	require.NoError(t, a.ForceRelease(ctx, "sem", f2))
	var changed *guard.ChangedHandsError
	require.ErrorAs(t, a.ForceRelease(ctx, "sem", f2), &changed, "broken already")
	require.NoError(t, b.Release(ctx, "sem", "b1", 0))
	fw, err := b.Acquire(ctx, w)
	require.NoError(t, err, "the writer's turn")
	assert.Greater(t, fw, f3)
	require.NoError(t, b.Release(ctx, "sem", "w", 0))
	_, err = a.Acquire(ctx, sharedReq("sem", "a3", 0))
	require.NoError(t, err)
	_, err = a.Acquire(ctx, sharedReq("sem", "a4", 0))
	require.NoError(t, err)
	require.NoError(t, a.ForceRelease(ctx, "sem", 0))
	info, err = b.Inspect(ctx, "sem")
	require.NoError(t, err)
	assert.False(t, info.Held, "ForceRelease 0 frees every holder")
}

// TestSharedHandOver: a release hands the permit it frees to the first waiter, whose Guard
// takes it from the notice; several readers are handed the name at once when a writer goes.
func TestSharedHandOver(t *testing.T) {
	c := testserver.StartEtcd(t)
	var most, inside atomic.Int32
	var wg sync.WaitGroup
	var sems []*guard.Semaphore
	for range 3 {
		s, _ := newCounted(t, c.Endpoints())
		g := guard.New(s)
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		sem, err := g.Semaphore("handover", 3)
		require.NoError(t, err)
		sems = append(sems, sem)
	}
	var done atomic.Int32
	for i := range 12 {
		sem := sems[i%3]
		wg.Go(func() {
			for done.Load() < 120 {
				err := sem.Do(t.Context(), func(context.Context) error {
					n := inside.Add(1)
					defer inside.Add(-1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(2 * time.Millisecond)
					done.Add(1)
					return nil
				}, guard.WaitTime(30*time.Second))
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int32(3))
	assert.Equal(t, int32(3), most.Load(), "the permits were never all in use")
}

// TestAcquireAll: free names are taken at once, in one transaction; with one of them held,
// none is.
func TestAcquireAll(t *testing.T) {
	c := testserver.StartEtcd(t)
	a, art := newCounted(t, c.Endpoints())
	b, _ := newCounted(t, c.Endpoints())
	ctx := t.Context()
	req := func(name, tok string) guard.Request {
		return guard.Request{Name: name, Token: tok, TTL: 10 * time.Second}
	}
	n := art.Load()
	fences, err := a.AcquireAll(ctx, []guard.Request{req("m1", "a"), req("m2", "a"), sharedReq("m3", "a", 2)})
	require.NoError(t, err)
	assert.EqualValues(t, 1, art.Load()-n, "one transaction")
	require.Len(t, fences, 3)
	_, err = b.AcquireAll(ctx, []guard.Request{req("m4", "b"), req("m2", "b")})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "m2", busy.Name)
	info, err := b.Inspect(ctx, "m4")
	require.NoError(t, err)
	assert.False(t, info.Held, "a name of a batch that failed was taken")
	for _, name := range []string{"m1", "m2", "m3"} {
		require.NoError(t, a.Release(ctx, name, "a", 0))
	}
	_, err = b.AcquireAll(ctx, []guard.Request{req("m4", "b"), req("m2", "b")})
	require.NoError(t, err)
}

// TestElectionHandover logs how soon a waiting candidate leads after the leader resigns, and
// after the term of a leader that stops renewing ends (its 1 s lease is never renewed nor
// released). It checks only that the terms follow each other in order.
func TestElectionHandover(t *testing.T) {
	srv := testserver.StartEtcd(t)
	var elections []*guard.Election
	var store *Store
	for range 2 {
		s, _ := newCounted(t, srv.Endpoints())
		store = s
		g := guard.New(s)
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		e, err := guard.NewElection(g, "handover")
		require.NoError(t, err)
		elections = append(elections, e)
	}
	for _, resign := range []bool{true, false} {
		var opts []guard.LockOption
		if !resign {
			opts = append(opts, guard.LeaseTime(time.Second))
		}
		term, err := elections[0].Campaign(t.Context(), "first", opts...)
		require.NoError(t, err)
		next := make(chan *guard.Lock, 1)
		go func() {
			l, err := elections[1].Campaign(t.Context(), "second")
			assert.NoError(t, err)
			next <- l
		}()
		require.Eventually(t, func() bool { // the second candidate waits in etcd's queue
			info, err := store.Inspect(t.Context(), "handover")
			return err == nil && info.Waiting > 0
		}, 10*time.Second, 5*time.Millisecond)
		from := time.Now()
		if resign {
			require.NoError(t, elections[0].Resign(t.Context()))
		} else {
			from = term.Deadline()
		}
		l := <-next
		require.NotNil(t, l)
		t.Logf("resigned %v: the next term began %v after the leader's term ended", resign, time.Since(from))
		assert.Greater(t, l.Fence(), term.Fence())
		require.NoError(t, elections[1].Resign(t.Context()))
	}
}

// TestSharedKeepAndHandOver: a permit released with a MinHold window left stays taken, under
// no token; a waiter the name is handed to extends its permit, which then moves to a holder's
// lease, while a waiter that is not handed anything cannot extend.
func TestSharedKeepAndHandOver(t *testing.T) {
	c := testserver.StartEtcd(t)
	a, _ := newCounted(t, c.Endpoints())
	b, _ := newCounted(t, c.Endpoints())
	ctx := t.Context()
	_, err := a.Acquire(ctx, sharedReq("k", "a", 1))
	require.NoError(t, err)
	wb := sharedReq("k", "b", 1)
	wb.Wait = true
	_, err = b.Acquire(ctx, wb)
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	wc := sharedReq("k", "c", 1)
	wc.Wait = true
	_, err = b.Acquire(ctx, wc)
	require.ErrorIs(t, err, guard.ErrNotAcquired)

	require.NoError(t, a.Release(ctx, "k", "a", 300*time.Millisecond))
	info, err := b.Inspect(ctx, "k")
	require.NoError(t, err)
	assert.True(t, info.Kept)
	assert.Equal(t, 2, info.Waiting)
	errs := a.Extend(ctx, []guard.Lease{{Name: "k", Token: "a", TTL: 10 * time.Second}})
	require.ErrorIs(t, errs[0], guard.ErrNotHeld, "a late renewal extended a kept permit")

	// Once the window ends, b holds the name: handed over, not asked for.
	require.Eventually(t, func() bool {
		info, err := b.Inspect(ctx, "k")
		return err == nil && info.Held && !info.Kept
	}, 5*time.Second, 10*time.Millisecond)
	errs = b.Extend(ctx, []guard.Lease{
		{Name: "k", Token: "b", TTL: 10 * time.Second},
		{Name: "k", Token: "c", TTL: 10 * time.Second},
	})
	require.NoError(t, errs[0], "the permit handed over")
	require.ErrorIs(t, errs[1], guard.ErrNotHeld, "a waiter")
	require.NoError(t, b.Release(ctx, "k", "b", 0))
	fc, err := b.Acquire(ctx, wc)
	require.NoError(t, err, "c's turn")
	assert.Positive(t, fc)
}

// TestListSharedPages: List pages through a name whose shared holders do not fit in one page,
// each holder once, in fence order.
func TestListSharedPages(t *testing.T) {
	c := testserver.StartEtcd(t)
	a, _ := newCounted(t, c.Endpoints())
	ctx := t.Context()
	var want []uint64
	for _, tok := range []string{"1", "2", "3", "4", "5"} {
		f, err := a.Acquire(ctx, sharedReq("pages/b", tok, 0))
		require.NoError(t, err)
		want = append(want, f)
	}
	fa, err := a.Acquire(ctx, guard.Request{Name: "pages/a", Token: "x", TTL: 10 * time.Second})
	require.NoError(t, err)
	fc, err := a.Acquire(ctx, guard.Request{Name: "pages/c", Token: "x", TTL: 10 * time.Second})
	require.NoError(t, err)
	want = append([]uint64{fa}, append(want, fc)...)
	var got []uint64
	cursor := ""
	for range 10 {
		page, next, err := a.List(ctx, "pages/", cursor, 2)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), 2)
		for _, p := range page {
			got = append(got, p.Fence)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	assert.Equal(t, want, got)
}

// TestSharedWaiterWhosePlaceRanOut: a waiter whose key is gone when it asks again (its place
// ran out while its process was paused) is told the name is busy and queued anew — never
// granted a permit with fence 0 beside the holder (review of issue 18: after a 5 s SIGSTOP a
// waiter on Semaphore(1) got a permit with fence 0 in 4 of 4 runs).
func TestSharedWaiterWhosePlaceRanOut(t *testing.T) {
	c := testserver.StartEtcd(t)
	s, _ := newCounted(t, c.Endpoints())
	ctx := t.Context()
	held, err := s.Acquire(ctx, sharedReq("n", "holder", 1))
	require.NoError(t, err)
	wait := sharedReq("n", "waiter", 1)
	wait.Wait = true
	_, err = s.Acquire(ctx, wait)
	busy, ok := errors.AsType[*guard.BusyError](err)
	require.True(t, ok, "the waiter is queued: %v", err)
	require.Positive(t, busy.Queued)

	_, err = s.client.Delete(ctx, s.key("n", "waiter")) // its place ran out
	require.NoError(t, err)
	wait.Attempt = 2
	fence, err := s.Acquire(ctx, wait)
	require.Error(t, err, "granted fence %d beside the holder's %d", fence, held)
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	info, err := s.Inspect(ctx, "n")
	require.NoError(t, err)
	assert.Equal(t, 1, info.Holders)
	assert.Equal(t, held, info.Fence)
}
