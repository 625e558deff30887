package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// TestListAcrossResize grows the server's key table between the pages of a List, as other
// clients' writes do on a shared Redis: SCAN then visits the table in other steps than it did,
// and the pages must still return every lock held throughout.
func TestListAcrossResize(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client)
	ctx := t.Context()
	const (
		n     = 400
		limit = 50
	)
	for i := range n {
		_, err := s.Acquire(ctx, guard.Request{Name: fmt.Sprintf("resize/%04d", i), Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}
	fillers := 0
	grow := func(keys int) { // other keys, which double the table a few times
		pipe := client.Pipeline()
		for range keys {
			pipe.Set(ctx, fmt.Sprintf("filler:%d", fillers), "x", time.Minute)
			fillers++
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
	}

	seen := make(map[string]int, n)
	cursor, pages := "", 0
	for {
		page, next, err := s.List(ctx, "resize/", cursor, limit)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), limit)
		for _, info := range page {
			seen[info.Name]++
		}
		pages++
		if next == "" {
			break
		}
		require.Less(t, pages, 100, "paging does not end")
		if pages <= 3 {
			grow(4000 << pages)
		}
		cursor = next
	}
	repeats := 0
	for i := range n {
		name := fmt.Sprintf("resize/%04d", i)
		assert.Positive(t, seen[name], "%s missed", name)
		repeats += max(seen[name]-1, 0)
	}
	assert.Len(t, seen, n, "only the held locks under the prefix")
	t.Logf("%d locks in %d pages, %d repeats (SCAN may repeat a key across a resize)", n, pages, repeats)
}

// TestListWhileReleasing releases the last lock of each page before asking for the next, as
// holders do while an operator lists: every lock held throughout must still be listed.
func TestListWhileReleasing(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client)
	ctx := t.Context()
	const (
		n     = 600
		limit = 40
	)
	for i := range n {
		_, err := s.Acquire(ctx, guard.Request{Name: fmt.Sprintf("churn/%04d", i), Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}
	seen := make(map[string]int, n)
	released := make(map[string]bool)
	cursor, pages := "", 0
	for {
		page, next, err := s.List(ctx, "churn/", cursor, limit)
		require.NoError(t, err)
		for _, info := range page {
			seen[info.Name]++
		}
		pages++
		if next == "" {
			break
		}
		require.Less(t, pages, 1000, "paging does not end")
		if len(page) > 0 {
			last := page[len(page)-1].Name
			require.NoError(t, s.Release(ctx, last, "tok", 0))
			released[last] = true
		}
		cursor = next
	}
	for i := range n {
		name := fmt.Sprintf("churn/%04d", i)
		if !released[name] {
			assert.Positive(t, seen[name], "%s, held throughout, missed", name)
		}
	}
	t.Logf("%d locks in %d pages, %d released on the way", n, pages, len(released))
}

// TestListSplitStep lists with pages of one lock, so that SCAN steps holding two or more locks
// must be split across pages: every lock exactly once.
func TestListSplitStep(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client)
	ctx := t.Context()
	const n = 200
	for i := range n {
		_, err := s.Acquire(ctx, guard.Request{Name: fmt.Sprintf("split/%04d", i), Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
	}
	seen := make(map[string]int, n)
	cursor, pages, splits := "", 0, 0
	for {
		page, next, err := s.List(ctx, "split/", cursor, 1)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), 1)
		for _, info := range page {
			seen[info.Name]++
		}
		pages++
		if next == "" {
			break
		}
		require.Less(t, pages, 100*n, "paging does not end")
		c, err := parseCursor(next)
		require.NoError(t, err)
		if len(c.returned) > 0 {
			splits++
		}
		cursor = next
	}
	require.Positive(t, splits, "no step held two locks: the test did not split one")
	for i := range n {
		name := fmt.Sprintf("split/%04d", i)
		assert.Equal(t, 1, seen[name], "%s listed %d times", name, seen[name])
	}
	t.Logf("%d locks in %d pages, %d of them in the middle of a SCAN step", n, pages, splits)
}
