package testserver

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failoverWait bounds how long a test waits for a client to find a new primary.
const failoverWait = 30 * time.Second

// eventually polls f until it returns nil, failing the test with f's last error after
// failoverWait.
func eventually(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), failoverWait)
	defer cancel()
	require.NoError(t, poll(ctx, 20*time.Millisecond, func() error { return f(ctx) }), what)
}

func failoverClient(t *testing.T, g *SentinelGroup) *redis.Client {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: g.MasterName, SentinelAddrs: g.Addrs,
		MaxRetries: -1, ReadTimeout: time.Second,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func TestSentinelGroupFailover(t *testing.T) {
	g := StartSentinelGroup(t)
	require.Len(t, g.Sentinels, 3)
	require.Equal(t, g.Nodes[0], g.Primary(t))
	require.Equal(t, g.Nodes[1], g.Replica(t))
	rdb := failoverClient(t, g)
	require.NoError(t, rdb.Set(t.Context(), "before", "1", 0).Err())

	p := g.Failover(t)
	require.Equal(t, g.Nodes[1], p, "the replica was not promoted")
	f, err := RedisInfo(t.Context(), p.Addr, "replication")
	require.NoError(t, err)
	assert.Equal(t, "master", f["role"])

	// The client follows: what it writes now lands on the new primary.
	direct := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	eventually(t, "the failover client did not reach the new primary", func(ctx context.Context) error {
		if err := rdb.Set(ctx, "after", "2", 0).Err(); err != nil {
			return err
		}
		return direct.Get(ctx, "after").Err()
	})
	got, err := direct.Get(t.Context(), "before").Result()
	require.NoError(t, err, "a replicated write was lost by a manual failover")
	assert.Equal(t, "1", got)

	// The former primary becomes the new primary's replica.
	r := g.WaitReplica(t)
	require.Equal(t, g.Nodes[0], r)
	f, err = RedisInfo(t.Context(), r.Addr, "replication")
	require.NoError(t, err)
	assert.Equal(t, "slave", f["role"])
	assert.Equal(t, "up", f["master_link_status"])
}

// TestSentinelGroupLosesUnreplicatedWrite shows what asynchronous replication costs: a write
// the primary acknowledged, and had not sent to its replica when it died, is gone after the
// failover, while an earlier replicated write survives.
func TestSentinelGroupLosesUnreplicatedWrite(t *testing.T) {
	g := StartSentinelGroup(t)
	rdb := failoverClient(t, g)
	replica := redis.NewClient(&redis.Options{Addr: g.Nodes[1].Addr})
	t.Cleanup(func() { _ = replica.Close() })

	require.NoError(t, rdb.Set(t.Context(), "replicated", "1", 0).Err())
	eventually(t, "the write did not reach the replica", func(ctx context.Context) error {
		return replica.Get(ctx, "replicated").Err()
	})

	g.PauseReplication(t)
	require.NoError(t, rdb.Set(t.Context(), "unreplicated", "1", 0).Err(), "the primary acknowledges")
	old := g.KillPrimary(t)
	require.Equal(t, g.Nodes[0], old)
	g.ResumeReplication(t)
	p := g.WaitFailover(t, old)
	require.Equal(t, g.Nodes[1], p)

	eventually(t, "the failover client did not reach the new primary", func(ctx context.Context) error {
		return rdb.Get(ctx, "replicated").Err()
	})
	err := rdb.Get(t.Context(), "unreplicated").Err()
	require.ErrorIs(t, err, redis.Nil, "the write the primary never replicated survived")
}
