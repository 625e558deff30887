package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// TestFairQueue queues waiters on separate Guards (each its own client, as separate instances
// would be) in a known order, with a dead waiter among them — a process that queued and then
// crashed — and releases the name: the waiters must get it in the order they came, and the dead
// one must hold them up no longer than its place in the queue lasts.
func TestFairQueue(t *testing.T) {
	const (
		waiters = 5
		dead    = 2 // the dead waiter queues before waiter 2
		place   = time.Second
	)
	srv := testserver.StartRedis(t)
	store := func(t *testing.T) *Store {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		return New(c, WithQueueTimeout(place))
	}
	name := uniqueName(t, "x")
	holder := guard.New(store(t))
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	l, err := holder.Acquire(t.Context(), name)
	require.NoError(t, err)
	adm := store(t)
	queued := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			info, err := adm.Inspect(t.Context(), name)
			return err == nil && info.Waiting == n
		}, 10*time.Second, time.Millisecond, "waiter %d never queued", n)
	}

	var (
		mu    sync.Mutex // protects order and at
		order []int
		at    []time.Time
		wg    sync.WaitGroup
	)
	for i := range waiters {
		if i == dead {
			_, err := adm.Acquire(t.Context(), guard.Request{Name: name, Token: "dead", TTL: time.Minute, Wait: true})
			require.ErrorIs(t, err, guard.ErrNotAcquired)
			queued(i + 1)
		}
		g := guard.New(store(t))
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		wg.Go(func() {
			w, err := g.Acquire(t.Context(), name, guard.WaitTime(time.Minute))
			if !assert.NoError(t, err, "waiter %d", i) {
				return
			}
			mu.Lock()
			order, at = append(order, i), append(at, time.Now())
			mu.Unlock()
			assert.NoError(t, w.Release(t.Context()))
		})
		n := i + 1
		if i >= dead {
			n++
		}
		queued(n)
	}

	released := time.Now()
	require.NoError(t, l.Release(t.Context()))
	wg.Wait()
	require.Equal(t, []int{0, 1, 2, 3, 4}, order, "the waiters did not get the name in the order they came")
	held := at[dead].Sub(at[dead-1])
	t.Logf("first waiter %v after the release; the dead waiter held the others up %v (its place: %v)",
		at[0].Sub(released), held, place)
	assert.Less(t, held, 2*place, "a dead waiter held the name longer than its place in the queue")
	var gaps []time.Duration
	for i := 1; i < waiters; i++ {
		if i != dead {
			gaps = append(gaps, at[i].Sub(at[i-1]))
		}
	}
	t.Logf("hand-overs between live waiters: %v", gaps)
}

// TestLastMillisecondIsBusy (issue 16, case 4): in a lease's last millisecond PTTL answers 0
// while the key still exists. A busy answer must still say that the name is held — a positive
// Remaining — and never read as "free, but others wait first", which sends the head waiter to
// sleep for half its place in the queue.
func TestLastMillisecondIsBusy(t *testing.T) {
	srv := testserver.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	s := New(c)
	name := uniqueName(t, "x")
	ctx := t.Context()
	zero := 0
	for round := 0; round < 20 && zero == 0; round++ {
		_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "holder", TTL: 2 * time.Millisecond})
		require.NoError(t, err)
		for {
			_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "waiter", TTL: time.Second, Wait: true})
			if err == nil {
				break
			}
			var busy *guard.BusyError
			require.ErrorAs(t, err, &busy)
			if busy.Remaining <= 0 {
				zero++
			}
		}
		require.NoError(t, s.Release(ctx, name, "waiter", 0))
	}
	assert.Zero(t, zero, "busy answers with nothing left of a held lease")
}
