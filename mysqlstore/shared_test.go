package mysqlstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TestSharedHolds takes a name shared up to a limit on the store itself: each holder with its
// own fence, Inspect and List see each, a writer's wait mark keeps later readers out until
// the writer has had its turn, ForceRelease frees one holder by its fence or all, and a kept
// MinHold window counts as a holder.
func TestSharedHolds(t *testing.T) {
	srv := startServer(t)
	s, _ := srv.store(t)
	ctx := t.Context()
	name := "shared:" + rand.Text()
	shared := func(tok string) guard.Request {
		return guard.Request{Name: name, Token: tok, TTL: time.Minute, Shared: true, Limit: 2, Value: "v:" + tok[:4]}
	}
	a, b, c := rand.Text(), rand.Text(), rand.Text()
	fa, err := s.Acquire(ctx, shared(a))
	require.NoError(t, err)
	fb, err := s.Acquire(ctx, shared(b))
	require.NoError(t, err)
	assert.Greater(t, fb, fa)
	var busy *guard.BusyError
	_, err = s.Acquire(ctx, shared(c))
	require.ErrorAs(t, err, &busy, "a third holder beside a limit of 2")
	assert.Greater(t, busy.Remaining, 50*time.Second)
	_, err = s.Acquire(ctx, guard.Request{Name: name, Token: c, TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired, "an exclusive holder beside shared ones")

	info, err := s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, guard.LockInfo{Name: name, Held: true, Shared: true, Fence: fb, Value: "v:" + b[:4], Holders: 2,
		AcquiredAt: info.AcquiredAt, Remaining: info.Remaining}, info)
	page, next, err := s.List(ctx, name, "", 1)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, fa, page[0].Fence)
	assert.Equal(t, 2, page[0].Holders)
	page, next, err = s.List(ctx, name, next, 1)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, fb, page[0].Fence)
	assert.Empty(t, next)

	// A writer waits: readers stay out, though a permit is free, until it has had its turn.
	require.NoError(t, s.Release(ctx, name, a, 0))
	writer := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Wait: true}
	_, err = s.Acquire(ctx, writer)
	require.ErrorAs(t, err, &busy)
	assert.Zero(t, busy.Queued, "the store keeps no queue")
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 1, info.Waiting)
	_, err = s.Acquire(ctx, shared(c))
	require.ErrorAs(t, err, &busy, "a reader passed a waiting writer")
	assert.Positive(t, busy.Remaining)
	assert.LessOrEqual(t, busy.Remaining, WaitMark, "the writer's mark, at most")
	require.NoError(t, s.Release(ctx, name, b, 0))
	fw, err := s.Acquire(ctx, writer)
	require.NoError(t, err)
	assert.Greater(t, fw, fb)
	require.NoError(t, s.Release(ctx, name, writer.Token, 0))
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Zero(t, info.Waiting, "the writer's mark outlived its turn")

	// A writer that gives up takes its mark away.
	gaveUp := guard.Request{Name: name, Token: rand.Text(), TTL: time.Minute, Wait: true}
	fc, err := s.Acquire(ctx, shared(c))
	require.NoError(t, err)
	_, err = s.Acquire(ctx, gaveUp)
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.ErrorIs(t, s.Release(ctx, name, gaveUp.Token, 0), guard.ErrNotHeld)
	fa, err = s.Acquire(ctx, shared(a))
	require.NoError(t, err, "a writer that left kept readers out")

	// ForceRelease: one holder by its fence, then the rest; a stale fence is refused.
	var changed *guard.ChangedHandsError
	require.ErrorAs(t, s.ForceRelease(ctx, name, fw), &changed)
	assert.Equal(t, fa, changed.Found)
	require.NoError(t, s.ForceRelease(ctx, name, fc))
	errs := s.Extend(ctx, []guard.Lease{{Name: name, Token: c, TTL: time.Minute}, {Name: name, Token: a, TTL: time.Minute}})
	assert.ErrorIs(t, errs[0], guard.ErrNotHeld, "a forced-out holder renewed")
	assert.NoError(t, errs[1])

	// A kept window counts as a holder.
	require.NoError(t, s.Release(ctx, name, a, time.Minute))
	fb, err = s.Acquire(ctx, shared(b))
	require.NoError(t, err)
	_, err = s.Acquire(ctx, shared(c))
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a third holder beside a holder and a kept window")
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, 2, info.Holders)
	require.NoError(t, s.ForceRelease(ctx, name, 0))
	info, err = s.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Held)
	assert.Equal(t, fb, info.Fence, "a free name keeps its last grant")
}

