package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TestShared runs the tests of shared holds and AcquireAll on a single node, a Cluster and a
// Sentinel-managed master.
func TestShared(t *testing.T) {
	for _, dep := range deployments[:3] {
		t.Run(dep.name, func(t *testing.T) {
			t.Parallel()
			d := dep.start(t)
			t.Run("Permits", func(t *testing.T) { testPermits(t, d) })
			t.Run("HandOver", func(t *testing.T) { testSharedHandOver(t, d) })
			t.Run("KeptWindow", func(t *testing.T) { testSharedKept(t, d) })
			t.Run("ForceRelease", func(t *testing.T) { testSharedForce(t, d) })
			t.Run("RoundTrips", func(t *testing.T) { testSharedRoundTrips(t, d) })
			t.Run("AcquireAll", func(t *testing.T) { testAcquireAllSlots(t, d) })
		})
	}
}

// sharedReq is a shared request of token on name with limit (0: readers).
func sharedReq(name, token string, limit int, ttl time.Duration) guard.Request {
	return guard.Request{Name: name, Token: token, TTL: ttl, Shared: true, Limit: limit,
		Instance: "inst-" + token, Label: "label-" + token, Value: "value\x00" + token}
}

// notices opens a subscription on s that watches name and returns the channel its notices
// arrive on.
func notices(t *testing.T, s *Store, name string) <-chan guard.Notice {
	t.Helper()
	got := make(chan guard.Notice, 64)
	sub, err := s.Subscribe(func(n guard.Notice) { got <- n })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, sub.Watch(t.Context(), name))
	return got
}

// testPermits: permits up to the limit, each with its own fence; busy answers say how long; a
// writer is kept out until the last holder goes; Extend, Release, Inspect and List act per
// holder; a retry of a holder's own request is no new permit.
func testPermits(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	name := uniqueName(t, "sem")
	fa, err := s.Acquire(ctx, sharedReq(name, "a", 2, 10*time.Second))
	require.NoError(t, err)
	fb, err := s.Acquire(ctx, sharedReq(name, "b", 2, 20*time.Second))
	require.NoError(t, err)
	assert.Greater(t, fb, fa)
	again, err := s.Acquire(ctx, sharedReq(name, "b", 2, 20*time.Second))
	require.NoError(t, err, "a retry of b's own request")
	assert.Equal(t, fb, again)

	var busy *guard.BusyError
	_, err = s.Acquire(ctx, sharedReq(name, "c", 2, time.Minute))
	require.ErrorAs(t, err, &busy, "a third permit of two")
	assert.Greater(t, busy.Remaining, 5*time.Second)
	assert.LessOrEqual(t, busy.Remaining, 10*time.Second, "a permit waits for the first holder to go")
	_, err = s.Acquire(ctx, guard.Request{Name: name, Token: "x", TTL: time.Minute})
	require.ErrorAs(t, err, &busy, "an exclusive request beside permits")
	assert.Greater(t, busy.Remaining, 10*time.Second, "an exclusive request waits for the last holder")
	assert.LessOrEqual(t, busy.Remaining, 20*time.Second)
	fc, err := s.Acquire(ctx, sharedReq(name, "c", 3, time.Minute))
	require.NoError(t, err, "a semaphore of three admits a third holder")
	require.NoError(t, s.Release(ctx, name, "c", 0))

	info, err := s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.True(t, info.Shared)
	assert.Equal(t, 2, info.Holders)
	assert.Equal(t, fb, info.Fence, "Inspect reports the newest holder")
	assert.Equal(t, "inst-b", info.Instance)
	assert.Equal(t, "label-b", info.Label)
	assert.Equal(t, "value\x00b", info.Value)
	assert.Greater(t, fc, fb)

	page, next, err := s.List(ctx, name, "", 10)
	require.NoError(t, err)
	assert.Empty(t, next)
	byFence := map[uint64]guard.LockInfo{}
	for _, p := range page {
		byFence[p.Fence] = p
	}
	require.Len(t, byFence, 2, "List reports each holder: %+v", page)
	assert.Equal(t, "value\x00a", byFence[fa].Value)
	assert.Equal(t, "value\x00b", byFence[fb].Value)

	// Extend and Release act on their own holder only.
	errs := s.Extend(ctx, []guard.Lease{{Name: name, Token: "a", TTL: time.Minute}, {Name: name, Token: "c", TTL: time.Minute}})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], guard.ErrNotHeld)
	page, _, err = s.List(ctx, name, "", 10)
	require.NoError(t, err)
	for _, p := range page {
		if p.Fence == fa {
			assert.Greater(t, p.Remaining, 50*time.Second, "a extended")
		} else {
			assert.LessOrEqual(t, p.Remaining, 20*time.Second, "b untouched")
		}
	}
	require.ErrorIs(t, s.Release(ctx, name, "c", 0), guard.ErrNotHeld)
	require.NoError(t, s.Release(ctx, name, "a", 0))
	require.ErrorIs(t, s.Release(ctx, name, "a", 0), guard.ErrNotHeld)
	require.ErrorIs(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "a", TTL: time.Minute}})[0], guard.ErrNotHeld)
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 1, info.Holders)
	require.NoError(t, s.Release(ctx, name, "b", 0))
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Held)
	assert.GreaterOrEqual(t, info.Fence, fc, "a free name keeps its last fence")

	fx, err := s.Acquire(ctx, guard.Request{Name: name, Token: "x", TTL: time.Minute, Value: "leader"})
	require.NoError(t, err, "the writer gets in once the holders are gone")
	assert.Greater(t, fx, fc)
	_, err = s.Acquire(ctx, sharedReq(name, "d", 0, time.Minute))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a reader beside a writer")
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, "leader", info.Value)
	assert.False(t, info.Shared)
	assert.Equal(t, 1, info.Holders)
	require.NoError(t, s.Release(ctx, name, "x", 0))

	// A holder whose lease ran out is no holder.
	_, err = s.Acquire(ctx, sharedReq(name, "short", 1, 50*time.Millisecond))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	_, err = s.Acquire(ctx, sharedReq(name, "e", 1, time.Minute))
	require.NoError(t, err, "an expired permit still counted")
	require.ErrorIs(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "short", TTL: time.Minute}})[0], guard.ErrNotHeld)
	require.NoError(t, s.Release(ctx, name, "e", 0))
}

