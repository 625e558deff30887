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

// TestListSharedHolders lists names held by several shared holders each, with pages smaller
// than a name's holders: no page holds more than its limit, and every holder comes once.
func TestListSharedHolders(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client)
	ctx := t.Context()
	want := map[string]bool{}
	for i := range 6 {
		name := fmt.Sprintf("holders/%d", i)
		holders := 1 + 2*i // 1 to 11
		for h := range holders {
			f, err := s.Acquire(ctx, guard.Request{Name: name, Token: fmt.Sprint("tok", h), TTL: time.Minute,
				Shared: true, Limit: 0})
			require.NoError(t, err)
			want[fmt.Sprint(name, "#", f)] = true
		}
	}
	for i := range 5 {
		name := fmt.Sprintf("holders/x%d", i)
		f, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: time.Minute})
		require.NoError(t, err)
		want[fmt.Sprint(name, "#", f)] = true
	}
	for _, limit := range []int{1, 3, 7, 100} {
		t.Run(fmt.Sprint("limit=", limit), func(t *testing.T) {
			seen := map[string]int{}
			cursor, pages := "", 0
			for {
				page, next, err := s.List(ctx, "holders/", cursor, limit)
				require.NoError(t, err)
				require.LessOrEqual(t, len(page), limit, "page %d", pages)
				for _, info := range page {
					seen[fmt.Sprint(info.Name, "#", info.Fence)]++
				}
				pages++
				if next == "" {
					break
				}
				require.Less(t, pages, 1000, "paging does not end")
				cursor = next
			}
			for k := range want {
				assert.Equal(t, 1, seen[k], "%s listed %d times", k, seen[k])
			}
			assert.Len(t, seen, len(want))
			t.Logf("%d holders in %d pages of %d", len(want), pages, limit)
		})
	}
}

// TestListSharedChanging releases and adds holders of a shared name between the pages of a
// List whose pages split the name's holders: every holder held throughout is listed.
func TestListSharedChanging(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client)
	ctx := t.Context()
	const name = "changing"
	fences := map[uint64]string{}
	take := func(token string) {
		f, err := s.Acquire(ctx, guard.Request{Name: name, Token: token, TTL: time.Minute, Shared: true})
		require.NoError(t, err)
		fences[f] = token
	}
	for i := range 12 {
		take(fmt.Sprint("tok", i))
	}
	throughout := map[uint64]bool{}
	for f := range fences {
		throughout[f] = true
	}
	seen := map[uint64]int{}
	cursor, pages := "", 0
	for {
		page, next, err := s.List(ctx, name, cursor, 3)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page), 3)
		for _, info := range page {
			seen[info.Fence]++
		}
		pages++
		if next == "" {
			break
		}
		require.Less(t, pages, 100, "paging does not end")
		// One listed holder goes, a new one comes.
		if len(page) > 0 {
			f := page[0].Fence
			require.NoError(t, s.Release(ctx, name, fences[f], 0))
			delete(throughout, f)
		}
		take(fmt.Sprint("new", pages))
		cursor = next
	}
	for f := range throughout {
		assert.Equal(t, 1, seen[f], "holder %d listed %d times", f, seen[f])
	}
	t.Logf("%d pages", pages)
}
