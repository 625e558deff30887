package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name the sentinels of StartSentinel and StartSentinelGroup
// monitor.
const SentinelMaster = "guardmaster"

// Sentinel is a redis-server master with one Redis Sentinel monitoring it, each a child
// process of the test.
type Sentinel struct {
	Master     *Redis   // the monitored master
	Sentinel   *Process // the sentinel
	MasterName string   // the name the sentinel knows the master by (SentinelMaster)
	Addr       string   // the sentinel's host:port
}

// StartSentinel starts a redis-server master and a redis-server --sentinel that monitors it
// under SentinelMaster with a quorum of 1, and waits until the sentinel answers SENTINEL
// get-master-addr-by-name with the master's address. Both are killed when the test ends.
// It never fails over: there is no replica; StartSentinelGroup has one.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	master := StartRedis(tb)
	proc := startSentinel(tb, master, sentinelConfig{quorum: 1, downAfter: 5000, failoverTimeout: 10000})
	s := &Sentinel{Master: master, Sentinel: proc, MasterName: SentinelMaster, Addr: proc.Addr}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	sc := newSentinelClient(s.Addr)
	defer sc.Close()
	err := poll(ctx, 20*time.Millisecond, func() error { return namesMaster(ctx, sc, master) })
	if err != nil {
		tb.Fatalf("testserver: sentinel on %s not ready after %v: %v\n%s",
			s.Addr, readyTimeout, err, s.Sentinel.Output())
	}
	return s
}

// Kill stops the sentinel and the master at once (SIGKILL).
func (s *Sentinel) Kill() {
	s.Sentinel.Kill()
	s.Master.Kill()
}

// sentinelConfig is what a sentinel's config file sets for the monitored master.
type sentinelConfig struct {
	quorum          int
	downAfter       int // down-after-milliseconds
	failoverTimeout int // failover-timeout, ms
}

// startSentinel starts a redis-server --sentinel, in a temporary directory of its own, that
// monitors master under SentinelMaster.
func startSentinel(tb testing.TB, master *Redis, cfg sentinelConfig) *Process {
	tb.Helper()
	dir := tb.TempDir()
	port := FreePort(tb)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	// A sentinel needs a config file it can rewrite.
	conf := filepath.Join(dir, "sentinel.conf")
	var b strings.Builder
	fmt.Fprintf(&b, "bind 127.0.0.1\nport %d\ndir %s\nprotected-mode no\n", port, dir)
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d %d\n", SentinelMaster, master.Port(), cfg.quorum)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", SentinelMaster, cfg.downAfter)
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", SentinelMaster, cfg.failoverTimeout)
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		tb.Fatalf("testserver: write %s: %v", conf, err)
	}
	return Start(tb, addr, redisHint, "redis-server", conf, "--sentinel")
}

// SentinelGroup is a Redis primary and one replica, watched by three Sentinels with a quorum
// of 2, down-after-milliseconds 1000 and failover-timeout 3000: a deployment that fails over
// on its own about two seconds after its primary dies. Every server is a child process of
// the test.
//
// Replication is asynchronous: a write the primary acknowledged and had not yet sent to the
// replica is lost when the replica is promoted (PauseReplication shows it). A demoted primary
// that still runs keeps serving clients that reach it until a sentinel turns it into a
// replica, up to about ten seconds after the failover.
type SentinelGroup struct {
	// MasterName is the name the sentinels know the primary by (SentinelMaster).
	MasterName string
	// Nodes are the two data nodes: Nodes[0] starts as the primary, Nodes[1] as its replica.
	// Both are started alike (the replica is set up with REPLICAOF), so a node restarted
	// after a crash comes back as a primary with what it persisted, until a sentinel makes
	// it a replica of the current primary.
	Nodes []*Redis
	// Sentinels are the three sentinels; Addrs their host:port, in the same order (for
	// redis.FailoverOptions.SentinelAddrs).
	Sentinels []*Process
	Addrs     []string
}

// StartSentinelGroup starts a primary, a replica of it and three sentinels, and waits until
// the replica's link to the primary is up and every sentinel names the primary, knows the
// replica and knows the other two sentinels. opts configure both data nodes (e.g.
// WithPersistence). Everything is killed when the test ends.
func StartSentinelGroup(tb testing.TB, opts ...RedisOption) *SentinelGroup {
	tb.Helper()
	primary, replica := StartRedis(tb, opts...), StartRedis(tb, opts...)
	g := &SentinelGroup{MasterName: SentinelMaster, Nodes: []*Redis{primary, replica}}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	rdb := newNodeClient(replica.Addr)
	defer rdb.Close()
	if err := rdb.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(primary.Port())).Err(); err != nil {
		tb.Fatalf("testserver: REPLICAOF %s on %s: %v", primary.Addr, replica.Addr, err)
	}
	err := poll(ctx, 20*time.Millisecond, func() error { return isReplicaOf(ctx, rdb, primary) })
	if err != nil {
		tb.Fatalf("testserver: replica %s of %s not attached after %v: %v", replica.Addr, primary.Addr, readyTimeout, err)
	}

	// The sentinels find the replica in the primary's INFO, and each other through the
	// primary's hello channel, every two seconds.
	cfg := sentinelConfig{quorum: 2, downAfter: 1000, failoverTimeout: 3000}
	for range 3 {
		s := startSentinel(tb, primary, cfg)
		g.Sentinels = append(g.Sentinels, s)
		g.Addrs = append(g.Addrs, s.Addr)
	}
	if err := g.waitSentinels(ctx, primary, replica); err != nil {
		tb.Fatalf("testserver: sentinels %v not ready after %v: %v", g.Addrs, readyTimeout, err)
	}
	return g
}