// TestAcquireAllBatch takes several names in one round trip, all or none, shared and
// exclusive, given out of byte order; a retry by the tokens that hold them keeps their fences.
func TestAcquireAllBatch(t *testing.T) {
	srv := startServer(t)
	s, rt := srv.store(t)
	ctx := t.Context()
	base := "all:" + rand.Text()
	reqs := make([]guard.Request, 4)
	for i := range reqs {
		reqs[i] = guard.Request{Name: fmt.Sprint(base, ":", 3-i), Token: rand.Text(), TTL: time.Minute,
			Shared: i%2 == 0, Limit: 1, Label: "l'" + fmt.Sprint(i), Value: "é"}
	}
	before := rt.Load()
	fences, err := s.AcquireAll(ctx, reqs)
	require.NoError(t, err)
	assert.EqualValues(t, 1, rt.Load()-before, "round trips of one AcquireAll")
	require.Len(t, fences, 4)
	for i, r := range reqs {
		info, err := s.Inspect(ctx, r.Name)
		require.NoError(t, err)
		assert.Equal(t, fences[i], info.Fence, "%s", r.Name)
		assert.Equal(t, r.Label, info.Label)
		assert.Equal(t, r.Value, info.Value)
		assert.Equal(t, r.Shared, info.Shared)
	}
	again, err := s.AcquireAll(ctx, reqs)
	require.NoError(t, err)
	assert.Equal(t, fences, again, "a retry counted new acquisitions")
	for _, r := range reqs {
		require.NoError(t, s.Release(ctx, r.Name, r.Token, 0))
	}

	busy := guard.Request{Name: reqs[1].Name, Token: rand.Text(), TTL: time.Minute}
	_, err = s.Acquire(ctx, busy)
	require.NoError(t, err)
	_, err = s.AcquireAll(ctx, reqs)
	var b *guard.BusyError
	require.ErrorAs(t, err, &b)
	assert.Equal(t, busy.Name, b.Name)
	assert.Greater(t, b.Remaining, 50*time.Second)
	for _, r := range reqs {
		info, err := s.Inspect(ctx, r.Name)
		require.NoError(t, err)
		assert.Equal(t, r.Name == busy.Name, info.Held, "%s", r.Name)
	}
}

