package etcdstore

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
)

// faultTTL is the watchdog timeout of the fault tests' Guards: longer than a failover (an
// election timeout of 1 s, up to twice that with its jitter, and the client's move to another
// member), so that a lock whose lease is never in doubt must survive every fault that leaves a
// quorum.
const faultTTL = 6 * time.Second

// newFaultGuard returns a Guard on a Store with a client of its own that knows every member.
func newFaultGuard(t *testing.T, c *testserver.EtcdCluster, opts ...guard.Option) *guard.Guard {
	t.Helper()
	s := New(newClient(t, c.Endpoints(), nil))
	t.Cleanup(func() { _ = s.Close() })
	g := guard.New(s, append([]guard.Option{guard.WithWatchdogTimeout(faultTTL)}, opts...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	})
	return g
}

// clusterFault is one fault of a three-member cluster: inject returns what takes it back,
// which the test calls after lasts (default: past the held lock's lease).
type clusterFault struct {
	name   string
	inject func(t *testing.T, c *testserver.EtcdCluster) (heal func())
	lasts  time.Duration
}

// clusterFaults are the faults a cluster of three survives: each leaves a quorum that can
// elect a leader. The leader is the member each one hurts: the one whose loss costs most.
var clusterFaults = []clusterFault{
	{"KillLeader", func(t *testing.T, c *testserver.EtcdCluster) func() {
		l := c.Leader(t)
		l.Kill()
		return func() { l.Restart(t) }
	}, 0},
	{"IsolateLeaderFromPeers", func(t *testing.T, c *testserver.EtcdCluster) func() {
		l := c.Leader(t)
		l.Isolate(t)
		return l.Rejoin
	}, 0},
	{"IsolateLeaderFromAll", func(t *testing.T, c *testserver.EtcdCluster) func() {
		l := c.Leader(t)
		l.Isolate(t)
		l.Client.Blackhole()
		return func() {
			l.Client.Heal()
			l.Rejoin()
		}
	}, 0},
	// Paused for less than its leases' TTL. A leader paused for longer revokes, when it
	// resumes, the leases whose time ran out by its stopped clock, live as they are on the
	// others — etcd v3.7.3 skips its leadership check while the raft loop ticks, and a
	// resumed process ticks at once (etcd issue 15247): the locks on them are lost, and their
	// holders hear of it only at their next renewal. See docs/backends.md.
	{"PauseLeader", func(t *testing.T, c *testserver.EtcdCluster) func() {
		l := c.Leader(t)
		l.Pause(t)
		return func() { l.Resume(t) }
	}, 3 * time.Second},
	{"RestartFollowers", func(t *testing.T, c *testserver.EtcdCluster) func() {
		l := c.Leader(t)
		for _, m := range c.Members {
			if m != l {
				m.Restart(t)
			}
		}
		return func() {}
	}, 0},
}

// TestClusterFaults hurts a three-member cluster while a lock is held, another Guard waits for
// it, and Guards contend for a third name: the held lock's context must live on (its lease was
// never in doubt), the waiter must get the lock when it is released, a fresh name must be
// granted soon after the fault, and no two holders of a name may ever overlap, with fences in
// order.
func TestClusterFaults(t *testing.T) {
	c := testserver.StartEtcdCluster(t, 3)
	for _, f := range clusterFaults {
		t.Run(f.name, func(t *testing.T) {
			holder, waiter, other := newFaultGuard(t, c), newFaultGuard(t, c), newFaultGuard(t, c)
			held := "held:" + t.Name()
			l, err := holder.Acquire(t.Context(), held)
			require.NoError(t, err)
			waited := make(chan *guard.Lock, 1)
			go func() {
				w, err := waiter.Acquire(t.Context(), held, guard.WaitTime(time.Minute))
				if err != nil {
					t.Errorf("waiter: %v", err)
				}
				waited <- w
			}()
			stop := contend(t, c, "contended:"+t.Name())

			hurt := time.Now()
			heal := f.inject(t, c)
			granted := firstGrant(t, other, "fresh:"+t.Name())
			t.Logf("%s: a fresh name granted %v after the fault", f.name, granted.Sub(hurt).Round(time.Millisecond))
			// Through a whole lease after the fault: renewals must have gone on.
			lasts := f.lasts
			if lasts == 0 {
				lasts = faultTTL + faultTTL/2
			}
			select {
			case <-l.Done():
				t.Fatalf("the holder's context ended: %v", l.Err())
			case <-time.After(time.Until(hurt.Add(lasts))):
			}
			heal()
			select {
			case <-l.Done():
				t.Fatalf("the holder's context ended: %v", l.Err())
			case <-time.After(time.Until(hurt.Add(faultTTL + faultTTL/2))):
			}
			c.Leader(t)

			released := time.Now()
			require.NoError(t, l.Release(t.Context()))
			select {
			case w := <-waited:
				require.NotNil(t, w)
				t.Logf("the waiter took the lock %v after its release", time.Since(released).Round(time.Millisecond))
				assert.Greater(t, w.Fence(), l.Fence())
				require.NoError(t, w.Release(t.Context()))
			case <-time.After(30 * time.Second):
				t.Fatal("the waiter never got the lock")
			}
			stop()
		})
	}
}

