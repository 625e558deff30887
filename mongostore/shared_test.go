package mongostore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/mongostore"
)

// shared is a shared request of limit for name and token.
func shared(name, token string, limit int) guard.Request {
	return guard.Request{Name: name, Token: token, TTL: time.Minute, Shared: true, Limit: limit, Instance: "i-" + token}
}

// expireEntry ends the lease of token's shared entry of name now, behind its holder's back, as
// if its holder had died.
func (c *client) expireEntry(t *testing.T, name, token string) {
	t.Helper()
	res, err := c.coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "shared." + token + ".e", Value: time.Now().Add(-time.Second)}}}})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.MatchedCount)
}

// TestSharedRoundTrips: a shared grant, its renewal and its release are one command each; a
// busy answer reads the document once more, to say how long it stays busy.
func TestSharedRoundTrips(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	var first uint64
	cmds := a.count(func() {
		var err error
		first, err = a.store.Acquire(ctx, shared("sem", "a1", 2))
		require.NoError(t, err)
	})
	assert.Equal(t, []string{"findAndModify"}, cmds, "first shared grant of a new name")
	cmds = a.count(func() {
		fence, err := a.store.Acquire(ctx, shared("sem", "a2", 2))
		require.NoError(t, err)
		assert.Greater(t, fence, first)
	})
	assert.Equal(t, []string{"findAndModify"}, cmds, "shared grant of a name whose epoch the store knows")
	cmds = b.count(func() {
		_, err := b.store.Acquire(ctx, shared("sem", "b1", 2))
		var busy *guard.BusyError
		require.ErrorAs(t, err, &busy)
		assert.InDelta(t, time.Minute, busy.Remaining, float64(5*time.Second), "until the first permit's lease ends")
	})
	assert.Equal(t, []string{"findAndModify", "find"}, cmds, "busy: the grant, and a look")
	cmds = a.count(func() {
		for _, err := range a.store.Extend(ctx, []guard.Lease{{Name: "sem", Token: "a1", TTL: time.Minute}}) {
			require.NoError(t, err)
		}
	})
	assert.Equal(t, []string{"update"}, cmds, "extend")
	cmds = a.count(func() { require.NoError(t, a.store.Release(ctx, "sem", "a1", 0)) })
	assert.Equal(t, []string{"update"}, cmds, "release")
	cmds = b.count(func() {
		fence, err := b.store.Acquire(ctx, shared("sem", "b1", 2))
		require.NoError(t, err)
		assert.Greater(t, fence, first)
	})
	assert.Equal(t, []string{"findAndModify"}, cmds, "the busy answer's look taught b the epoch")
	c := newClient(t, srv)
	require.NoError(t, b.store.Release(ctx, "sem", "b1", 0))
	cmds = c.count(func() {
		fence, err := c.store.Acquire(ctx, shared("sem", "c1", 2))
		require.NoError(t, err)
		assert.Greater(t, fence, first)
	})
	assert.Equal(t, []string{"findAndModify", "find", "findAndModify"}, cmds,
		"a store that has not seen the name learns its epoch once")
}

// TestSharedWithExclusive: readers hold together, a writer alone; a writer that waits holds
// later readers back until it has come and gone, or given up.
func TestSharedWithExclusive(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	r1, err := a.store.Acquire(ctx, shared("rw", "r1", 0))
	require.NoError(t, err)
	_, err = b.store.Acquire(ctx, shared("rw", "r2", 0))
	require.NoError(t, err)

	writer := guard.Request{Name: "rw", Token: "w", TTL: time.Minute, Wait: true}
	_, err = b.store.Acquire(ctx, writer)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a writer beside readers")
	info, err := a.store.Inspect(ctx, "rw")
	require.NoError(t, err)
	assert.Equal(t, 2, info.Holders)
	assert.True(t, info.Shared)
	assert.Equal(t, 1, info.Waiting, "the writer's mark")
	_, err = a.store.Acquire(ctx, shared("rw", "r3", 0))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a reader passed the waiting writer")

	require.NoError(t, a.store.Release(ctx, "rw", "r1", 0))
	require.NoError(t, b.store.Release(ctx, "rw", "r2", 0))
	w, err := b.store.Acquire(ctx, writer)
	require.NoError(t, err, "the readers are gone")
	assert.Greater(t, w, r1)
	_, err = a.store.Acquire(ctx, shared("rw", "r3", 0))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a reader beside the writer")
	require.NoError(t, b.store.Release(ctx, "rw", "w", 0))
	r3, err := a.store.Acquire(ctx, shared("rw", "r3", 0))
	require.NoError(t, err, "the writer's mark outlived its turn")
	assert.Greater(t, r3, w)

	// A writer that gives up takes its mark back.
	_, err = b.store.Acquire(ctx, writer)
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.ErrorIs(t, b.store.Release(ctx, "rw", "w", 0), guard.ErrNotHeld)
	_, err = a.store.Acquire(ctx, shared("rw", "r4", 0))
	require.NoError(t, err, "the mark of a writer that left holds readers back")
}

