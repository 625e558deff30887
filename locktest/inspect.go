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
	"github.com/guardlock/guard/watchdog"
)

// testInspect checks guard.Inspector: what it reports of one lock, paging through many, and
// breaking a lock while its holder runs.
func testInspect(t *testing.T, h Harness) {
	if _, ok := h.New(t).Backend.(guard.Inspector); !ok {
		t.Skip("the backend does not implement guard.Inspector")
	}
	t.Run("Metadata", func(t *testing.T) { testMetadata(t, h) })
	t.Run("List", func(t *testing.T) { testList(t, h) })
	t.Run("ForceRelease", func(t *testing.T) { testForceRelease(t, h) })
	t.Run("ForceReleaseChangedHands", func(t *testing.T) { testForceReleaseChangedHands(t, h) })
	t.Run("ForceReleaseWaiter", func(t *testing.T) { testForceReleaseWaiter(t, h) })
}

func inspector(t testing.TB, h Harness) guard.Inspector {
	return h.New(t).Backend.(guard.Inspector)
}

// clockSlack is how far a backend's report of a remaining lease may exceed the lease: the
// backend rounds expiries up (to milliseconds, say) and may estimate its server's clock.
const clockSlack = 100 * time.Millisecond

// testMetadata takes a lock with an instance and a label and reads them back, held, released,
// and kept for a MinHold window.
func testMetadata(t *testing.T, h Harness) {
	const (
		instance = "locktest-instance/7"
		label    = "report:{day}"
	)
	in := inspector(t, h)
	g := guard.New(h.New(t).Backend, guard.WithInstance(instance))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	name := uniqueName(t)

	l, err := g.TryAcquire(t.Context(), name, guard.Label(label), guard.LeaseTime(time.Minute))
	require.NoError(t, err)
	info, err := in.Inspect(t.Context(), name)
	require.NoError(t, err)
	t.Logf("held: %+v", info)
	assert.Equal(t, name, info.Name)
	assert.True(t, info.Held)
	assert.False(t, info.Kept)
	assert.Equal(t, l.Fence(), info.Fence)
	assert.Equal(t, instance, info.Instance)
	assert.Equal(t, label, info.Label)
	// The backend's clock, on this machine: close to ours.
	assert.WithinDuration(t, l.AcquiredAt(), info.AcquiredAt, 5*time.Second)
	assert.Greater(t, info.Remaining, time.Duration(0))
	assert.LessOrEqual(t, info.Remaining, time.Minute+clockSlack)

	require.NoError(t, l.Release(t.Context()))
	info, err = in.Inspect(t.Context(), name)
	require.NoError(t, err)
	t.Logf("released: %+v", info)
	assert.False(t, info.Held)
	assert.Zero(t, info.Remaining)
	if info.Fence != 0 {
		assert.Equal(t, l.Fence(), info.Fence, "a free name's last fence")
	}

	kept, err := g.TryAcquire(t.Context(), name, guard.MinHold(time.Minute))
	require.NoError(t, err)
	require.NoError(t, kept.Release(t.Context()))
	info, err = in.Inspect(t.Context(), name)
	require.NoError(t, err)
	t.Logf("kept: %+v", info)
	assert.True(t, info.Held)
	assert.True(t, info.Kept)
	assert.Equal(t, kept.Fence(), info.Fence)
	assert.Greater(t, info.Remaining, time.Duration(0))
	// The rest of the window, and the drift a MinHold release adds to it.
	assert.LessOrEqual(t, info.Remaining, time.Minute+watchdog.Drift(time.Minute)+clockSlack)
	require.NoError(t, in.ForceRelease(t.Context(), name, kept.Fence()), "breaking a kept lock")
	info, err = in.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.False(t, info.Held)
}

// testList holds more than a thousand locks under one prefix, a few more outside it and one
// released inside it, and pages through the prefix: every held lock exactly once, nothing else.
func testList(t *testing.T, h Harness) {
	const (
		n     = 1050
		limit = 100
	)
	b := h.New(t).Backend
	in := inspector(t, h)
	prefix := uniqueName(t) + "/"
	want := make(map[string]bool, n)
	names := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for name := range names {
				_, err := b.Acquire(t.Context(), guard.Request{Name: name, Token: rand.Text(), TTL: 5 * time.Minute, Instance: "locktest"})
				assert.NoError(t, err)
			}
		})
	}
	for i := range n {
		name := fmt.Sprintf("%s%04d", prefix, i)
		want[name] = true
		names <- name
	}
	names <- prefix[:len(prefix)-1] // the prefix without its slash: not under it
	names <- prefix[:len(prefix)-1] + "0"
	close(names)
	wg.Wait()
	freed := prefix + "free"
	tok := rand.Text()
	_, err := b.Acquire(t.Context(), guard.Request{Name: freed, Token: tok, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, b.Release(t.Context(), freed, tok, 0))

	seen := make(map[string]int, n)
	cursor, pages := "", 0
	for {
		page, next, err := in.List(t.Context(), prefix, cursor, limit)
		require.NoError(t, err)
		pages++
		require.LessOrEqual(t, len(page), limit, "a page longer than the limit")
		for _, info := range page {
			seen[info.Name]++
			assert.True(t, info.Held, "%s listed but not held", info.Name)
		}
		if next == "" {
			break
		}
		require.Less(t, pages, 10*n/limit, "paging does not end")
		cursor = next
	}
	t.Logf("%d held locks in %d pages", len(seen), pages)
	for name := range want {
		assert.Equal(t, 1, seen[name], "%s listed %d times", name, seen[name])
	}
	for name := range seen {
		assert.True(t, want[name], "%s listed but not held under the prefix", name)
	}
}

