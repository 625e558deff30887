package pgstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TestHandOverShared queues shared and exclusive waiters behind an exclusive holder, on the
// store itself: a release hands the name to every first waiter that fits — two shared ones of
// limit 2, each with its own fence and notice — and no further; Inspect, List and
// ForceRelease (one holder by fence, then all) see and free each holder.
func TestHandOverShared(t *testing.T) {
	srv := startServer(t)
	st, _ := srv.store(t)
	ctx := t.Context()
	name := "handover:" + rand.Text()
	_, n := subscribe(t, st, name)

	holder := rand.Text()
	first, err := st.Acquire(ctx, guard.Request{Name: name, Token: holder, TTL: time.Minute})
	require.NoError(t, err)
	type waiter struct {
		token  string
		shared bool
	}
	waiters := []waiter{{rand.Text(), true}, {rand.Text(), true}, {rand.Text(), true}, {rand.Text(), false}}
	for i, w := range waiters {
		_, err := st.Acquire(ctx, guard.Request{Name: name, Token: w.token, TTL: time.Minute, Shared: w.shared,
			Limit: 2, Wait: true, Attempt: i + 1, Value: fmt.Sprint("w", i)})
		var busy *guard.BusyError
		require.ErrorAs(t, err, &busy)
		assert.Equal(t, QueueTimeout, busy.Queued, "waiter %d not queued", i)
	}
	// A shared request that does not wait is not granted past the queue.
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Shared: true})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	info, err := st.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 4, info.Waiting)
	assert.Equal(t, 1, info.Holders)

	require.NoError(t, st.Release(ctx, name, holder, 0))
	var fences []uint64
	for i := range 2 {
		got := n.next(t)
		assert.Equal(t, waiters[i].token, got.Next, "hand-over %d", i)
		assert.Equal(t, holder, got.Token)
		assert.Equal(t, i+1, got.Attempt)
		assert.Equal(t, min(time.Minute, QueueTimeout), got.Lease)
		assert.Greater(t, got.Fence, first)
		fences = append(fences, got.Fence)
	}
	assert.Greater(t, fences[1], fences[0], "fences of one hand-over do not increase")
	n.none(t)
	// The waiters hold the name: a request of theirs is a retry, with the handed fence.
	fence, err := st.Acquire(ctx, guard.Request{Name: name, Token: waiters[1].token, TTL: time.Minute, Shared: true, Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, fences[1], fence)

	info, err = st.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.True(t, info.Shared)
	assert.Equal(t, 2, info.Holders)
	assert.Equal(t, 2, info.Waiting)
	assert.Equal(t, fences[1], info.Fence, "Inspect reports the newest holder")
	assert.Equal(t, "w1", info.Value)
	page, next, err := st.List(ctx, name, "", 1)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, fences[0], page[0].Fence)
	assert.Equal(t, 2, page[0].Holders)
	page, next, err = st.List(ctx, name, next, 1)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, fences[1], page[0].Fence)
	assert.Empty(t, next)

	// A holder freed by its fence: the third shared waiter fits beside the other.
	var changed *guard.ChangedHandsError
	require.ErrorAs(t, st.ForceRelease(ctx, name, first), &changed)
	assert.Equal(t, fences[1], changed.Found)
	require.NoError(t, st.ForceRelease(ctx, name, fences[0]))
	got := n.next(t)
	assert.Equal(t, waiters[2].token, got.Next)
	assert.Empty(t, got.Token, "a forced release has no token")
	assert.Greater(t, got.Fence, fences[1])
	errs := st.Extend(ctx, []guard.Lease{
		{Name: name, Token: waiters[0].token, TTL: time.Minute},
		{Name: name, Token: waiters[1].token, TTL: time.Minute},
		{Name: name, Token: waiters[2].token, TTL: time.Minute},
		{Name: name, Token: waiters[3].token, TTL: time.Minute},
	})
	assert.ErrorIs(t, errs[0], guard.ErrNotHeld, "a forced-out holder renewed")
	assert.NoError(t, errs[1])
	assert.NoError(t, errs[2])
	assert.ErrorIs(t, errs[3], guard.ErrNotHeld, "a waiter renewed")

	// Every holder freed: the writer gets it, alone.
	require.NoError(t, st.ForceRelease(ctx, name, 0))
	got = n.next(t)
	assert.Equal(t, waiters[3].token, got.Next)
	info, err = st.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Shared)
	assert.Equal(t, 1, info.Holders)
	assert.Equal(t, 0, info.Waiting)
	assert.Equal(t, got.Fence, info.Fence)

	// A waiter that leaves lets the ones after it in.
	other := rand.Text()
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: other, TTL: time.Minute, Wait: true})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.ErrorIs(t, st.Release(ctx, name, other, 0), guard.ErrNotHeld, "a waiter that leaves held nothing")
	info, err = st.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 0, info.Waiting)
	require.NoError(t, st.Release(ctx, name, waiters[3].token, 0))
	got = n.next(t)
	assert.Empty(t, got.Next, "nobody waits")
}