// TestSharedDeadHolder: a shared holder whose lease ran out keeps neither its permit nor the
// writers out.
func TestSharedDeadHolder(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	first, err := a.store.Acquire(ctx, shared("dead", "a", 1))
	require.NoError(t, err)
	_, err = b.store.Acquire(ctx, shared("dead", "b", 1))
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	a.expireEntry(t, "dead", "a")
	require.ErrorIs(t, a.store.Release(ctx, "dead", "a", 0), guard.ErrNotHeld, "release of an expired permit")
	errs := a.store.Extend(ctx, []guard.Lease{{Name: "dead", Token: "a", TTL: time.Minute}})
	require.ErrorIs(t, errs[0], guard.ErrNotHeld, "extend of an expired permit")
	second, err := b.store.Acquire(ctx, shared("dead", "b", 1))
	require.NoError(t, err, "the dead holder's permit did not come back")
	assert.Greater(t, second, first)

	// A writer waits for the live reader, not for a dead one.
	b.expireEntry(t, "dead", "b")
	_, err = a.store.Acquire(ctx, shared("dead", "c", 0))
	require.NoError(t, err)
	require.NoError(t, a.store.Release(ctx, "dead", "c", 0))
	writer := guard.Request{Name: "dead", Token: "w", TTL: time.Minute}
	_, err = a.store.Acquire(ctx, writer)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a writer that does not wait does not look (one round trip)")
	writer.Wait = true
	w, err := a.store.Acquire(ctx, writer)
	require.NoError(t, err, "a dead reader kept the waiting writer out")
	assert.Greater(t, w, second)
}

// TestSharedRetry: a shared request whose answer was lost, sent again, finds its own permit.
func TestSharedRetry(t *testing.T) {
	srv := testserver.StartMongo(t)
	a := newClient(t, srv)
	ctx := t.Context()
	fence, err := a.store.Acquire(ctx, shared("retry", "a", 1))
	require.NoError(t, err)
	again, err := a.store.Acquire(ctx, shared("retry", "a", 1))
	require.NoError(t, err)
	assert.Equal(t, fence, again)
}

