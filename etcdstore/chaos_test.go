package etcdstore

import (
	"flag"
	"testing"
	"time"

	"github.com/guardlock/guard/internal/chaos"
	"github.com/guardlock/guard/internal/testserver"
)

var (
	chaosSeed     = flag.Uint64("chaos.seed", 0, "seed of the chaos run (0: random); printed by every run to replay it")
	chaosDuration = flag.Duration("chaos.duration", 20*time.Second, "how long faults are injected")
)

// TestChaos runs internal/chaos on a three-member etcd cluster: four worker processes (this
// test binary again) contend for two names through every member, while the coordinator kills
// the leader and restarts it, pauses it (for less than a lease), cuts it off from its peers,
// and partitions, slows, resets and refuses the clients' way to one member; then it checks the history — no overlapping
// validity windows, a linearizable lock history, no stale write accepted by the fenced
// resource, no context that outlived its lease. Replay with -chaos.seed=N.
func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())>>1 | 1
	}
	t.Logf("chaos seed %d (replay: -chaos.seed=%d)", seed, seed)
	c := testserver.StartEtcdCluster(t, 3)
	first := c.Members[0]
	var isolated *testserver.EtcdMember // by the coordinator's goroutine only
	target := &chaos.Target{
		Backend: "etcd",
		Conn:    chaos.Conn{Kind: "etcd", Addrs: c.Endpoints()},
		Names:   []string{"chaos-a", "chaos-b"},
		Proxy:   first.Client,
		Pause:   func(tb testing.TB) { c.Leader(tb).Pause(tb) },
		Resume: func(tb testing.TB) {
			for _, m := range c.Members {
				m.Resume(tb)
			}
		},
		Crash: func(tb testing.TB) { c.Leader(tb).Restart(tb) },
		Isolate: func(tb testing.TB) {
			isolated = c.Leader(tb)
			isolated.Isolate(tb)
		},
		Rejoin: func(testing.TB) { isolated.Rejoin() },
	}
	r := chaos.Run(t, target, chaos.Options{Seed: seed, Duration: *chaosDuration, Workers: 4})
	t.Log(r.Summary())
	t.Log(r.Details())
	if r.Failed() {
		t.Errorf("chaos run on etcd failed (replay with -chaos.seed=%d): %v %v", seed, r.Violations, r.Problems)
	}
}
