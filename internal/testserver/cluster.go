package testserver

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of three masters, without replicas (StartCluster) or with one
// replica each (StartClusterWithReplicas), every node a child process of the test.
//
// A shard is one master's third of the 16384 slots, with its replica. Shards are numbered
// 0, 1, 2 in slot order; a failover swaps the roles within a shard, and Master and Replica
// tell who holds which role now.
type Cluster struct {
	// Nodes are every node: the masters as started, in slot order, then (with replicas) the
	// replica of Nodes[0], Nodes[1], Nodes[2] as started.
	Nodes []*Redis
	// Addrs are the host:port of the masters as started, in slot order: seed addresses for a
	// ClusterClient (which finds the rest itself).
	Addrs []string

	shards []shard
}

// shard is one master's part of the slots and the nodes that serve it.
type shard struct {
	slot  int       // the first slot of the shard
	nodes [2]*Redis // the master and the replica as started; nodes[1] is nil without replicas
}

// clusterNodeTimeout is the cluster-node-timeout of StartCluster: long, so that a slow test
// machine never sees a node fail. clusterReplicasNodeTimeout is that of
// StartClusterWithReplicas: short, so that a killed master is replaced about two seconds later.
const (
	clusterNodeTimeout         = "5000"
	clusterReplicasNodeTimeout = "1000"
)

// StartCluster starts three cluster-enabled redis-servers, joins them into one cluster that
// splits the 16384 slots between them, and waits until every node reports cluster_state:ok
// and sees all slots covered. The nodes are killed when the test ends.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	return startCluster(tb, 0)
}

// StartClusterWithReplicas starts six cluster-enabled redis-servers with a
// cluster-node-timeout of 1000 ms and joins them into three masters with one replica each
// (redis-cli --cluster create --cluster-replicas 1). It waits until every node reports
// cluster_state:ok and sees all slots covered, and every replica's replication link to its
// master is up. The nodes are killed when the test ends.
func StartClusterWithReplicas(tb testing.TB) *Cluster {
	tb.Helper()
	return startCluster(tb, 1)
}

func startCluster(tb testing.TB, replicas int) *Cluster {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatalf("testserver: redis-cli not found (%v); %s", err, redisHint)
	}
	timeout := clusterNodeTimeout
	if replicas > 0 {
		timeout = clusterReplicasNodeTimeout
	}
	var nodes []*Redis
	var addrs []string
	for range 3 * (1 + replicas) {
		n := StartRedis(tb, WithArgs(
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", // relative to --dir, so one per node
			"--cluster-node-timeout", timeout,
		))
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("testserver: redis-cli --cluster create %v: %v\n%s", addrs, err, out)
	}
	c, err := clusterOf(ctx, nodes)
	if err != nil {
		tb.Fatalf("testserver: cluster %v: %v\nredis-cli said:\n%s", addrs, err, out)
	}
	if err := c.waitTopology(ctx, c.startTopology()); err != nil {
		tb.Fatalf("testserver: cluster %v not ready after %v: %v\nredis-cli said:\n%s",
			addrs, readyTimeout, err, out)
	}
	return c
}