// TestSharedKeep: a permit released with a MinHold window left stays taken for it, under no
// token.
func TestSharedKeep(t *testing.T) {
	srv := testserver.StartMongo(t)
	a, b := newClient(t, srv), newClient(t, srv)
	ctx := t.Context()
	_, err := a.store.Acquire(ctx, shared("keep", "a", 1))
	require.NoError(t, err)
	require.NoError(t, a.store.Release(ctx, "keep", "a", 300*time.Millisecond))
	errs := a.store.Extend(ctx, []guard.Lease{{Name: "keep", Token: "a", TTL: time.Minute}})
	require.ErrorIs(t, errs[0], guard.ErrNotHeld, "a late renewal extended a kept permit")
	info, err := b.store.Inspect(ctx, "keep")
	require.NoError(t, err)
	assert.True(t, info.Kept)
	_, err = b.store.Acquire(ctx, shared("keep", "b", 1))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "taken inside the kept window")
	require.Eventually(t, func() bool {
		_, err := b.store.Acquire(ctx, shared("keep", "b", 1))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
}

// TestSharedInspect: Inspect reports the newest holder and how many there are, List each
// holder, page by page, and ForceRelease frees one holder by its fence, or all.
func TestSharedInspect(t *testing.T) {
	srv := testserver.StartMongo(t)
	a := newClient(t, srv)
	ctx := t.Context()
	var fences []uint64
	for i := range 3 {
		r := shared("ins", fmt.Sprint("t", i), 0)
		r.Value = fmt.Sprint("v", i)
		fence, err := a.store.Acquire(ctx, r)
		require.NoError(t, err)
		fences = append(fences, fence)
	}
	info, err := a.store.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.Equal(t, guard.LockInfo{Name: "ins", Held: true, Fence: fences[2], Instance: "i-t2", Value: "v2",
		Shared: true, Holders: 3, AcquiredAt: info.AcquiredAt, Remaining: info.Remaining}, info)

	var listed []uint64
	cursor := ""
	for range 5 {
		page, next, err := a.store.List(ctx, "in", cursor, 2)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), 2)
		for _, p := range page {
			assert.Equal(t, 3, p.Holders)
			listed = append(listed, p.Fence)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	assert.Equal(t, fences, listed, "each holder once, in fence order")

	var changed *guard.ChangedHandsError
	require.ErrorAs(t, a.store.ForceRelease(ctx, "ins", 12345), &changed)
	assert.Equal(t, fences[2], changed.Found)
	require.NoError(t, a.store.ForceRelease(ctx, "ins", fences[1]))
	errs := a.store.Extend(ctx, []guard.Lease{
		{Name: "ins", Token: "t0", TTL: time.Minute}, {Name: "ins", Token: "t1", TTL: time.Minute},
		{Name: "ins", Token: "t2", TTL: time.Minute},
	})
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], guard.ErrNotHeld, "the broken holder")
	assert.NoError(t, errs[2])
	info, err = a.store.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.Equal(t, 2, info.Holders)
	require.NoError(t, a.store.ForceRelease(ctx, "ins", 0))
	info, err = a.store.Inspect(ctx, "ins")
	require.NoError(t, err)
	assert.False(t, info.Held)
	require.ErrorIs(t, a.store.ForceRelease(ctx, "ins", 0), guard.ErrNotHeld)
}

// TestReclaimKeepsSharedHolders: Reclaim does not delete the document of a name held shared,
// whatever its exclusive holder's expiry says.
func TestReclaimKeepsSharedHolders(t *testing.T) {
	srv := testserver.StartMongo(t)
	a := newClient(t, srv)
	ctx := t.Context()
	_, err := a.store.Acquire(ctx, guard.Request{Name: "old", Token: "x", TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, a.store.Release(ctx, "old", "x", 0))
	_, err = a.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "old"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: time.Now().Add(-time.Hour)}}}})
	require.NoError(t, err)
	_, err = a.store.Acquire(ctx, shared("old", "r", 0))
	require.NoError(t, err)
	n, err := a.store.Reclaim(ctx, mongostore.MinReclaimIdle)
	require.NoError(t, err)
	assert.Zero(t, n)
	errs := a.store.Extend(ctx, []guard.Lease{{Name: "old", Token: "r", TTL: time.Minute}})
	require.NoError(t, errs[0])
}

// TestSharedGuards: many callers of one semaphore through Guards on two clients never hold
// more permits than it has.
func TestSharedGuards(t *testing.T) {
	srv := testserver.StartMongo(t)
	ctx := context.Background()
	var sems []*guard.Semaphore
	for range 2 {
		g := guard.New(newClient(t, srv).store)
		t.Cleanup(func() { _ = g.Close(ctx) })
		sem, err := g.Semaphore("guards", 2)
		require.NoError(t, err)
		sems = append(sems, sem)
	}
	var l []*guard.Lock
	for _, sem := range sems {
		p, err := sem.TryAcquire(t.Context())
		require.NoError(t, err)
		l = append(l, p)
	}
	_, err := sems[0].TryAcquire(t.Context())
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	for _, p := range l {
		require.NoError(t, p.Release(t.Context()))
	}
}

// TestElectionHandover logs how soon a waiting candidate leads after the leader resigns, and
// after the term of a leader that stops renewing ends (its 1 s lease is never renewed nor
// released). It checks only that the terms follow each other in order.
func TestElectionHandover(t *testing.T) {
	srv := testserver.StartMongo(t)
	var elections []*guard.Election
	for range 2 {
		g := guard.New(newClient(t, srv).store)
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
		time.Sleep(200 * time.Millisecond) // the second candidate waits
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