// TestMinHoldShared keeps a shared holder's MinHold window as a holder: with a limit of 2 and
// one window kept, one more shared holder fits, a second does not.
func TestMinHoldShared(t *testing.T) {
	srv := startServer(t)
	st, _ := srv.store(t)
	ctx := t.Context()
	name := "minhold:" + rand.Text()
	tok := rand.Text()
	_, err := st.Acquire(ctx, guard.Request{Name: name, Token: tok, TTL: time.Minute, Shared: true, Limit: 2})
	require.NoError(t, err)
	require.NoError(t, st.Release(ctx, name, tok, time.Minute))
	info, err := st.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Kept)
	assert.Equal(t, 1, info.Holders)
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Shared: true, Limit: 2})
	require.NoError(t, err)
	var busy *guard.BusyError
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Shared: true, Limit: 2})
	require.ErrorAs(t, err, &busy)
	assert.Greater(t, busy.Remaining, 50*time.Second, "the first window or lease to end")
	_, err = st.Acquire(ctx, guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired, "an exclusive request beside a kept window")
}

// TestAcquireAllBatch takes several names in one round trip, all or none, shared and
// exclusive, and a retry by the tokens that hold them keeps their fences.
func TestAcquireAllBatch(t *testing.T) {
	srv := startServer(t)
	st, rt := srv.store(t)
	ctx := t.Context()
	base := "all:" + rand.Text()
	reqs := make([]guard.Request, 4)
	for i := range reqs {
		// Given out of byte order: the function locks the rows in order all the same.
		reqs[i] = guard.Request{Name: fmt.Sprint(base, ":", 3-i), Token: rand.Text(), TTL: time.Minute, Shared: i%2 == 0, Limit: 1}
	}
	_, err := st.AcquireAll(ctx, reqs) // prepares the statement on the pool's connection
	require.NoError(t, err)
	for _, r := range reqs {
		require.NoError(t, st.Release(ctx, r.Name, r.Token, 0))
	}
	before := rt.Load()
	fences, err := st.AcquireAll(ctx, reqs)
	require.NoError(t, err)
	assert.EqualValues(t, 1, rt.Load()-before, "round trips of one AcquireAll")
	require.Len(t, fences, 4)
	again, err := st.AcquireAll(ctx, reqs)
	require.NoError(t, err)
	assert.Equal(t, fences, again, "a retry counted new acquisitions")
	require.NoError(t, st.Release(ctx, reqs[1].Name, reqs[1].Token, 0))

	// One name busy: none taken.
	busy := guard.Request{Name: reqs[1].Name, Token: rand.Text(), TTL: time.Minute}
	_, err = st.Acquire(ctx, busy)
	require.NoError(t, err)
	for _, r := range reqs {
		if r.Name != busy.Name {
			require.NoError(t, st.Release(ctx, r.Name, r.Token, 0))
		}
	}
	fresh := make([]guard.Request, len(reqs))
	for i, r := range reqs {
		fresh[i] = r
		fresh[i].Token = rand.Text()
	}
	_, err = st.AcquireAll(ctx, fresh)
	var b *guard.BusyError
	require.ErrorAs(t, err, &b)
	assert.Equal(t, busy.Name, b.Name)
	assert.Greater(t, b.Remaining, 50*time.Second)
	for _, r := range fresh {
		info, err := st.Inspect(ctx, r.Name)
		require.NoError(t, err)
		if r.Name == busy.Name {
			assert.True(t, info.Held)
			continue
		}
		assert.False(t, info.Held, "%s taken by a batch that failed", r.Name)
	}
}

