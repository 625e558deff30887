package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
)

// TestExtendMany renews a batch larger than one script on a single node and a Cluster: each
// lock gets its own TTL, a lock held by another token or free is answered ErrNotHeld and left
// as it was, shared holders are renewed one by one, a lock named twice keeps its last lease
// even when the two are in different scripts, and the batch costs one script per 256 leases
// of a slot (it failed on the old code, which ran one script per lease).
func TestExtendMany(t *testing.T) {
	for _, dep := range deployments[:2] {
		t.Run(dep.name, func(t *testing.T) {
			t.Parallel()
			d := dep.start(t)
			s, _ := d.counted(t)
			admin := d.admin(t)
			ctx := t.Context()
			const n = 600
			names := make([]string, n)
			var leases []guard.Lease
			for i := range names {
				names[i] = uniqueName(t, fmt.Sprint(i))
				_, err := s.Acquire(ctx, guard.Request{Name: names[i], Token: "tok", TTL: 5 * time.Second})
				require.NoError(t, err)
				leases = append(leases, guard.Lease{Name: names[i], Token: "tok", TTL: time.Duration(30+i%50) * time.Second})
			}
			// Two shared holders of one name, and a third that never held it.
			shared := uniqueName(t, "shared")
			for _, tok := range []string{"r1", "r2"} {
				_, err := s.Acquire(ctx, sharedReq(shared, tok, 0, 5*time.Second))
				require.NoError(t, err)
			}
			leases = append(leases,
				guard.Lease{Name: shared, Token: "r1", TTL: 40 * time.Second},
				guard.Lease{Name: shared, Token: "r2", TTL: 50 * time.Second},
				guard.Lease{Name: shared, Token: "r3", TTL: 50 * time.Second},
				guard.Lease{Name: names[7], Token: "other", TTL: time.Hour}, // not its token
				guard.Lease{Name: uniqueName(t, "free"), Token: "tok", TTL: time.Hour},
				guard.Lease{Name: names[0], Token: "tok", TTL: 90 * time.Second}, // named twice: the last stands
			)
			if dep.name == "Single" {
				require.NoError(t, s.Extend(ctx, leases[1:2])[0]) // the server learns the script
				d.resetStats(t)
			}
			errs := s.Extend(ctx, leases)
			require.Len(t, errs, len(leases))
			for i := range n {
				require.NoError(t, errs[i], names[i])
			}
			require.NoError(t, errs[n])
			require.NoError(t, errs[n+1])
			assert.ErrorIs(t, errs[n+2], guard.ErrNotHeld, "a shared name's token that never held it")
			assert.ErrorIs(t, errs[n+3], guard.ErrNotHeld, "another token")
			assert.ErrorIs(t, errs[n+4], guard.ErrNotHeld, "a free name")
			require.NoError(t, errs[n+5])
			if dep.name == "Single" {
				calls := d.commandCalls(t, "evalsha", "eval")
				assert.Equal(t, (n+6+extendChunk-1)/extendChunk, calls["evalsha"]+calls["eval"], "scripts for one batch")
			}

			near := func(key string, want time.Duration) {
				t.Helper()
				got, err := admin.PTTL(ctx, key).Result()
				require.NoError(t, err)
				assert.InDelta(t, want.Seconds(), got.Seconds(), 2, key)
			}
			for i, name := range names[1:] {
				near(s.lockKey(name), leases[i+1].TTL)
				near(s.lockKey(name)+fenceSuffix, leases[i+1].TTL+fenceRetention)
			}
			near(s.lockKey(names[0]), 90*time.Second)
			now, err := admin.Time(ctx).Result()
			require.NoError(t, err)
			for tok, want := range map[string]time.Duration{"r1": 40 * time.Second, "r2": 50 * time.Second} {
				score, err := admin.ZScore(ctx, s.lockKey(shared)+sharedSuffix, tok).Result()
				require.NoError(t, err)
				assert.InDelta(t, want.Seconds(), time.UnixMilli(int64(score)).Sub(now).Seconds(), 2, tok)
			}
			near(s.lockKey(shared)+sharedSuffix, 50*time.Second)
			near(s.lockKey(shared)+holdersSuffix, 50*time.Second)
		})
	}
}

// TestExtendManyNoScript renews a batch on a server that lost its scripts: it sends them
// again with EVAL.
func TestExtendManyNoScript(t *testing.T) {
	d := startSingle(t)
	s, _ := d.counted(t)
	ctx := t.Context()
	var leases []guard.Lease
	for i := range 300 {
		name := uniqueName(t, fmt.Sprint(i))
		_, err := s.Acquire(ctx, guard.Request{Name: name, Token: "tok", TTL: 5 * time.Second})
		require.NoError(t, err)
		leases = append(leases, guard.Lease{Name: name, Token: "tok", TTL: time.Minute})
	}
	d.flushScripts(t)
	for i, err := range s.Extend(ctx, leases) {
		require.NoError(t, err, i)
	}
	bad := s.Extend(ctx, []guard.Lease{{Name: leases[0].Name, Token: "tok", TTL: 0}})
	assert.Error(t, bad[0], "a lease that is not positive")
}

// TestGuardWithManyLocks holds more locks than one script renews on one Guard, with a short
// watchdog: none is lost over several renewals, and a lock whose key is deleted is reported
// lost while the others stay held.
func TestGuardWithManyLocks(t *testing.T) {
	d := startSingle(t)
	s, _ := d.counted(t)
	g := guard.New(s, guard.WithWatchdogTimeout(900*time.Millisecond))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ctx := t.Context()
	var held []*guard.Lock
	for i := range 700 {
		l, err := g.TryAcquire(ctx, uniqueName(t, fmt.Sprint(i)))
		require.NoError(t, err)
		held = append(held, l)
	}
	require.NoError(t, d.admin(t).Del(ctx, s.lockKey(uniqueName(t, "3"))).Err())
	select {
	case <-held[3].Context().Done():
		assert.ErrorIs(t, context.Cause(held[3].Context()), guard.ErrLockLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the deleted lock was not reported lost")
	}
	time.Sleep(2 * time.Second) // more than two leases' worth of renewals
	for i, l := range held {
		if i != 3 {
			require.NoError(t, l.Err(), i)
		}
		_ = l.Release(ctx)
	}
}