// clusterOf reads who is whose replica and which slots each master serves from the nodes
// themselves (each node's own line of CLUSTER NODES), and orders the nodes by it.
func clusterOf(ctx context.Context, nodes []*Redis) (*Cluster, error) {
	type self struct {
		node   *Redis
		id     string
		master string // the master's ID, for a replica
		slot   int    // the first slot, for a master
	}
	byID := map[string]*self{}
	var all []*self
	for _, n := range nodes {
		var s *self
		err := poll(ctx, 20*time.Millisecond, func() error {
			var err error
			s = &self{node: n}
			s.id, s.master, s.slot, err = myselfLine(ctx, n.Addr)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Addr, err)
		}
		byID[s.id] = s
		all = append(all, s)
	}
	c := &Cluster{}
	for _, s := range all {
		if s.master == "" {
			c.shards = append(c.shards, shard{slot: s.slot, nodes: [2]*Redis{s.node}})
		}
	}
	sort.Slice(c.shards, func(i, j int) bool { return c.shards[i].slot < c.shards[j].slot })
	for _, s := range all {
		if s.master == "" {
			continue
		}
		m, ok := byID[s.master]
		if !ok {
			return nil, fmt.Errorf("%s replicates unknown node %s", s.node.Addr, s.master)
		}
		for i := range c.shards {
			if c.shards[i].nodes[0] == m.node {
				c.shards[i].nodes[1] = s.node
			}
		}
	}
	for _, sh := range c.shards {
		c.Nodes = append(c.Nodes, sh.nodes[0])
		c.Addrs = append(c.Addrs, sh.nodes[0].Addr)
	}
	for _, sh := range c.shards {
		if sh.nodes[1] != nil {
			c.Nodes = append(c.Nodes, sh.nodes[1])
		}
	}
	if len(c.Nodes) != len(nodes) {
		return nil, fmt.Errorf("%d masters and %d nodes in all: not every replica has a master", len(c.shards), len(nodes))
	}
	return c, nil
}

// myselfLine returns what a node says of itself in CLUSTER NODES: its ID, its master's ID
// when it is a replica, and the first slot it serves when it is a master.
func myselfLine(ctx context.Context, addr string) (id, master string, slot int, err error) {
	rdb := newNodeClient(addr)
	defer rdb.Close()
	raw, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return "", "", 0, err
	}
	for line := range strings.Lines(raw) {
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot> <slot> ...
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		switch {
		case strings.Contains(f[2], "slave"):
			return f[0], f[3], 0, nil
		case len(f) > 8:
			first, _, _ := strings.Cut(f[8], "-")
			slot, err := strconv.Atoi(first)
			return f[0], "", slot, err
		default:
			return "", "", 0, errors.New("a master without slots")
		}
	}
	return "", "", 0, errors.New("no myself line in CLUSTER NODES")
}

// Kill stops every node at once (SIGKILL).
func (c *Cluster) Kill() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}

// Master returns the node that serves shard i's slots now, as every live node agrees
// (waiting for that agreement when a change is still spreading).
func (c *Cluster) Master(tb testing.TB, i int) *Redis {
	tb.Helper()
	sh := c.shard(tb, i)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var m *Redis
	err := poll(ctx, 20*time.Millisecond, func() error {
		var err error
		m, err = c.owner(ctx, sh)
		return err
	})
	if err != nil {
		tb.Fatalf("testserver: cluster: master of shard %d: %v", i, err)
	}
	return m
}

// Replica returns the other node of shard i: the one that is not its Master now. After
// KillMaster that is the dead former master, until a Restart brings it back as a replica.
// It fails the test on a cluster without replicas.
func (c *Cluster) Replica(tb testing.TB, i int) *Redis {
	tb.Helper()
	sh := c.shard(tb, i)
	if sh.nodes[1] == nil {
		tb.Fatalf("testserver: cluster: shard %d has no replica; use StartClusterWithReplicas", i)
	}
	if c.Master(tb, i) == sh.nodes[0] {
		return sh.nodes[1]
	}
	return sh.nodes[0]
}

// Failover makes the replica of shard i its master with CLUSTER FAILOVER (sent to the
// replica: a manual failover, coordinated with the live master, that loses no acknowledged
// write), and waits until every live node reports cluster_state:ok with the replica serving
// the shard's slots and the former master attached to it as its replica. It returns the new
// master.
func (c *Cluster) Failover(tb testing.TB, i int) *Redis {
	tb.Helper()
	replica := c.Replica(tb, i)
	oldMaster := c.Master(tb, i)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	rdb := newNodeClient(replica.Addr)
	defer rdb.Close()
	// A manual failover that does not complete within 5 s (CLUSTER_MF_TIMEOUT) is abandoned
	// without a word: ask again after that.
	var sent time.Time
	err := poll(ctx, 20*time.Millisecond, func() error {
		if time.Since(sent) > 6*time.Second {
			if err := rdb.ClusterFailover(ctx).Err(); err != nil {
				return fmt.Errorf("CLUSTER FAILOVER on %s: %w", replica.Addr, err)
			}
			sent = time.Now()
		}
		return isRole(ctx, rdb, "master")
	})
	if err != nil {
		tb.Fatalf("testserver: cluster: failover of shard %d to %s: %v", i, replica.Addr, err)
	}
	want := c.currentTopology(tb, i, replica, oldMaster)
	if err := c.waitTopology(ctx, want); err != nil {
		tb.Fatalf("testserver: cluster: after the failover of shard %d to %s: %v", i, replica.Addr, err)
	}
	return replica
}

