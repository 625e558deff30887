package testserver

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEtcdCluster starts three members and hurts the leader each way the helpers can: the
// others elect a new leader every time, and a member that comes back follows it.
func TestEtcdCluster(t *testing.T) {
	c := StartEtcdCluster(t, 3)
	require.Len(t, c.Endpoints(), 3)

	old := c.Leader(t)
	old.Isolate(t)
	next := leaderAmong(t, c, old)
	assert.NotSame(t, old, next, "a leader cut off from its peers stayed the leader")
	old.Rejoin()
	assert.Same(t, next, c.Leader(t), "the cluster did not settle on the new leader")

	next.Pause(t)
	third := leaderAmong(t, c, next)
	assert.NotSame(t, next, third)
	next.Resume(t)

	third.Kill()
	assert.NotSame(t, third, c.Leader(t))
	third.Restart(t)
	s, err := third.Status(context.Background())
	require.NoError(t, err)
	assert.NotZero(t, s.Leader, "the restarted member has no leader")

	c.RestartAll(t)
}

// leaderAmong returns the leader that the members other than out agree on.
func leaderAmong(t *testing.T, c *EtcdCluster, out *EtcdMember) *EtcdMember {
	t.Helper()
	others := &EtcdCluster{}
	for _, m := range c.Members {
		if m != out {
			others.Members = append(others.Members, m)
		}
	}
	return others.Leader(t)
}

// TestEtcdPortTaken: another process binds a member's port between its choice and etcd's bind
// (tests of other packages pick free ports at the same time). The cluster starts again on new
// ports rather than failing; on the old code it failed with "address already in use", as it
// did once in a full run.
func TestEtcdPortTaken(t *testing.T) {
	var taken net.Listener
	etcdPortChosen = func(addr string) {
		if taken != nil {
			return
		}
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		taken = l
	}
	t.Cleanup(func() {
		etcdPortChosen = nil
		if taken != nil {
			_ = taken.Close()
		}
	})
	c := StartEtcdCluster(t, 3)
	require.NotNil(t, taken)
	for _, m := range c.Members {
		assert.NotEqual(t, taken.Addr().String(), m.Addr, "a member on the taken port")
	}
	_, err := c.Members[0].Status(context.Background())
	require.NoError(t, err)
}