// testSharedHandOver: readers queued behind a writer do not pass it; the writer's turn comes
// when the last reader goes; its release hands the name to every reader queued behind it at
// once — a notice each, with its own, increasing fence — and stops at the next writer.
func testSharedHandOver(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	other, _ := d.counted(t)
	name := uniqueName(t, "rw")
	got := notices(t, other, name)

	_, err := s.Acquire(ctx, sharedReq(name, "r1", 0, time.Minute))
	require.NoError(t, err)
	_, err = s.Acquire(ctx, sharedReq(name, "r2", 0, time.Minute))
	require.NoError(t, err)
	var busy *guard.BusyError
	w := guard.Request{Name: name, Token: "w", TTL: time.Minute, Wait: true, Attempt: 1}
	_, err = s.Acquire(ctx, w)
	require.ErrorAs(t, err, &busy)
	require.Positive(t, busy.Queued)
	for _, r := range []string{"r3", "r4"} {
		req := sharedReq(name, r, 0, time.Minute)
		req.Wait, req.Attempt = true, 2
		_, err = s.Acquire(ctx, req)
		require.ErrorAs(t, err, &busy, "reader %s passed the waiting writer", r)
		assert.Positive(t, busy.Remaining)
	}
	w2 := guard.Request{Name: name, Token: "w2", TTL: time.Minute, Wait: true, Attempt: 3}
	_, err = s.Acquire(ctx, w2)
	require.ErrorAs(t, err, &busy)
	last := sharedReq(name, "r5", 0, time.Minute)
	last.Wait = true
	_, err = s.Acquire(ctx, last)
	require.ErrorAs(t, err, &busy)

	require.NoError(t, s.Release(ctx, name, "r1", 0))
	info, err := s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 1, info.Holders, "the writer is not handed the name while a reader holds it")
	assert.Equal(t, 5, info.Waiting)

	require.NoError(t, s.Release(ctx, name, "r2", 0))
	n := <-got
	assert.Equal(t, "w", n.Next, "the last reader's release hands the name to the writer")
	assert.Equal(t, "r2", n.Token)
	assert.Equal(t, 1, n.Attempt)
	assert.Equal(t, DefaultQueueTimeout, n.Lease, "the lease asked for, no longer than the place")
	wFence := n.Fence
	fw, err := s.Acquire(ctx, w)
	require.NoError(t, err, "the writer holds the name")
	assert.Equal(t, wFence, fw)

	require.NoError(t, s.Release(ctx, name, "w", 0))
	var handed []guard.Notice
	for range 2 {
		select {
		case n := <-got:
			handed = append(handed, n)
		case <-time.After(notifyWait):
			t.Fatal("the readers were not told")
		}
	}
	assert.Equal(t, "r3", handed[0].Next)
	assert.Equal(t, "r4", handed[1].Next)
	assert.Greater(t, handed[0].Fence, wFence)
	assert.Greater(t, handed[1].Fence, handed[0].Fence)
	assert.Equal(t, 2, handed[1].Attempt)
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 2, info.Holders, "both readers hold the name; the second writer waits")
	assert.True(t, info.Shared)
	assert.Equal(t, 2, info.Waiting)
	select {
	case n := <-got:
		t.Fatalf("a third hand-over past the waiting writer: %+v", n)
	case <-time.After(100 * time.Millisecond):
	}

	// The second writer gives up: the reader behind it fits beside the two and gets in.
	require.ErrorIs(t, s.Release(ctx, name, "w2", 0), guard.ErrNotHeld)
	select {
	case n := <-got:
		assert.Equal(t, "r5", n.Next)
		assert.Greater(t, n.Fence, handed[1].Fence)
	case <-time.After(notifyWait):
		t.Fatal("the reader behind the writer that left was not handed the name")
	}
	for _, r := range []string{"r3", "r4", "r5"} {
		require.NoError(t, s.Release(ctx, name, r, 0), r)
	}
}