// TestSharedContention runs permits of a semaphore of 3 and exclusive locks on one name from
// three stores (each with a pool of its own, as three processes), waiting in the database's
// queue and handed the name on release: never more than 3 permits at once, never an
// exclusive holder beside anyone, every grant with a fence of its own, and the permits all in
// use at some point.
func TestSharedContention(t *testing.T) {
	const (
		stores, workers, rounds = 3, 4, 15
		permits                 = 3
	)
	srv := startServer(t)
	name := "contend:" + rand.Text()
	var (
		permitsIn, exclusiveIn, most, bad atomic.Int32
		fences                            sync.Map
		wg                                sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for range stores {
		st, _ := srv.store(t)
		g := guard.New(st, guard.WithWatchdogTimeout(3*time.Second))
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		sem, err := g.Semaphore(name, permits)
		require.NoError(t, err)
		for w := range workers {
			wg.Go(func() {
				for r := range rounds {
					exclusive := (w+r)%5 == 0
					var l *guard.Lock
					var err error
					if exclusive {
						l, err = g.Acquire(ctx, name)
					} else {
						l, err = sem.Acquire(ctx)
					}
					if err != nil {
						t.Errorf("acquire: %v", err)
						return
					}
					if _, dup := fences.LoadOrStore(l.Fence(), true); dup {
						t.Errorf("fence %d given twice", l.Fence())
					}
					if exclusive {
						if exclusiveIn.Add(1) > 1 || permitsIn.Load() > 0 {
							bad.Add(1)
						}
					} else {
						n := permitsIn.Add(1)
						if n > permits || exclusiveIn.Load() > 0 {
							bad.Add(1)
						}
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
					}
					time.Sleep(2 * time.Millisecond)
					if exclusive {
						exclusiveIn.Add(-1)
					} else {
						permitsIn.Add(-1)
					}
					if err := l.Release(ctx); err != nil {
						t.Errorf("release: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	assert.Zero(t, bad.Load(), "more than %d permits, or an exclusive holder with others", permits)
	assert.Equal(t, int32(permits), most.Load(), "the permits were never all in use: the test shows nothing")
	var n int
	fences.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, stores*workers*rounds, n)
}

// TestPayloadHandOver reads the notification of a hand-over as sql/functions.sql writes it.
func TestPayloadHandOver(t *testing.T) {
	p := ">123:5000000:7:3:abc" + payload("a:b", "4:5")
	n, ok := parseNotice(p)
	require.True(t, ok)
	assert.Equal(t, guard.Notice{Name: "a:b", Token: "4:5", Next: "abc", Fence: 123, Lease: 5 * time.Second, Attempt: 7}, n)
	n, ok = parseNotice(payload("n", "t"))
	require.True(t, ok)
	assert.Equal(t, guard.Notice{Name: "n", Token: "t"}, n)
	for _, bad := range []string{">", ">1:2:3:", ">1:2:3:0:1:tn", ">x:2:3:1:a1:tn", ">1:-2:3:1:a1:tn",
		">1:2:" + fmt.Sprint(math.MaxInt64) + ":1:a1:tn", ">1:2:3:9:a1:tn"} {
		_, ok := parseNotice(bad)
		assert.False(t, ok, "%q", bad)
	}
}

// TestMigrate creates a table as the previous version did — one row per name, the holder in
// it — with a held lock, a kept MinHold window and a free name in it; CreateTable migrates it
// in place: the holder renews and releases its lock as before, the window stays until it
// ends, the fences go on from where they were, and a second CreateTable changes nothing.
func TestMigrate(t *testing.T) {
	srv := startServer(t)
	ctx := t.Context()
	table := "guard_old_" + strings.ToLower(rand.Text()[:8])
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := srv.admin.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`CREATE TABLE ` + table + ` (
    name        text COLLATE "C" PRIMARY KEY,
    token       text,
    fence       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    instance    text        NOT NULL DEFAULT '',
    label       text        NOT NULL DEFAULT ''
)`)
	t.Cleanup(func() { _, _ = srv.admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	far := uint64(time.Now().Add(time.Hour).UnixMicro()) // fences above the clock, as after many grants
	exec("INSERT INTO "+table+" VALUES ('held', 'h', $1, now() + interval '1 minute', now(), 'i', 'l')", far)
	exec("INSERT INTO "+table+" VALUES ('kept', NULL, $1, now() + interval '1 minute', now(), 'i', 'l')", far)
	exec("INSERT INTO "+table+" VALUES ('free', NULL, $1, now() - interval '1 hour', now(), 'i', 'l')", far)

	st := New(newPool(t, srv.pg.DSN, nil), WithTable(table))
	require.NoError(t, st.CreateTable(ctx))
	require.NoError(t, st.CreateTable(ctx), "a migrated table is migrated again")

	// The previous version's acquire (its sql/acquire.sql, in short) fails: it can take no
	// name beside the holders it cannot see.
	_, err := srv.admin.Exec(ctx, "INSERT INTO "+table+" AS l (name, token, fence, expires_at, acquired_at, instance, label) "+
		"VALUES ('free', 'old', 1, now() + interval '1 minute', now(), '', '') "+
		"ON CONFLICT (name) DO UPDATE SET token = excluded.token WHERE l.expires_at <= now()")
	require.Error(t, err, "a statement of the previous version took a name on the migrated table")

	info, err := st.Inspect(ctx, "held")
	require.NoError(t, err)
	assert.Equal(t, guard.LockInfo{Name: "held", Held: true, Fence: far, Instance: "i", Label: "l", Holders: 1,
		AcquiredAt: info.AcquiredAt, Remaining: info.Remaining}, info)
	assert.NoError(t, st.Extend(ctx, []guard.Lease{{Name: "held", Token: "h", TTL: time.Hour}})[0])
	_, err = st.Acquire(ctx, guard.Request{Name: "held", Token: "x", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.NoError(t, st.Release(ctx, "held", "h", 0))
	fence, err := st.Acquire(ctx, guard.Request{Name: "held", Token: "x", TTL: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, far+1, fence)

	info, err = st.Inspect(ctx, "kept")
	require.NoError(t, err)
	assert.True(t, info.Kept)
	var busy *guard.BusyError
	_, err = st.Acquire(ctx, guard.Request{Name: "kept", Token: "x", TTL: time.Minute})
	require.ErrorAs(t, err, &busy)
	assert.Greater(t, busy.Remaining, 50*time.Second)

	info, err = st.Inspect(ctx, "free")
	require.NoError(t, err)
	assert.Equal(t, guard.LockInfo{Name: "free", Fence: far, Instance: "i", Label: "l", AcquiredAt: info.AcquiredAt}, info)
	fence, err = st.Acquire(ctx, guard.Request{Name: "free", Token: "y", TTL: time.Minute, Shared: true})
	require.NoError(t, err)
	assert.Equal(t, far+1, fence)
}