// testForceRelease breaks a lock while its holder runs: the holder's context must end with
// ErrLockLost at its next renewal, and the next owner must get a higher fence.
func testForceRelease(t *testing.T, h Harness) {
	const ttl = 900 * time.Millisecond
	in := inspector(t, h)
	name := uniqueName(t)
	holder, _ := newGuard(t, h, guard.WithWatchdogTimeout(ttl))
	next, _ := newGuard(t, h)
	l, err := holder.Acquire(t.Context(), name)
	require.NoError(t, err)

	broken := time.Now()
	require.NoError(t, in.ForceRelease(t.Context(), name, l.Fence()))
	select {
	case <-l.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the holder's context outlived a forced release")
	}
	took := time.Since(broken)
	require.ErrorIs(t, l.Err(), guard.ErrLockLost)
	t.Logf("holder's context ended %v after the forced release (renewals every %v)", took, ttl/3)
	assert.Less(t, took, ttl/3+ttl/6, "the holder did not learn at its next renewal")

	l2, err := next.TryAcquire(t.Context(), name)
	require.NoError(t, err)
	assert.Greater(t, l2.Fence(), l.Fence())
	require.NoError(t, l2.Release(t.Context()))
	assert.ErrorIs(t, in.ForceRelease(t.Context(), name, 0), guard.ErrNotHeld)
	assert.ErrorIs(t, in.ForceRelease(t.Context(), name, l2.Fence()), guard.ErrNotHeld)
}

// testForceReleaseChangedHands is an operator who looked at A's lock and releases it after A
// released it and B took the name: the release must leave B's lock alone and say the fence it
// found. Fence 0 breaks whoever holds the name.
func testForceReleaseChangedHands(t *testing.T, h Harness) {
	in := inspector(t, h)
	name := uniqueName(t)
	a, _ := newGuard(t, h)
	b, _ := newGuard(t, h)
	la, err := a.TryAcquire(t.Context(), name)
	require.NoError(t, err)
	seen, err := in.Inspect(t.Context(), name)
	require.NoError(t, err)
	require.Equal(t, la.Fence(), seen.Fence)
	require.NoError(t, la.Release(t.Context()))
	lb, err := b.TryAcquire(t.Context(), name)
	require.NoError(t, err)

	err = in.ForceRelease(t.Context(), name, seen.Fence)
	var changed *guard.ChangedHandsError
	require.ErrorAs(t, err, &changed, "a forced release of the lock the operator saw broke the next holder's")
	assert.ErrorIs(t, err, guard.ErrChangedHands)
	assert.NotErrorIs(t, err, guard.ErrNotHeld)
	assert.Equal(t, guard.ChangedHandsError{Name: name, Fence: la.Fence(), Found: lb.Fence()}, *changed)
	info, err := in.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.True(t, info.Held, "B's lock was released")
	assert.Equal(t, lb.Fence(), info.Fence)
	require.NoError(t, lb.Release(t.Context()), "B's lock was broken")

	// Fence 0: whoever holds it.
	lc, err := a.TryAcquire(t.Context(), name, guard.LeaseTime(time.Minute))
	require.NoError(t, err)
	require.NoError(t, in.ForceRelease(t.Context(), name, 0))
	info, err = in.Inspect(t.Context(), name)
	require.NoError(t, err)
	assert.False(t, info.Held, "fence 0 did not release")
	assert.ErrorIs(t, lc.Release(t.Context()), guard.ErrNotHeld)
}

// testForceReleaseWaiter breaks a lock with an hour's lease while another Guard waits for
// it: the waiter must get the name soon — told of the release, or re-trying — with a higher
// fence, and not in an hour.
func testForceReleaseWaiter(t *testing.T, h Harness) {
	in := inspector(t, h)
	name := uniqueName(t)
	holder, _ := newGuard(t, h)
	l, err := holder.TryAcquire(t.Context(), name, guard.LeaseTime(time.Hour))
	require.NoError(t, err)

	wt := waitMinute(t, h, name)
	broken := time.Now()
	require.NoError(t, in.ForceRelease(t.Context(), name, l.Fence()))
	w := wt.lock(t, 30*time.Second, "the waiter slept through a forced release (the holder's lease was an hour)")
	t.Logf("the waiter took the name %v after the forced release", time.Since(broken))
	assert.Greater(t, w.Fence(), l.Fence())
	require.NoError(t, w.Release(t.Context()))
}
