package redisstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/locktest"
)

// TestConformance runs the backend conformance suite on a single node, a three-master Cluster
// and a Sentinel-managed master. Round trips are counted by the roundTrips hook: one per command or pipeline on a
// single node, one per node a pipeline reaches on a Cluster.
func TestConformance(t *testing.T) {
	for _, dep := range deployments[:3] { // Single, Cluster, Sentinel
		t.Run(dep.name, func(t *testing.T) {
			locktest.Run(t, dep.start(t).harness(t))
		})
	}
}

// BenchmarkConformance runs the backend benchmarks of the suite on a single node and on a
// Cluster.
func BenchmarkConformance(b *testing.B) {
	for _, dep := range deployments[:2] {
		b.Run(dep.name, func(b *testing.B) {
			locktest.Bench(b, dep.start(b).harness(b))
		})
	}
}

// harness returns the conformance harness for d. Every backend it makes has a client of its
// own; the suite's Delete and Overwrite go behind their backs through an admin client.
func (d *deployment) harness(tb testing.TB) locktest.Harness {
	adm := d.admin(tb)
	keys := New(adm)
	// Load the scripts once, so that the first call of each test is not a NOSCRIPT retry.
	for _, sc := range scripts {
		require.NoError(tb, sc.Load(context.Background(), adm).Err())
	}
	return locktest.Harness{
		New: func(tb testing.TB) locktest.Target {
			s, rt := d.counted(tb)
			return locktest.Target{Backend: s, RoundTrips: rt.Load}
		},
		Delete: func(tb testing.TB, name string) {
			n, err := adm.Del(context.Background(), keys.lockKey(name)).Result()
			require.NoError(tb, err)
			require.Equal(tb, int64(1), n, "no lock %q to delete", name)
		},
		Overwrite: func(tb testing.TB, name string) {
			n, err := adm.Exists(context.Background(), keys.lockKey(name)).Result()
			require.NoError(tb, err)
			require.Equal(tb, int64(1), n, "no lock %q to overwrite", name)
			// The intruder keeps the holder's lease.
			require.NoError(tb, adm.HSet(context.Background(), keys.lockKey(name), "token", "intruder").Err())
		},
		Wipe: func(tb testing.TB) {
			d.eachMaster(tb, func(c *redis.Client) error { return c.FlushAll(context.Background()).Err() })
		},
		Killable: func(tb testing.TB) (locktest.Target, func()) {
			r := testserver.StartRedis(tb)
			c := closeLater(tb, redis.NewClient(&redis.Options{Addr: r.Addr}))
			return locktest.Target{Backend: New(c), RoundTrips: testserver.CountRoundTrips(c).Load}, r.Kill
		},
	}
}