// Kill stops every server of the group at once (SIGKILL).
func (g *SentinelGroup) Kill() {
	for _, s := range g.Sentinels {
		s.Kill()
	}
	for _, n := range g.Nodes {
		n.Kill()
	}
}

// Primary returns the node that the sentinels name as the primary, once all the running
// ones agree (they may not for a moment after a failover).
func (g *SentinelGroup) Primary(tb testing.TB) *Redis {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var p *Redis
	err := poll(ctx, 20*time.Millisecond, func() error {
		var err error
		p, err = g.named(ctx)
		return err
	})
	if err != nil {
		tb.Fatalf("testserver: sentinels %v: %v", g.Addrs, err)
	}
	return p
}

// Replica returns the node that is not the Primary: the replica, or a former primary that
// is dead or not yet turned into a replica.
func (g *SentinelGroup) Replica(tb testing.TB) *Redis {
	tb.Helper()
	if g.Primary(tb) == g.Nodes[0] {
		return g.Nodes[1]
	}
	return g.Nodes[0]
}

// Failover asks a running sentinel for a failover (SENTINEL FAILOVER: no agreement needed, the
// primary keeps running) — retrying while the sentinel has no replica it may promote yet —
// and waits as WaitFailover does. It returns the new primary. The old primary becomes a
// replica later; WaitReplica waits for that.
func (g *SentinelGroup) Failover(tb testing.TB) *Redis {
	tb.Helper()
	old := g.Primary(tb)
	var s *Process
	for _, s = range g.Sentinels {
		if !s.Exited() && !s.isPaused() {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	sc := newSentinelClient(s.Addr)
	defer sc.Close()
	err := poll(ctx, 50*time.Millisecond, func() error { return sc.Failover(ctx, g.MasterName).Err() })
	if err != nil {
		tb.Fatalf("testserver: SENTINEL FAILOVER on %s: %v", s.Addr, err)
	}
	return g.WaitFailover(tb, old)
}

// KillPrimary kills the current primary (SIGKILL, as a crash) and returns it. The sentinels
// notice after down-after-milliseconds and fail over; WaitFailover(tb, old) waits for it.
func (g *SentinelGroup) KillPrimary(tb testing.TB) *Redis {
	tb.Helper()
	p := g.Primary(tb)
	p.Kill()
	return p
}

// WaitFailover waits until every running sentinel names a primary other than old and that
// node reports role:master, and returns it.
func (g *SentinelGroup) WaitFailover(tb testing.TB, old *Redis) *Redis {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var p *Redis
	err := poll(ctx, 20*time.Millisecond, func() error {
		var err error
		if p, err = g.named(ctx); err != nil {
			return err
		}
		if p == old {
			return fmt.Errorf("the sentinels still name %s", old.Addr)
		}
		rdb := newNodeClient(p.Addr)
		defer rdb.Close()
		return isRole(ctx, rdb, "master")
	})
	if err != nil {
		tb.Fatalf("testserver: no failover from %s after %v: %v", old.Addr, readyTimeout, err)
	}
	return p
}

// WaitReplica waits until the node that is not the primary runs as its replica with the
// replication link up and every running sentinel lists it as a replica that is not down, and
// returns it. After a failover that takes about ten seconds: a sentinel waits that long
// before it turns a former primary into a replica. A killed node must be restarted first.
func (g *SentinelGroup) WaitReplica(tb testing.TB) *Redis {
	tb.Helper()
	primary, replica := g.Primary(tb), g.Replica(tb)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := g.waitSentinels(ctx, primary, replica); err != nil {
		tb.Fatalf("testserver: %s is not a replica of %s after %v: %v", replica.Addr, primary.Addr, readyTimeout, err)
	}
	return replica
}

// PauseReplication stops the replica (SIGSTOP) and cuts its link on the primary (CLIENT
// KILL TYPE replica), so that writes from now on reach the primary only: not the replica,
// nor its socket buffers, where a stopped process would still find them once continued. If
// the primary dies now, the sentinels promote a replica without those writes (resume it
// first: a stopped replica cannot be promoted). Keep the pause short: after about ten
// seconds without its primary, a replica is no longer eligible.
func (g *SentinelGroup) PauseReplication(tb testing.TB) {
	tb.Helper()
	primary, replica := g.Primary(tb), g.Replica(tb)
	replica.Pause(tb)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	rdb := newNodeClient(primary.Addr)
	defer rdb.Close()
	err := poll(ctx, 20*time.Millisecond, func() error {
		if err := rdb.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
			return err
		}
		f, err := info(ctx, rdb, "replication")
		if err != nil {
			return err
		}
		if f["connected_slaves"] != "0" {
			return fmt.Errorf("connected_slaves:%s", f["connected_slaves"])
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("testserver: cut the replication link on %s: %v", primary.Addr, err)
	}
}

// ResumeReplication continues the paused replica (SIGCONT). If its primary still runs, it
// reconnects and catches up; if the primary died, it waits to be promoted.
func (g *SentinelGroup) ResumeReplication(tb testing.TB) {
	tb.Helper()
	for _, n := range g.Nodes {
		n.Resume(tb)
	}
}

// named returns the node that every running sentinel names as the primary.
func (g *SentinelGroup) named(ctx context.Context) (*Redis, error) {
	var addr string
	for _, s := range g.Sentinels {
		if s.Exited() || s.isPaused() {
			continue
		}
		sc := newSentinelClient(s.Addr)
		got, err := sc.GetMasterAddrByName(ctx, g.MasterName).Result()
		_ = sc.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: get-master-addr-by-name: %w", s.Addr, err)
		}
		if len(got) != 2 {
			return nil, fmt.Errorf("%s: get-master-addr-by-name = %v", s.Addr, got)
		}
		a := net.JoinHostPort(got[0], got[1])
		if addr != "" && a != addr {
			return nil, fmt.Errorf("sentinels disagree: %s and %s", addr, a)
		}
		addr = a
	}
	for _, n := range g.Nodes {
		if n.Addr == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("the sentinels name %q, not a node of the group", addr)
}

// waitSentinels polls until every running sentinel names primary, lists replica as a
// healthy replica of it, and knows the other running sentinels.
func (g *SentinelGroup) waitSentinels(ctx context.Context, primary, replica *Redis) error {
	rdb := newNodeClient(replica.Addr)
	defer rdb.Close()
	return poll(ctx, 20*time.Millisecond, func() error {
		if err := isReplicaOf(ctx, rdb, primary); err != nil {
			return fmt.Errorf("%s: %w", replica.Addr, err)
		}
		running := 0
		for _, s := range g.Sentinels {
			if !s.Exited() && !s.isPaused() {
				running++
			}
		}
		for _, s := range g.Sentinels {
			if s.Exited() || s.isPaused() {
				continue
			}
			if err := g.sentinelSees(ctx, s.Addr, primary, replica, running-1); err != nil {
				return fmt.Errorf("sentinel %s: %w", s.Addr, err)
			}
		}
		return nil
	})
}

// sentinelSees reports why the sentinel at addr does not name primary, list replica as a
// replica without a down or disconnected flag, and know `others` such other sentinels; or
// nil. (A sentinel refreshes what it knows of a replica's link every ten seconds: the
// replica's own INFO tells that sooner.)
func (g *SentinelGroup) sentinelSees(ctx context.Context, addr string, primary, replica *Redis, others int) error {
	sc := newSentinelClient(addr)
	defer sc.Close()
	if err := namesMaster(ctx, sc, primary); err != nil {
		return err
	}
	replicas, err := sc.Replicas(ctx, g.MasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	found := false
	for _, r := range replicas {
		if net.JoinHostPort(r["ip"], r["port"]) != replica.Addr {
			continue
		}
		if r["flags"] != "slave" {
			return fmt.Errorf("replica %s has flags %q", replica.Addr, r["flags"])
		}
		found = true
	}
	if !found {
		return fmt.Errorf("replica %s not known", replica.Addr)
	}
	sentinels, err := sc.Sentinels(ctx, g.MasterName).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL SENTINELS: %w", err)
	}
	healthy := 0
	for _, s := range sentinels {
		if s["flags"] == "sentinel" {
			healthy++
		}
	}
	if healthy < others {
		return fmt.Errorf("knows %d other sentinels without a down flag, want %d", healthy, others)
	}
	return nil
}

// namesMaster reports whether the sentinel of sc names master's address for SentinelMaster.
func namesMaster(ctx context.Context, sc *redis.SentinelClient, master *Redis) error {
	got, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return fmt.Errorf("get-master-addr-by-name: %w", err)
	}
	if len(got) != 2 || net.JoinHostPort(got[0], got[1]) != master.Addr {
		return fmt.Errorf("get-master-addr-by-name %s = %v, want %s", SentinelMaster, got, master.Addr)
	}
	return nil
}

// newSentinelClient returns a client of one sentinel for the helpers' checks (as
// newNodeClient).
func newSentinelClient(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{
		Addr: addr, Protocol: 2, MaxRetries: -1, PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
}