// TestSharedContention runs permits of a semaphore of 3, readers and writers of one name from
// three stores (each with a pool of its own, as three processes): never more than 3 permits
// at once, never an exclusive holder beside anyone, every grant with a fence of its own, and
// the permits all in use at some point.
func TestSharedContention(t *testing.T) {
	const (
		stores, workers, rounds = 3, 4, 12
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
		g := srv.guard(t, guard.WithWatchdogTimeout(3*time.Second))
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

// TestMigrate creates a table as the previous version did — one row per name, the holder in
// it — with a held lock, a kept MinHold window and a free name; CreateTable migrates it in
// place: the holder renews and releases its lock as before, the window stays until it ends,
// fences go on from where they were, and a second CreateTable changes nothing.
func TestMigrate(t *testing.T) {
	srv := startServer(t)
	ctx := t.Context()
	table := "guard_old_" + strings.ToLower(rand.Text()[:8])
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := srv.admin.ExecContext(ctx, q, args...)
		require.NoError(t, err)
	}
	exec("CREATE TABLE " + table + ` (
  name        VARBINARY(1024) NOT NULL,
  owner       VARBINARY(255)  NOT NULL,
  fence       BIGINT UNSIGNED NOT NULL,
  expires_at  DATETIME(6)     NOT NULL,
  acquired_at DATETIME(6)     NOT NULL,
  instance    VARCHAR(255)    NOT NULL,
  label       VARCHAR(255)    NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`)
	t.Cleanup(func() { _, _ = srv.admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
	far := uint64(time.Now().Add(time.Hour).UnixMicro()) // fences above the clock, as after many grants
	exec("INSERT INTO "+table+" VALUES ('held', 'h', ?, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), 'i', 'l')", far)
	exec("INSERT INTO "+table+" VALUES ('kept', '', ?, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), 'i', 'l')", far)
	exec("INSERT INTO "+table+" VALUES ('free', '', ?, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6), 'i', 'l')", far)

	s := New(srv.open(t, nil), WithTable(table))
	require.NoError(t, s.CreateTable(ctx))
	require.NoError(t, s.CreateTable(ctx), "a migrated table is migrated again")

	// The previous version's acquire (its acquireSQL, in short) fails: it can take no name
	// beside the holders it cannot see.
	_, err := srv.admin.ExecContext(ctx, "INSERT INTO "+table+" (name, owner, fence, expires_at, acquired_at, instance, label) "+
		"VALUES ('free', 'old', 1, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), '', '') "+
		"ON DUPLICATE KEY UPDATE owner = IF(expires_at <= UTC_TIMESTAMP(6), 'old', owner)")
	require.Error(t, err, "a statement of the previous version took a name on the migrated table")

	info, err := s.Inspect(ctx, "held")
	require.NoError(t, err)
	assert.Equal(t, guard.LockInfo{Name: "held", Held: true, Fence: far, Instance: "i", Label: "l", Holders: 1,
		AcquiredAt: info.AcquiredAt, Remaining: info.Remaining}, info)
	assert.NoError(t, s.Extend(ctx, []guard.Lease{{Name: "held", Token: "h", TTL: time.Hour}})[0])
	_, err = s.Acquire(ctx, guard.Request{Name: "held", Token: "x", TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.NoError(t, s.Release(ctx, "held", "h", 0))
	fence, err := s.Acquire(ctx, guard.Request{Name: "held", Token: "x", TTL: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, far+1, fence)

	info, err = s.Inspect(ctx, "kept")
	require.NoError(t, err)
	assert.True(t, info.Kept)
	var busy *guard.BusyError
	_, err = s.Acquire(ctx, guard.Request{Name: "kept", Token: "x", TTL: time.Minute})
	require.ErrorAs(t, err, &busy)
	assert.Greater(t, busy.Remaining, 50*time.Second)

	info, err = s.Inspect(ctx, "free")
	require.NoError(t, err)
	assert.Equal(t, guard.LockInfo{Name: "free", Fence: far, Instance: "i", Label: "l", AcquiredAt: info.AcquiredAt}, info)
	fence, err = s.Acquire(ctx, guard.Request{Name: "free", Token: "y", TTL: time.Minute, Shared: true})
	require.NoError(t, err)
	assert.Equal(t, far+1, fence)
}

// TestSpellings sets up one table under two spellings — schema.table, and table in the DSN's
// database — one after the other: the second CreateTable finds the procedures the first made
// and replaces none, and the two stores lock the same names.
func TestSpellings(t *testing.T) {
	srv := startServer(t)
	ctx := t.Context()
	table := "spelled_" + strings.ToLower(rand.Text()[:8])
	t.Cleanup(func() { _, _ = srv.admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })
	drops := func() int64 {
		var name string
		var n int64
		require.NoError(t, srv.admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Com_drop_procedure'").Scan(&name, &n))
		return n
	}
	qualified := New(srv.open(t, nil), WithTable(srv.Database+"."+table))
	plain := New(srv.open(t, nil), WithTable(table))
	require.NoError(t, qualified.CreateTable(ctx))
	before := drops()
	require.NoError(t, plain.CreateTable(ctx))
	assert.Equal(t, before, drops(), "the second spelling replaced the procedures")

	r := guard.Request{Name: "n", Token: rand.Text(), TTL: time.Minute}
	_, err := qualified.Acquire(ctx, r)
	require.NoError(t, err)
	_, err = plain.Acquire(ctx, guard.Request{Name: "n", Token: rand.Text(), TTL: time.Minute})
	require.ErrorIs(t, err, guard.ErrNotAcquired)
	require.NoError(t, plain.Release(ctx, r.Name, r.Token, 0))
}
