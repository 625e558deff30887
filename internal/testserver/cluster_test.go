package testserver

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clusterKeys are keys in different slots, so on every shard.
var clusterKeys = []string{"a", "b", "c", "d", "e", "f", "g", "h"}

// usable waits until rdb can write and read back every one of clusterKeys with value v. A
// ClusterClient learns that a dead master was replaced only from its next state reload
// (ClusterStateReloadInterval, default 60 s): usable forces one after a failed try.
func usable(t *testing.T, rdb *redis.ClusterClient, v string) {
	t.Helper()
	tried := false
	eventually(t, "the cluster client cannot use every shard", func(ctx context.Context) error {
		if tried {
			rdb.ReloadState(ctx) // in the background: a later try sees it
		}
		tried = true
		for _, k := range clusterKeys {
			if err := rdb.Set(ctx, k, v, 0).Err(); err != nil {
				return fmt.Errorf("SET %s: %w", k, err)
			}
			got, err := rdb.Get(ctx, k).Result()
			if err != nil {
				return fmt.Errorf("GET %s: %w", k, err)
			}
			if got != v {
				return fmt.Errorf("GET %s = %q, want %q", k, got, v)
			}
		}
		return nil
	})
}

func TestClusterWithReplicas(t *testing.T) {
	c := StartClusterWithReplicas(t)
	require.Len(t, c.Nodes, 6)
	require.Len(t, c.Addrs, 3)
	for i := range 3 {
		assert.Equal(t, c.Nodes[i], c.Master(t, i), "master of shard %d", i)
		assert.Equal(t, c.Nodes[3+i], c.Replica(t, i), "replica of shard %d", i)
		f, err := RedisInfo(t.Context(), c.Nodes[3+i].Addr, "replication")
		require.NoError(t, err)
		assert.Equal(t, "up", f["master_link_status"], "replica of shard %d", i)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	usable(t, rdb, "0")

	t.Run("CLUSTER FAILOVER", func(t *testing.T) {
		p := c.Failover(t, 0)
		assert.Equal(t, c.Nodes[3], p)
		assert.Equal(t, c.Nodes[3], c.Master(t, 0))
		assert.Equal(t, c.Nodes[0], c.Replica(t, 0), "the former master is not the replica")
		usable(t, rdb, "1")
	})

	t.Run("kill the master", func(t *testing.T) {
		old := c.Master(t, 1)
		p := c.KillMaster(t, 1)
		assert.Equal(t, c.Nodes[4], p)
		assert.Equal(t, c.Nodes[4], c.Master(t, 1))
		assert.True(t, old.Exited())
		usable(t, rdb, "2")

		// Restarted, the dead master rejoins as the new master's replica.
		old.Restart(t)
		eventually(t, "the restarted node did not rejoin as a replica", func(ctx context.Context) error {
			rdb := newNodeClient(old.Addr)
			defer rdb.Close()
			return isReplicaOf(ctx, rdb, p)
		})
		assert.Equal(t, old, c.Replica(t, 1))
	})
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends the goroutine
// that called it, as testing's does.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatal runs f with a fatalRecorder in a goroutine of its own and returns what it passed
// to Fatalf ("" for nothing).
func fatal(t *testing.T, f func(tb testing.TB)) string {
	tb := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.fatal
}