// testSharedKept: a permit released with a MinHold window counts as a holder until the window
// ends, under no token; then the waiter gets it.
func testSharedKept(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	name := uniqueName(t, "kept")
	_, err := s.Acquire(ctx, sharedReq(name, "a", 1, time.Minute))
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, name, "a", 300*time.Millisecond))
	require.ErrorIs(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "a", TTL: time.Minute}})[0], guard.ErrNotHeld,
		"the holder extended its kept window")
	require.ErrorIs(t, s.Release(ctx, name, "a", 0), guard.ErrNotHeld)
	var busy *guard.BusyError
	_, err = s.Acquire(ctx, sharedReq(name, "b", 1, time.Minute))
	require.ErrorAs(t, err, &busy, "the kept window is not counted")
	assert.LessOrEqual(t, busy.Remaining, 300*time.Millisecond)
	info, err := s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Kept)
	assert.True(t, info.Shared)
	time.Sleep(busy.Remaining + 20*time.Millisecond)
	_, err = s.Acquire(ctx, sharedReq(name, "b", 1, time.Minute))
	require.NoError(t, err, "the window ended")
	require.NoError(t, s.Release(ctx, name, "b", 0))
}

// testSharedForce: ForceRelease frees the holder with the fence it is given, or every holder
// with 0, and hands what it frees to the waiters.
func testSharedForce(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, _ := d.counted(t)
	name := uniqueName(t, "force")
	fa, err := s.Acquire(ctx, sharedReq(name, "a", 2, time.Minute))
	require.NoError(t, err)
	fb, err := s.Acquire(ctx, sharedReq(name, "b", 2, time.Minute))
	require.NoError(t, err)
	var changed *guard.ChangedHandsError
	require.ErrorAs(t, s.ForceRelease(ctx, name, fb+1000), &changed)
	assert.Equal(t, fb, changed.Found)
	got := notices(t, s, name)
	queued := sharedReq(name, "c", 2, time.Minute)
	queued.Wait = true
	_, err = s.Acquire(ctx, queued)
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.NoError(t, s.ForceRelease(ctx, name, fa))
	n := <-got
	assert.Equal(t, "c", n.Next, "the freed permit goes to the waiter")
	assert.Empty(t, n.Token)
	require.ErrorIs(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "a", TTL: time.Minute}})[0], guard.ErrNotHeld)
	require.NoError(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "b", TTL: time.Minute}})[0])
	require.NoError(t, s.ForceRelease(ctx, name, 0))
	info, err := s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Held, "ForceRelease(0) frees every holder")
	require.ErrorIs(t, s.ForceRelease(ctx, name, 0), guard.ErrNotHeld)
}