// KillMaster kills the master of shard i (SIGKILL, as a crash), and waits until its replica
// has taken over — after cluster-node-timeout (1000 ms) the masters flag it failed, the
// replica wins an election — and every live node reports cluster_state:ok with the replica
// serving the shard's slots. It returns the new master; the dead one is Replica(tb, i), and
// Restart brings it back as a replica of the new master. Writes the dead master acknowledged
// but had not yet sent to its replica are lost: replication is asynchronous.
//
// A go-redis ClusterClient keeps sending the shard's commands to the dead address until its
// next state reload (ClusterStateReloadInterval, default 60 s; no MOVED reply comes from a
// dead node); ReloadState forces one.
func (c *Cluster) KillMaster(tb testing.TB, i int) *Redis {
	tb.Helper()
	oldMaster, replica := c.Master(tb, i), c.Replica(tb, i)
	oldMaster.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	want := c.currentTopology(tb, i, replica, nil)
	if err := c.waitTopology(ctx, want); err != nil {
		tb.Fatalf("testserver: cluster: after killing the master %s of shard %d: %v", oldMaster.Addr, i, err)
	}
	return replica
}

func (c *Cluster) shard(tb testing.TB, i int) shard {
	tb.Helper()
	if i < 0 || i >= len(c.shards) {
		tb.Fatalf("testserver: cluster: no shard %d (there are %d)", i, len(c.shards))
	}
	return c.shards[i]
}

// topology is who should serve each shard: the master, and the replica expected to be
// attached to it (nil for none).
type topology []struct{ master, replica *Redis }

// startTopology is the topology as started.
func (c *Cluster) startTopology() topology {
	t := make(topology, len(c.shards))
	for i, sh := range c.shards {
		t[i].master, t[i].replica = sh.nodes[0], sh.nodes[1]
	}
	return t
}

// currentTopology is the current topology with shard i changed to master and replica.
func (c *Cluster) currentTopology(tb testing.TB, i int, master, replica *Redis) topology {
	tb.Helper()
	t := make(topology, len(c.shards))
	for j, sh := range c.shards {
		if j == i {
			t[j].master, t[j].replica = master, replica
			continue
		}
		t[j].master = c.Master(tb, j)
		if other := sh.nodes[1]; other != nil {
			if other == t[j].master {
				other = sh.nodes[0]
			}
			if !other.Exited() {
				t[j].replica = other
			}
		}
	}
	return t
}

// owner returns the node that every live node says serves sh's first slot.
func (c *Cluster) owner(ctx context.Context, sh shard) (*Redis, error) {
	var owner string
	for _, n := range c.live() {
		rdb := newNodeClient(n.Addr)
		slots, err := rdb.ClusterSlots(ctx).Result()
		_ = rdb.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: CLUSTER SLOTS: %w", n.Addr, err)
		}
		got := ""
		for _, s := range slots {
			if s.Start <= sh.slot && sh.slot <= s.End && len(s.Nodes) > 0 {
				got = s.Nodes[0].Addr
			}
		}
		if owner != "" && got != owner {
			return nil, fmt.Errorf("nodes disagree on the owner of slot %d: %s and %s", sh.slot, owner, got)
		}
		owner = got
	}
	for _, n := range sh.nodes {
		if n != nil && n.Addr == owner {
			return n, nil
		}
	}
	return nil, fmt.Errorf("slot %d is served by %q, not by a node of its shard", sh.slot, owner)
}

