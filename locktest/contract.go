package locktest

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// testOwnRetry sends the same acquire request twice, as a client does when the reply of the
// first was lost after the server ran it: the second must find its own lock and succeed, not
// answer busy (which would strand the lock for a whole lease).
func testOwnRetry(t *testing.T, h Harness) {
	b := h.New(t).Backend
	name := uniqueName(t)
	r := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Instance: "locktest", Label: "retry"}
	first, err := b.Acquire(t.Context(), r)
	require.NoError(t, err)
	again, err := b.Acquire(t.Context(), r)
	require.NoError(t, err, "a retried acquire did not find its own lock")
	assert.GreaterOrEqual(t, again, first, "the retry's fence went backwards")

	other := r
	other.Token = rand.Text()
	_, err = b.Acquire(t.Context(), other)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "another token took a held lock")

	require.NoError(t, b.Release(t.Context(), name, r.Token, 0))
	require.ErrorIs(t, b.Release(t.Context(), name, r.Token, 0), guard.ErrNotHeld)
	fence, err := b.Acquire(t.Context(), other)
	require.NoError(t, err)
	assert.Greater(t, fence, again)
	require.NoError(t, b.Release(t.Context(), name, other.Token, 0))
}

// testFenceAfterDataLoss takes a name a few times, loses all of the backend's state, and
// takes it again: the fence must still be higher than every fence given before.
func testFenceAfterDataLoss(t *testing.T, h Harness) {
	require.NotNil(t, h.Wipe, "the harness must say how to lose the backend's data (Harness.Wipe)")
	g, _ := newGuard(t, h)
	name := uniqueName(t)
	var last uint64
	for range 5 {
		l, err := g.TryAcquire(t.Context(), name)
		require.NoError(t, err)
		require.Greater(t, l.Fence(), last)
		last = l.Fence()
		require.NoError(t, l.Release(t.Context()))
	}
	h.Wipe(t)
	l, err := g.TryAcquire(t.Context(), name)
	require.NoError(t, err)
	t.Logf("fence before the data loss %d, after %d", last, l.Fence())
	assert.Greater(t, l.Fence(), last, "the fence went backwards after the backend lost its data")
	require.NoError(t, l.Release(t.Context()))
}

// delayedExtend holds the first Extend back until it is let go, then sends it even if the
// watchdog gave up on it: a renewal that was on the wire when its lock was released.
type delayedExtend struct {
	guard.Backend
	entered  chan struct{} // closed when the first Extend arrives
	letGo    chan struct{} // close to send it
	extended chan error    // its outcome
	once     sync.Once
}

func (d *delayedExtend) Extend(ctx context.Context, leases []guard.Lease) []error {
	first := false
	d.once.Do(func() { first = true })
	if !first {
		return d.Backend.Extend(ctx, leases)
	}
	close(d.entered)
	<-d.letGo
	errs := d.Backend.Extend(context.WithoutCancel(ctx), leases)
	d.extended <- errs[0]
	return errs
}

// testMinHoldRenewalInFlight releases a MinHold lock while its watchdog renewal is in flight
// and lets the renewal reach the backend after the release: the renewal must not shorten the
// window to one TTL.
func testMinHoldRenewalInFlight(t *testing.T, h Harness) {
	const (
		ttl    = 300 * time.Millisecond
		window = 4 * time.Second
	)
	name := uniqueName(t)
	d := &delayedExtend{Backend: h.New(t).Backend,
		entered: make(chan struct{}), letGo: make(chan struct{}), extended: make(chan error, 1)}
	g := guard.New(d, guard.WithWatchdogTimeout(ttl))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	other, _ := newGuard(t, h)

	l, err := g.TryAcquire(t.Context(), name, guard.MinHold(window))
	require.NoError(t, err)
	select {
	case <-d.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the watchdog never renewed the lock")
	}
	require.NoError(t, l.Release(t.Context()))
	close(d.letGo)
	var late error
	select {
	case late = <-d.extended:
	case <-time.After(10 * time.Second):
		t.Fatal("the delayed renewal never returned")
	}
	t.Logf("the renewal that arrived after the release: %v", late)
	assert.ErrorIs(t, late, guard.ErrNotHeld, "a renewal sent before a MinHold release extended the kept lock")

	// Had the late renewal set the lease to one TTL, the name would be free by now.
	select {
	case <-time.After(3 * ttl):
	case <-t.Context().Done():
	}
	_, err = other.TryAcquire(t.Context(), name)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "the MinHold window ended a TTL after a late renewal")

	next, err := other.Acquire(t.Context(), name, guard.WaitTime(window+10*time.Second))
	require.NoError(t, err)
	assertWindowKept(t, l, next, window)
	require.NoError(t, next.Release(t.Context()))
}

// testMinHoldWaiter parks a waiter behind a lock with an hour's lease and a short MinHold
// window, then releases it: the waiter must get the lock soon after the window ends, not
// when the hour would have.
func testMinHoldWaiter(t *testing.T, h Harness) {
	const window = 500 * time.Millisecond
	name := uniqueName(t)
	holder, _ := newGuard(t, h)
	first, err := holder.TryAcquire(t.Context(), name, guard.LeaseTime(time.Hour), guard.MinHold(window))
	require.NoError(t, err)

	wt := waitMinute(t, h, name)
	released := time.Now()
	require.NoError(t, first.Release(t.Context()))
	w := wt.lock(t, 30*time.Second, "the waiter slept through the end of the MinHold window (the holder's lease was an hour)")
	t.Logf("taken %v after the release, window %v", time.Since(released), window)
	assertWindowKept(t, first, w, window)
	require.NoError(t, w.Release(t.Context()))
}