// testSharedRoundTrips: a shared acquire, extend and release are one round trip each, and so
// is an AcquireAll of names of one slot.
func testSharedRoundTrips(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, rt := d.counted(t)
	trips := func(f func()) int64 {
		before := rt.Load()
		f()
		return rt.Load() - before
	}
	name := uniqueName(t, "x")
	d.eachMaster(t, func(c *redis.Client) error { // every master has the scripts
		for _, sc := range scripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	_, err := s.Acquire(ctx, sharedReq(name, "warm", 2, time.Minute)) // connections open
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, name, "warm", 0))
	assert.Equal(t, int64(1), trips(func() {
		_, err := s.Acquire(ctx, sharedReq(name, "a", 2, time.Minute))
		require.NoError(t, err)
	}), "shared acquire")
	assert.Equal(t, int64(1), trips(func() {
		require.NoError(t, s.Extend(ctx, []guard.Lease{{Name: name, Token: "a", TTL: time.Minute}})[0])
	}), "shared extend")
	assert.Equal(t, int64(1), trips(func() { require.NoError(t, s.Release(ctx, name, "a", 0)) }), "shared release")
	names := sameSlot(uniqueName(t, "slot"), "a", "b", "c", "d")
	reqs := make([]guard.Request, len(names))
	for i, n := range names {
		reqs[i] = guard.Request{Name: n, Token: "all", TTL: time.Minute}
	}
	assert.Equal(t, int64(1), trips(func() {
		_, err := s.AcquireAll(ctx, reqs)
		require.NoError(t, err)
	}), "AcquireAll of one slot")
	for _, n := range names {
		require.NoError(t, s.Release(ctx, n, "all", 0))
	}
}