// live returns the nodes that run and are not paused: those that can answer.
func (c *Cluster) live() []*Redis {
	var live []*Redis
	for _, n := range c.Nodes {
		if !n.Exited() && !n.isPaused() {
			live = append(live, n)
		}
	}
	return live
}

// waitTopology polls until the cluster is in topology want (clusterReady), and returns the
// last reason it was not when ctx ends.
func (c *Cluster) waitTopology(ctx context.Context, want topology) error {
	clients := map[*Redis]*redis.Client{}
	for _, n := range c.Nodes {
		clients[n] = newNodeClient(n.Addr)
		defer clients[n].Close()
	}
	return poll(ctx, 20*time.Millisecond, func() error {
		return c.ready(ctx, clients, want)
	})
}

// ready reports why the cluster is not in topology want yet, or nil: every live node must
// report cluster_state:ok, see all 16384 slots covered, each shard's slots served by its
// master with its replica (if any) listed; every master must report role:master and every
// replica role:slave with its link to its master up.
func (c *Cluster) ready(ctx context.Context, clients map[*Redis]*redis.Client, want topology) error {
	for _, n := range c.live() {
		rdb := clients[n]
		info, err := rdb.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", n.Addr)
		}
		slots, err := rdb.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SLOTS: %w", n.Addr, err)
		}
		covered := 0
		for _, s := range slots {
			covered += s.End - s.Start + 1
		}
		if covered != 16384 {
			return fmt.Errorf("%s: CLUSTER SLOTS covers %d of 16384 slots", n.Addr, covered)
		}
		for i, sh := range c.shards {
			if err := servedBy(slots, sh.slot, want[i].master, want[i].replica); err != nil {
				return fmt.Errorf("%s: %w", n.Addr, err)
			}
		}
	}
	for _, w := range want {
		if err := isRole(ctx, clients[w.master], "master"); err != nil {
			return fmt.Errorf("%s: %w", w.master.Addr, err)
		}
		if w.replica == nil {
			continue
		}
		if err := isReplicaOf(ctx, clients[w.replica], w.master); err != nil {
			return fmt.Errorf("%s: %w", w.replica.Addr, err)
		}
	}
	return nil
}

// servedBy reports whether CLUSTER SLOTS says that master serves slot, with replica (when
// not nil) among its replicas.
func servedBy(slots []redis.ClusterSlot, slot int, master, replica *Redis) error {
	for _, s := range slots {
		if slot < s.Start || slot > s.End || len(s.Nodes) == 0 {
			continue
		}
		if s.Nodes[0].Addr != master.Addr {
			return fmt.Errorf("slot %d is served by %s, want %s", slot, s.Nodes[0].Addr, master.Addr)
		}
		if replica == nil {
			return nil
		}
		for _, r := range s.Nodes[1:] {
			if r.Addr == replica.Addr {
				return nil
			}
		}
		return fmt.Errorf("slot %d: replica %s not listed", slot, replica.Addr)
	}
	return fmt.Errorf("slot %d is not served", slot)
}

// isRole reports whether the server of rdb says it has role (INFO replication: "master" or
// "slave").
func isRole(ctx context.Context, rdb *redis.Client, role string) error {
	f, err := info(ctx, rdb, "replication")
	if err != nil {
		return err
	}
	if f["role"] != role {
		return fmt.Errorf("role is %q, want %q", f["role"], role)
	}
	return nil
}

// isReplicaOf reports whether the server of rdb replicates master with its link up.
func isReplicaOf(ctx context.Context, rdb *redis.Client, master *Redis) error {
	f, err := info(ctx, rdb, "replication")
	if err != nil {
		return err
	}
	if f["role"] != "slave" {
		return fmt.Errorf("role is %q, want slave", f["role"])
	}
	if got := f["master_port"]; got != strconv.Itoa(master.Port()) {
		return fmt.Errorf("replicates port %s, want %s", got, master.Addr)
	}
	if f["master_link_status"] != "up" {
		return fmt.Errorf("link to master %s is %s", master.Addr, f["master_link_status"])
	}
	return nil
}
