package redisstore

// Faults injected for real between go-redis and redis-server, or to the server itself: each
// test reproduces a defect of issue 8 or shows what a guarantee rests on.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// storeVia returns a Guard on a Store whose client talks to addr with opts, both closed when
// the test ends.
func storeVia(t *testing.T, opts *redis.Options, gopts ...guard.Option) (*guard.Guard, *Store) {
	t.Helper()
	c := redis.NewClient(opts)
	s := New(c)
	g := guard.New(s, gopts...)
	t.Cleanup(func() {
		_ = g.Close(context.Background())
		_ = c.Close()
	})
	return g, s
}

// TestLostAcquireReply (defect 1): the server runs an acquire script and its reply is lost.
// A retry by go-redis must find its own lock, and a failure must not strand the lock for the
// whole lease.
func TestLostAcquireReply(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartFaultProxy(t, srv.Addr)
	other := guardOn(t, srv.Addr)
	acquired := testserver.MatchEvalSha(acquireScript.Hash())

	t.Run("DriverRetries", func(t *testing.T) {
		g, _ := storeVia(t, &redis.Options{Addr: p.Addr}) // MaxRetries: 3, the default
		name := uniqueName(t, "x")
		f := p.DropReply(acquired)
		l, err := g.TryAcquire(t.Context(), name)
		require.NoError(t, err, "the retry found its own lock and called it busy")
		<-f.Done()
		_, err = other.TryAcquire(t.Context(), name)
		require.ErrorIs(t, err, guard.ErrNotAcquired)
		require.NoError(t, l.Release(t.Context()))
	})
	t.Run("NoRetries", func(t *testing.T) {
		g, _ := storeVia(t, &redis.Options{Addr: p.Addr, MaxRetries: -1})
		name := uniqueName(t, "x")
		p.DropReply(acquired)
		_, err := g.TryAcquire(t.Context(), name)
		require.Error(t, err)
		require.NotErrorIs(t, err, guard.ErrNotAcquired)
		l, err := other.Acquire(t.Context(), name, guard.WaitTime(5*time.Second))
		require.NoError(t, err, "the lock whose reply was lost stayed taken for its 30 s lease")
		require.NoError(t, l.Release(t.Context()))
	})
	t.Run("ContextTimeout", func(t *testing.T) {
		// The setting docs/operations.md recommends: the caller's deadline ends the wait for
		// a reply that the server will still send.
		g, _ := storeVia(t, &redis.Options{Addr: p.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		name := uniqueName(t, "x")
		p.DelayReply(acquired, time.Second)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := g.TryAcquire(ctx, name)
		// The context's deadline (then the error matches ErrNotAcquired too, as for every wait
		// that the caller's context ends), or go-redis's read timeout set from it.
		require.Error(t, err)
		l, err := other.Acquire(t.Context(), name, guard.WaitTime(5*time.Second))
		require.NoError(t, err, "the lock the timed-out acquire took stayed taken for its 30 s lease")
		require.NoError(t, l.Release(t.Context()))
	})
}

// TestEvictingServer (defect 2): a server whose maxmemory-policy can evict keys is refused by
// default, and the test shows why: under memory pressure it drops a held lock, and a second
// owner takes the name while the first one's context is live.
func TestEvictingServer(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.WithArgs("--maxmemory", "4mb", "--maxmemory-policy", "volatile-ttl"))
	name := uniqueName(t, "x")

	refused := guardOn(t, srv.Addr)
	_, err := refused.TryAcquire(t.Context(), name)
	require.ErrorIs(t, err, ErrEvictingServer)
	assert.NotErrorIs(t, err, guard.ErrNotAcquired)
	t.Logf("refused: %v", err)

	opts := &redis.Options{Addr: srv.Addr}
	first, _ := storeViaOpts(t, opts, AllowEviction())
	second, _ := storeViaOpts(t, opts, AllowEviction())
	l, err := first.Acquire(t.Context(), name)
	require.NoError(t, err)
	// A cache fills the server: keys with a longer TTL than the lock's, so volatile-ttl
	// evicts the lock first.
	filler := redis.NewClient(opts)
	defer filler.Close()
	value := strings.Repeat("x", 16<<10)
	for i := 0; ; i++ {
		require.Less(t, i, 10000, "the server never evicted anything")
		require.NoError(t, filler.Set(t.Context(), fmt.Sprint("cache:", i), value, time.Hour).Err())
		if n, _ := filler.Exists(t.Context(), New(filler).lockKey(name)).Result(); n == 0 {
			break
		}
	}
	l2, err := second.TryAcquire(t.Context(), name)
	require.NoError(t, err, "the evicted lock was not free")
	assert.NoError(t, l.Err(), "both holders' contexts are live: that is why eviction is refused")
	_ = l2.Release(t.Context())
}

// storeViaOpts is storeVia with Store options.
func storeViaOpts(t *testing.T, opts *redis.Options, sopts ...Option) (*guard.Guard, *Store) {
	t.Helper()
	c := redis.NewClient(opts)
	s := New(c, sopts...)
	g := guard.New(s)
	t.Cleanup(func() {
		_ = g.Close(context.Background())
		_ = c.Close()
	})
	return g, s
}

// TestRestart (defect 3): a server killed and restarted. Without persistence it comes back
// empty: the holder learns it lost the lock, and fences still go up. With persistence the
// holder keeps its lock across a quick restart.
func TestRestart(t *testing.T) {
	const ttl = 3 * time.Second
	t.Run("WithoutPersistence", func(t *testing.T) {
		srv := testserver.StartRedis(t)
		g, _ := storeVia(t, &redis.Options{Addr: srv.Addr}, guard.WithWatchdogTimeout(ttl))
		name := uniqueName(t, "x")
		var last uint64
		for range 5 {
			l, err := g.TryAcquire(t.Context(), name)
			require.NoError(t, err)
			last = l.Fence()
			require.NoError(t, l.Release(t.Context()))
		}
		held, err := g.TryAcquire(t.Context(), name)
		require.NoError(t, err)
		srv.Kill()
		srv.Restart(t)
		select {
		case <-held.Done():
			require.ErrorIs(t, held.Err(), guard.ErrLockLost)
		case <-time.After(2 * ttl):
			t.Fatal("the holder did not learn that the restarted server lost its lock")
		}
		l, err := guardOn(t, srv.Addr).TryAcquire(t.Context(), name)
		require.NoError(t, err)
		t.Logf("fences: %d before the restart, %d after", max(last, held.Fence()), l.Fence())
		assert.Greater(t, l.Fence(), held.Fence(), "the fence went backwards after a restart without persistence")
		require.NoError(t, l.Release(t.Context()))
	})
	t.Run("WithPersistence", func(t *testing.T) {
		srv := testserver.StartRedis(t, testserver.WithPersistence())
		g, _ := storeVia(t, &redis.Options{Addr: srv.Addr}, guard.WithWatchdogTimeout(ttl))
		name := uniqueName(t, "x")
		held, err := g.TryAcquire(t.Context(), name)
		require.NoError(t, err)
		srv.Kill()
		srv.Restart(t)
		_, err = guardOn(t, srv.Addr).TryAcquire(t.Context(), name)
		require.ErrorIs(t, err, guard.ErrNotAcquired, "the restarted server lost an acknowledged lock")
		// The holder renews across the restart and keeps the lock past its first lease.
		select {
		case <-held.Done():
			t.Fatalf("lost across a persistent restart: %v", held.Err())
		case <-time.After(ttl + ttl/2):
		}
		require.NoError(t, held.Release(t.Context()))
	})
}

// TestSlowRenewalLosesNoLock (defect 4): one renewal round trip delayed past the TTL used to
// cost every lock of the Guard. Now the renewal is sent again on another connection.
func TestSlowRenewalLosesNoLock(t *testing.T) {
	const (
		ttl   = 600 * time.Millisecond
		locks = 50
	)
	srv := testserver.StartRedis(t)
	p := testserver.StartFaultProxy(t, srv.Addr)
	g, _ := storeVia(t, &redis.Options{Addr: p.Addr}, guard.WithWatchdogTimeout(ttl))
	var held []*guard.Lock
	for i := range locks {
		l, err := g.Acquire(t.Context(), uniqueName(t, fmt.Sprint(i)))
		require.NoError(t, err)
		held = append(held, l)
	}
	f := p.DelayReply(testserver.MatchEvalSha(extendScript.Hash()), 700*time.Millisecond)
	select {
	case <-f.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal was delayed")
	}
	<-time.After(2 * ttl) // two more leases' worth of renewals
	lost := 0
	for _, l := range held {
		if l.Err() != nil {
			lost++
		}
	}
	assert.Zero(t, lost, "%d of %d locks lost to one slow renewal", lost, locks)
}

// TestSlowClusterNode (defect 4): one Cluster node turns slow. The locks on it are lost — their
// renewals cannot come back in time — but the locks on the other nodes must not go with them.
func TestSlowClusterNode(t *testing.T) {
	const ttl = 600 * time.Millisecond
	c := testserver.StartCluster(t)
	slow := c.Addrs[0]
	p := testserver.StartFaultProxy(t, slow)
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == slow {
				addr = p.Addr
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	s := New(client)
	g := guard.New(s, guard.WithWatchdogTimeout(ttl))
	t.Cleanup(func() { _ = g.Close(context.Background()) })

	onSlow := map[*guard.Lock]bool{}
	for i := range 30 {
		name := uniqueName(t, fmt.Sprint(i))
		l, err := g.Acquire(t.Context(), name)
		require.NoError(t, err)
		onSlow[l] = s.Partition(name) == slow
	}
	p.SetLatency(ttl, 0)
	<-time.After(3 * ttl)
	var lostSlow, lostHealthy, slowCount int
	for l, isSlow := range onSlow {
		if isSlow {
			slowCount++
		}
		switch {
		case l.Err() != nil && isSlow:
			lostSlow++
		case l.Err() != nil:
			lostHealthy++
		}
	}
	t.Logf("%d locks on the slow node, %d of them lost; %d lost on the healthy nodes", slowCount, lostSlow, lostHealthy)
	require.NotZero(t, slowCount)
	assert.Zero(t, lostHealthy, "locks on healthy nodes were lost with the slow node's")
	assert.Equal(t, slowCount, lostSlow, "the slow node's locks outlived renewals that could not come back")
}

// TestReleaseDuringReconnect (defect 5): a release published while a waiter's subscription is
// reconnecting is lost; the waiter must still learn of it when the subscription is back, not
// when the holder's lease would have ended.
func TestReleaseDuringReconnect(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartFaultProxy(t, srv.Addr)
	holder := guardOn(t, srv.Addr)
	name := uniqueName(t, "x")
	l, err := holder.Acquire(t.Context(), name) // a 30 s lease
	require.NoError(t, err)

	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { _ = c.Close() })
	sp := locktest.NewSpy(New(c), 8)
	waiter := guard.New(sp)
	t.Cleanup(func() { _ = waiter.Close(context.Background()) })
	got := make(chan error, 1)
	go func() {
		w, err := waiter.Acquire(t.Context(), name)
		if err == nil {
			err = w.Release(t.Context())
		}
		got <- err
	}()
	<-sp.Busy()
	<-sp.Busy() // parked, watching the name

	p.Refuse()
	p.Reset() // the subscription's connection breaks and cannot come back yet
	require.NoError(t, l.Release(t.Context()))
	p.Allow()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the release published during the reconnect was never made up for (the holder's lease is 30 s)")
	}
}

// TestServerPaused: a server stopped (SIGSTOP) answers nothing; the holder's context must end
// by its deadline, and the lock works again once the server resumes.
func TestServerPaused(t *testing.T) {
	const ttl = 900 * time.Millisecond
	srv := testserver.StartRedis(t)
	g, _ := storeVia(t, &redis.Options{Addr: srv.Addr}, guard.WithWatchdogTimeout(ttl))
	name := uniqueName(t, "x")
	l, err := g.Acquire(t.Context(), name)
	require.NoError(t, err)
	srv.Pause(t)
	deadline := l.Deadline()
	select {
	case <-l.Done():
	case <-time.After(3 * ttl):
		t.Fatal("the holder's context outlived a paused server")
	}
	ended := time.Now()
	require.ErrorIs(t, l.Err(), guard.ErrLockLost)
	t.Logf("ended %v after the last confirmed deadline", ended.Sub(deadline))
	srv.Resume(t)
	l2, err := guardOn(t, srv.Addr).Acquire(t.Context(), name, guard.WaitTime(5*time.Second))
	require.NoError(t, err)
	assert.Greater(t, l2.Fence(), l.Fence())
	require.NoError(t, l2.Release(t.Context()))
}

// TestSentinelFailover: a Sentinel group (primary, replica, three sentinels). A failover that
// promotes a replica which has every acquisition keeps the holder's lock; one that promotes a
// replica which missed an acquisition (replication cut, primary killed) loses it — and then a
// second owner can take the name while the first one's context is still live, until its next
// renewal (with the default 30 s lease, up to 10 s later). WithReplicaAcks refuses an
// acquisition the replica has not acknowledged, so that cannot happen.
func TestSentinelFailover(t *testing.T) {
	const ttl = guard.DefaultWatchdogTimeout
	grp := testserver.StartSentinelGroup(t)
	failoverGuard := func(t *testing.T, sopts ...Option) *guard.Guard {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: grp.MasterName, SentinelAddrs: grp.Addrs})
		t.Cleanup(func() { _ = c.Close() })
		g := guard.New(New(c, sopts...))
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		return g
	}

	t.Run("ReplicaAcks", func(t *testing.T) {
		g := failoverGuard(t, WithReplicaAcks(1, 200*time.Millisecond))
		name := uniqueName(t, "x")
		l, err := g.TryAcquire(t.Context(), name)
		require.NoError(t, err, "an acquisition the replica acknowledged")
		require.NoError(t, l.Release(t.Context()))
		grp.PauseReplication(t)
		_, err = g.TryAcquire(t.Context(), name)
		grp.ResumeReplication(t)
		require.ErrorIs(t, err, ErrNotReplicated, "an acquisition the replica did not acknowledge")
		assert.NotErrorIs(t, err, guard.ErrNotAcquired)
		grp.WaitReplica(t)
	})

	t.Run("Promoted", func(t *testing.T) {
		g, other := failoverGuard(t), failoverGuard(t)
		name := uniqueName(t, "x")
		l, err := g.Acquire(t.Context(), name)
		require.NoError(t, err)
		primary := redis.NewClient(&redis.Options{Addr: grp.Primary(t).Addr})
		defer primary.Close()
		require.EqualValues(t, 1, primary.Wait(t.Context(), 1, 5*time.Second).Val(), "the replica has the lock")
		grp.Failover(t)
		_, err = other.TryAcquire(t.Context(), name)
		require.ErrorIs(t, err, guard.ErrNotAcquired, "the new primary lost a replicated lock")
		require.NoError(t, l.Err(), "the holder lost a lock that the failover kept")
		require.NoError(t, l.Release(t.Context()))
		grp.WaitReplica(t)
	})

	t.Run("LostWrite", func(t *testing.T) {
		g, other := failoverGuard(t), failoverGuard(t)
		name := uniqueName(t, "x")
		grp.PauseReplication(t)
		l, err := g.Acquire(t.Context(), name)
		require.NoError(t, err)
		old := grp.KillPrimary(t)
		grp.ResumeReplication(t)
		grp.WaitFailover(t, old)
		l2, err := other.Acquire(t.Context(), name, guard.WaitTime(ttl))
		require.NoError(t, err)
		double := l.Err() == nil
		t.Logf("after the failover another owner took the name; the first holder's context live: %v", double)
		assert.True(t, double, "expected the unsafe case without WithReplicaAcks: both contexts live")
		select { // its next renewal finds the lock gone
		case <-l.Done():
			require.ErrorIs(t, l.Err(), guard.ErrLockLost)
		case <-time.After(ttl):
			t.Fatal("the first holder never learned")
		}
		assert.Greater(t, l2.Fence(), l.Fence(), "fences still order the two holders")
		_ = l2.Release(t.Context())
	})
}

