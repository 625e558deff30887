package testserver

import (
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartRedis(t *testing.T) {
	r := StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })

	require.NoError(t, rdb.Set(t.Context(), "k", "v", 0).Err())
	cfg, err := rdb.ConfigGet(t.Context(), "save").Result()
	require.NoError(t, err)
	assert.Empty(t, cfg["save"], "persistence must be off")
	cfg, err = rdb.ConfigGet(t.Context(), "dir").Result()
	require.NoError(t, err)
	assert.Equal(t, r.Dir, cfg["dir"])

	r.Kill()
	r.Kill() // a second Kill is harmless
	assert.Error(t, rdb.Ping(t.Context()).Err(), "a killed server must not answer")
}

func TestStartCluster(t *testing.T) {
	c := StartCluster(t)
	require.Len(t, c.Addrs, 3)

	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	// Keys in different slots live on different masters; every one must be writable.
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		require.NoError(t, rdb.Set(t.Context(), k, "v", 0).Err(), k)
	}
	// Each node agrees that there are three masters, each owning some slots.
	for _, addr := range c.Addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		slots, err := node.ClusterSlots(t.Context()).Result()
		_ = node.Close()
		require.NoError(t, err)
		owners := map[string]bool{}
		for _, s := range slots {
			owners[s.Nodes[0].Addr] = true
		}
		assert.Len(t, owners, 3, "masters seen from %s", addr)
	}
	for i := range 3 {
		assert.Equal(t, c.Nodes[i], c.Master(t, i))
	}
	assert.Contains(t, fatal(t, func(tb testing.TB) { c.Failover(tb, 0) }), "StartClusterWithReplicas",
		"a failover without replicas")
}

func TestStartSentinel(t *testing.T) {
	s := StartSentinel(t)
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = sc.Close() })
	got, err := sc.GetMasterAddrByName(t.Context(), s.MasterName).Result()
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, s.Master.Addr, net.JoinHostPort(got[0], got[1]))

	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    s.MasterName,
		SentinelAddrs: []string{s.Addr},
	})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Set(t.Context(), "k", "v", 0).Err())
}

func TestRedisRestart(t *testing.T) {
	tests := []struct {
		name     string
		opts     []RedisOption
		wantKept bool
	}{
		{"without persistence the data is gone", nil, false},
		{"with persistence every acknowledged write is kept", []RedisOption{WithPersistence()}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := StartRedis(t, tt.opts...)
			addr, dir := r.Addr, r.Dir
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			require.NoError(t, rdb.Set(t.Context(), "k", "v", 0).Err())

			r.Kill()
			require.True(t, r.Exited())
			require.Error(t, rdb.Ping(t.Context()).Err(), "a killed server must not answer")
			r.Restart(t)
			require.False(t, r.Exited())
			assert.Equal(t, addr, r.Addr, "same port")
			cfg, err := rdb.ConfigGet(t.Context(), "dir").Result()
			require.NoError(t, err)
			assert.Equal(t, dir, cfg["dir"], "same directory")

			got, err := rdb.Get(t.Context(), "k").Result()
			if tt.wantKept {
				require.NoError(t, err)
				assert.Equal(t, "v", got)
			} else {
				require.ErrorIs(t, err, redis.Nil)
			}
		})
	}

	t.Run("a running server is killed first", func(t *testing.T) {
		r := StartRedis(t)
		rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		before, err := RedisInfo(t.Context(), r.Addr, "server")
		require.NoError(t, err)
		r.Restart(t)
		after, err := RedisInfo(t.Context(), r.Addr, "server")
		require.NoError(t, err)
		assert.NotEqual(t, before["run_id"], after["run_id"], "the server did not restart")
	})
}

func TestProcessPause(t *testing.T) {
	r := StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Ping(t.Context()).Err())

	r.Pause(t)
	r.Pause(t) // a second Pause is harmless
	err := rdb.Ping(t.Context()).Err()
	var netErr net.Error
	require.ErrorAs(t, err, &netErr, "a paused server must not answer")
	assert.True(t, netErr.Timeout(), "a paused server keeps the connection open: %v", err)

	r.Resume(t)
	r.Resume(t) // a second Resume is harmless
	require.NoError(t, rdb.Ping(t.Context()).Err())

	t.Run("paused in a test that ends", func(t *testing.T) { r.Pause(t) })
	require.NoError(t, rdb.Ping(t.Context()).Err(), "the end of the test that paused it did not resume it")

	r.Pause(t)
	r.Kill() // a paused process can be killed
	assert.True(t, r.Exited())
}