// firstGrant tries to take name until it gets it, and returns when it did.
func firstGrant(t *testing.T, g *guard.Guard, name string) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		l, err := g.Acquire(ctx, name, guard.WaitTime(3*time.Second))
		cancel()
		if err == nil {
			at := l.AcquiredAt()
			require.NoError(t, l.Release(t.Context()))
			return at
		}
	}
	t.Fatalf("%s was never granted", name)
	return time.Time{}
}

// contend runs Guards that take name in turns, each checking that it is alone inside and that
// fences only go up, until the returned stop is called; stop fails the test on an overlap or a
// fence that went back, and logs what the contenders did.
func contend(t *testing.T, c *testserver.EtcdCluster, name string) (stop func()) {
	t.Helper()
	var (
		inside, overlaps, backwards, done, failed atomic.Int64
		last                                      atomic.Uint64
		wg                                        sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	for range 3 {
		g := newFaultGuard(t, c)
		for range 2 {
			wg.Go(func() {
				for ctx.Err() == nil {
					actx, acancel := context.WithTimeout(ctx, 10*time.Second)
					err := g.Do(actx, name, func(lctx context.Context) error {
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						l, _ := guard.FromContext(lctx)
						if prev := last.Swap(l.Fence()); l.Fence() <= prev {
							backwards.Add(1)
						}
						for range 3 {
							runtime.Gosched()
						}
						inside.Add(-1)
						done.Add(1)
						return nil
					}, guard.WaitTime(10*time.Second))
					acancel()
					if err != nil && ctx.Err() == nil && !errors.Is(err, guard.ErrNotAcquired) {
						failed.Add(1)
					}
				}
			})
		}
	}
	return func() {
		cancel()
		wg.Wait()
		t.Logf("contention on one name: %d sections, %d failed attempts (backend errors during the fault)", done.Load(), failed.Load())
		assert.Zero(t, overlaps.Load(), "two holders at once")
		assert.Zero(t, backwards.Load(), "a fence went back")
		assert.Positive(t, done.Load())
	}
}

// TestClusterLossWhenCutOff cuts a holder's client off from every member: then its lease is in
// doubt, and its context must end with ErrLockLost by its deadline — while a holder of the same
// cluster that can still reach it keeps its lock.
func TestClusterLossWhenCutOff(t *testing.T) {
	c := testserver.StartEtcdCluster(t, 3)
	const ttl = 3 * time.Second
	var cut []*testserver.FaultProxy
	for _, m := range c.Members {
		// A second way in to each member, for the holder that is cut off.
		cut = append(cut, testserver.StartFaultProxy(t, m.Addr))
	}
	var eps []string
	for _, p := range cut {
		eps = append(eps, p.Addr)
	}
	s := New(newClient(t, eps, nil), WithRequestTimeout(2*time.Second))
	t.Cleanup(func() { _ = s.Close() })
	lonely := guard.New(s, guard.WithWatchdogTimeout(ttl))
	t.Cleanup(func() { _ = lonely.Close(context.Background()) })
	connected := newFaultGuard(t, c, guard.WithWatchdogTimeout(ttl))

	lost, err := lonely.Acquire(t.Context(), "cut:"+t.Name())
	require.NoError(t, err)
	kept, err := connected.Acquire(t.Context(), "kept:"+t.Name())
	require.NoError(t, err)
	for _, p := range cut {
		p.Blackhole()
	}
	deadline := lost.Deadline()
	select {
	case <-lost.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the cut-off holder's context outlived its lease")
	}
	ended := time.Now()
	require.ErrorIs(t, lost.Err(), guard.ErrLockLost)
	assert.True(t, ended.Before(deadline.Add(50*time.Millisecond)), "lost at %v, deadline %v", ended, deadline)
	t.Logf("cut off: context ended %v before its deadline: %v", deadline.Sub(ended), lost.Err())

	// The cluster gives the name to another once the lease runs out there.
	took := firstGrant(t, connected, "cut:"+t.Name())
	t.Logf("taken by another %v after the cut-off holder's deadline", took.Sub(deadline).Round(time.Millisecond))
	assert.NoError(t, kept.Err(), "a holder that reaches the cluster lost its lock")
	for _, p := range cut {
		p.Heal()
	}
	require.NoError(t, kept.Release(t.Context()))
}

// TestClusterRestartAll restarts every member, one after the other and then all at once: held
// locks and fences survive, since every member keeps its data.
func TestClusterRestartAll(t *testing.T) {
	c := testserver.StartEtcdCluster(t, 3)
	g := newFaultGuard(t, c)
	name := "restart:" + t.Name()
	l, err := g.Acquire(t.Context(), name, guard.LeaseTime(time.Minute))
	require.NoError(t, err)
	for _, m := range c.Members {
		m.Restart(t)
	}
	c.Leader(t)
	c.RestartAll(t)
	other := newFaultGuard(t, c)
	_, err = other.TryAcquire(t.Context(), name)
	require.ErrorIs(t, err, guard.ErrNotAcquired, "a lock held through restarts was free after them")
	require.NoError(t, l.Release(t.Context()))
	next, err := other.Acquire(t.Context(), name, guard.WaitTime(10*time.Second))
	require.NoError(t, err)
	assert.Greater(t, next.Fence(), l.Fence())
	require.NoError(t, next.Release(t.Context()))
}