// TestClusterFailover: a Cluster with a replica per master. A coordinated failover (CLUSTER
// FAILOVER) keeps every lock; a master killed and replaced by its replica never leaves two
// owners whose contexts are live at once.
func TestClusterFailover(t *testing.T) {
	const ttl = 3 * time.Second
	c := testserver.StartClusterWithReplicas(t)
	clusterGuard := func(t *testing.T) (*guard.Guard, *redis.ClusterClient) {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
		t.Cleanup(func() { _ = client.Close() })
		g := guard.New(New(client), guard.WithWatchdogTimeout(ttl))
		t.Cleanup(func() { _ = g.Close(context.Background()) })
		return g, client
	}
	holder, hc := clusterGuard(t)
	other, oc := clusterGuard(t)
	names := make([]string, 12)
	locks := make([]*guard.Lock, len(names))
	for i := range names {
		names[i] = uniqueName(t, fmt.Sprint(i))
		l, err := holder.Acquire(t.Context(), names[i])
		require.NoError(t, err)
		locks[i] = l
	}

	c.Failover(t, 0)
	for _, cl := range []*redis.ClusterClient{hc, oc} {
		cl.ReloadState(t.Context())
	}
	for i, name := range names {
		_, err := other.TryAcquire(t.Context(), name)
		require.ErrorIs(t, err, guard.ErrNotAcquired, "%s free after a coordinated failover", name)
		require.NoError(t, locks[i].Err())
	}

	c.KillMaster(t, 1)
	for _, cl := range []*redis.ClusterClient{hc, oc} {
		cl.ReloadState(t.Context())
	}
	var mu sync.Mutex // protects doubles
	doubles := 0
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			l2, err := other.TryAcquire(t.Context(), name)
			if err != nil {
				return
			}
			if locks[i].Err() == nil {
				mu.Lock()
				doubles++
				mu.Unlock()
			}
			_ = l2.Release(t.Context())
		})
	}
	wg.Wait()
	assert.Zero(t, doubles, "two owners with live contexts after a master was killed")
}