// testExtendMixed sends Extend batches that hold a stale token and the live token of one name
// with different TTLs, beside another name: each lease must get its own answer, and the live
// lock its own TTL — not the stale one's, whichever comes first in the batch.
func testExtendMixed(t *testing.T, h Harness) {
	b := h.New(t).Backend
	for _, staleFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("stale first %v", staleFirst), func(t *testing.T) {
			name, other := uniqueName(t), uniqueName(t)+":other"
			stale := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute}
			_, err := b.Acquire(t.Context(), stale)
			require.NoError(t, err)
			require.NoError(t, b.Release(t.Context(), name, stale.Token, 0))
			live := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute}
			_, err = b.Acquire(t.Context(), live)
			require.NoError(t, err)
			beside := guard.Request{Name: other, Token: rand.Text(), TTL: time.Minute}
			_, err = b.Acquire(t.Context(), beside)
			require.NoError(t, err)

			const long = 10 * time.Minute
			leases := []guard.Lease{
				{Name: name, Token: stale.Token, TTL: 200 * time.Millisecond},
				{Name: name, Token: live.Token, TTL: long},
				{Name: other, Token: beside.Token, TTL: 5 * time.Minute},
			}
			if !staleFirst {
				leases[0], leases[1] = leases[1], leases[0]
			}
			errs := b.Extend(t.Context(), leases)
			require.Len(t, errs, len(leases))
			for i, l := range leases {
				if l.Token == stale.Token {
					assert.ErrorIs(t, errs[i], guard.ErrNotHeld, "a stale token's lease was extended")
				} else {
					assert.NoError(t, errs[i], "lease %d", i)
				}
			}
			assert.Greater(t, remaining(t, b, name), long-time.Minute, "the live lock got another lease's TTL")
			assert.Greater(t, remaining(t, b, other), 4*time.Minute)
			require.NoError(t, b.Release(t.Context(), name, live.Token, 0))
			require.NoError(t, b.Release(t.Context(), other, beside.Token, 0))
		})
	}
}

// testExtendDuplicate sends Extend batches that name one lock — its name and its token — twice,
// with different TTLs, beside another name: the last of them stands (Backend.Extend), and
// each lease is answered as extended.
func testExtendDuplicate(t *testing.T, h Harness) {
	b := h.New(t).Backend
	const long, short = 10 * time.Minute, 30 * time.Second
	for _, lastLong := range []bool{true, false} {
		t.Run(fmt.Sprintf("last long %v", lastLong), func(t *testing.T) {
			name, other := uniqueName(t), uniqueName(t)+":other"
			held := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute}
			_, err := b.Acquire(t.Context(), held)
			require.NoError(t, err)
			beside := guard.Request{Name: other, Token: rand.Text(), TTL: time.Minute}
			_, err = b.Acquire(t.Context(), beside)
			require.NoError(t, err)

			leases := []guard.Lease{
				{Name: name, Token: held.Token, TTL: long},
				{Name: other, Token: beside.Token, TTL: 5 * time.Minute},
				{Name: name, Token: held.Token, TTL: short},
			}
			if lastLong {
				leases[0].TTL, leases[2].TTL = short, long
			}
			errs := b.Extend(t.Context(), leases)
			require.Len(t, errs, len(leases))
			for i, err := range errs {
				assert.NoError(t, err, "lease %d", i)
			}
			left := remaining(t, b, name)
			if lastLong {
				assert.Greater(t, left, long-time.Minute, "the first lease of the lock stood, not the last")
			} else {
				// A store that estimates the server's clock reports a lease a little longer than
				// asked (mongostore: its clock's uncertainty twice, and a millisecond of rounding
				// up); the first lease standing would leave minutes more.
				assert.LessOrEqual(t, left, short+time.Minute, "the first lease of the lock stood, not the last")
			}
			assert.Greater(t, remaining(t, b, other), 4*time.Minute)
			require.NoError(t, b.Release(t.Context(), name, held.Token, 0))
			require.NoError(t, b.Release(t.Context(), other, beside.Token, 0))
		})
	}
}

// remaining returns how long name stays taken on b, by the backend's report: Inspect when b is
// a guard.Inspector, else the busy answer of another token.
func remaining(t *testing.T, b guard.Backend, name string) time.Duration {
	t.Helper()
	if in, ok := b.(guard.Inspector); ok {
		info, err := in.Inspect(t.Context(), name)
		require.NoError(t, err)
		require.True(t, info.Held, "%s is not held", name)
		return info.Remaining
	}
	_, err := b.Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute})
	var busy *guard.BusyError
	require.ErrorAs(t, err, &busy, "%s is not held", name)
	if busy.Remaining == 0 {
		t.Skip("the backend says neither how long a lock stays taken nor implements guard.Inspector")
	}
	return busy.Remaining
}