// testAcquireAllSlots: all or none, whether the names share a slot or not; a retry of the
// same tokens succeeds again; a busy name in a later slot gives back the slots taken before.
func testAcquireAllSlots(t *testing.T, d *deployment) {
	ctx := t.Context()
	s, rt := d.counted(t)
	other, _ := d.counted(t)
	for _, spread := range []bool{false, true} {
		t.Run(fmt.Sprint("spread=", spread), func(t *testing.T) {
			base := uniqueName(t, "all")
			names := sameSlot(base, "a", "b", "c", "d")
			if spread {
				names = []string{base + ":a", base + ":b", base + ":c", base + ":d"}
			}
			reqs := make([]guard.Request, len(names))
			for i, n := range names {
				reqs[i] = guard.Request{Name: n, Token: "t" + fmt.Sprint(i), TTL: time.Minute, Value: "v"}
			}
			reqs[1].Shared, reqs[1].Limit = true, 2
			before := rt.Load()
			fences, err := s.AcquireAll(ctx, reqs)
			require.NoError(t, err)
			require.Len(t, fences, len(names))
			t.Logf("%s, spread=%v: %d round trips, %d slot groups", d.kind, spread, rt.Load()-before, len(s.slotGroups(reqs)))
			again, err := s.AcquireAll(ctx, reqs)
			require.NoError(t, err, "a retry of the same tokens")
			assert.Equal(t, fences, again)
			_, err = other.Acquire(ctx, sharedReq(names[1], "beside", 2, time.Minute))
			require.NoError(t, err, "the shared member admits a second holder")
			require.NoError(t, other.Release(ctx, names[1], "beside", 0))
			for i, n := range names {
				require.NoError(t, s.Release(ctx, n, reqs[i].Token, 0))
			}

			// The last name is busy: nothing is held after.
			_, err = other.Acquire(ctx, guard.Request{Name: names[3], Token: "busy", TTL: 10 * time.Second})
			require.NoError(t, err)
			for i := range reqs {
				reqs[i].Token = "u" + fmt.Sprint(i)
			}
			_, err = s.AcquireAll(ctx, reqs)
			var busy *guard.BusyError
			require.ErrorAs(t, err, &busy)
			assert.Equal(t, names[3], busy.Name)
			assert.Greater(t, busy.Remaining, 5*time.Second)
			for _, n := range names[:3] {
				info, err := s.Inspect(ctx, n)
				require.NoError(t, err)
				assert.False(t, info.Held, "%s stayed held by a batch that failed", n)
			}
			require.NoError(t, other.Release(ctx, names[3], "busy", 0))
		})
	}

	// A free name that a waiter queued for is not taken past it.
	name := uniqueName(t, "queued")
	_, err := other.Acquire(ctx, guard.Request{Name: name, Token: "holder", TTL: 100 * time.Millisecond})
	require.NoError(t, err)
	_, err = other.Acquire(ctx, guard.Request{Name: name, Token: "waiter", TTL: time.Minute, Wait: true})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	time.Sleep(150 * time.Millisecond) // the holder's lease runs out: no hand-over
	_, err = s.AcquireAll(ctx, []guard.Request{{Name: name, Token: "batch", TTL: time.Minute}, {Name: name + ":b", Token: "batch", TTL: time.Minute}})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, name, busy.Name)
	assert.Positive(t, busy.Remaining, "how long the waiter keeps its place")
	_, err = other.Acquire(ctx, guard.Request{Name: name, Token: "waiter", TTL: time.Minute, Wait: true})
	require.NoError(t, err, "the waiter's turn")
	require.NoError(t, other.Release(ctx, name, "waiter", 0))
}

// TestSharedContention has goroutines on separate clients take permits of one semaphore with
// short leases and release them, some with a MinHold window, some never (dead holders): never
// more holders than permits, as the store itself reports them, and every fence once.
func TestSharedContention(t *testing.T) {
	d := startSingle(t)
	const permits, workers, rounds = 3, 6, 40
	name := uniqueName(t, "sem")
	var mu sync.Mutex // protects fences
	fences := map[uint64]bool{}
	var wg sync.WaitGroup
	adm, _ := d.counted(t)
	for w := range workers {
		s, _ := d.counted(t)
		wg.Go(func() {
			for r := range rounds {
				token := fmt.Sprint("w", w, "-", r)
				f, err := s.Acquire(context.Background(), sharedReq(name, token, permits, 200*time.Millisecond))
				if err != nil {
					continue
				}
				mu.Lock()
				if fences[f] {
					t.Errorf("fence %d given twice", f)
				}
				fences[f] = true
				mu.Unlock()
				info, err := adm.Inspect(context.Background(), name)
				if err == nil && info.Holders > permits {
					t.Errorf("%d holders of %d permits", info.Holders, permits)
				}
				switch r % 4 {
				case 0: // dies holding it
				case 1:
					_ = s.Release(context.Background(), name, token, 30*time.Millisecond)
				default:
					_ = s.Release(context.Background(), name, token, 0)
				}
			}
		})
	}
	wg.Wait()
	assert.NotEmpty(t, fences)
}

// TestAcquireAllTwice: a name asked for twice in one batch is refused, and nothing is taken.
func TestAcquireAllTwice(t *testing.T) {
	s, _ := startSingle(t).counted(t)
	name := uniqueName(t, "x")
	_, err := s.AcquireAll(t.Context(), []guard.Request{{Name: name, Token: "a", TTL: time.Minute}, {Name: name, Token: "b", TTL: time.Minute}})
	require.ErrorIs(t, err, guard.ErrInvalidName)
	info, err := s.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.False(t, info.Held)
}
