package testserver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisHint tells how to get redis-server and redis-cli when they are missing.
const redisHint = "install it with: apt-get install -y redis-server"

// readyTimeout bounds how long a cluster or sentinel (or another server with a slow start)
// may take to become usable.
const readyTimeout = 30 * time.Second

// Redis is a redis-server running as a child process of the test.
type Redis struct {
	*Process // Addr, Kill, Output, Port

	// Dir is the server's working directory (a temporary directory of the test).
	Dir string
}

// StartRedis starts one redis-server on a free loopback port, without persistence, in a
// temporary directory. It is killed when the test ends.
func StartRedis(tb testing.TB) *Redis {
	tb.Helper()
	return startRedis(tb)
}

// startRedis starts one redis-server with extra arguments appended to the defaults.
func startRedis(tb testing.TB, extra ...string) *Redis {
	tb.Helper()
	dir := tb.TempDir()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
	args := append(redisArgs(addr, dir), extra...)
	return &Redis{Process: Start(tb, addr, redisHint, "redis-server", args...), Dir: dir}
}

// redisArgs are the command-line arguments every redis-server of the tests gets.
func redisArgs(addr, dir string) []string {
	_, port, _ := net.SplitHostPort(addr)
	return []string{
		"--bind", "127.0.0.1",
		"--port", port,
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "no",
		"--logfile", "",
	}
}

// Cluster is a Redis Cluster of three masters and no replicas, each a child process of the
// test.
type Cluster struct {
	Nodes []*Redis
	Addrs []string // the masters' host:port, in start order
}

// StartCluster starts three cluster-enabled redis-servers, joins them into one cluster that
// splits the 16384 slots between them, and waits until every node reports cluster_state:ok
// and sees all slots covered. The nodes are killed when the test ends.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatalf("testserver: redis-cli not found (%v); %s", err, redisHint)
	}
	c := &Cluster{}
	for range 3 {
		n := startRedis(tb,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", // relative to --dir, so one per node
			"--cluster-node-timeout", "5000",
		)
		c.Nodes = append(c.Nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("testserver: redis-cli --cluster create %v: %v\n%s", c.Addrs, err, out)
	}
	if err := c.waitReady(ctx); err != nil {
		tb.Fatalf("testserver: cluster %v not ready after %v: %v\nredis-cli said:\n%s",
			c.Addrs, readyTimeout, err, out)
	}
	return c
}

// Kill stops every node at once (SIGKILL).
func (c *Cluster) Kill() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}

// waitReady polls every node until each one reports cluster_state:ok and its CLUSTER SLOTS
// covers all 16384 slots; it returns the last reason for not being ready when ctx ends.
func (c *Cluster) waitReady(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.Addrs))
	for i, addr := range c.Addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1})
		defer clients[i].Close()
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := clusterReady(ctx, clients)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// clusterReady reports why the cluster is not usable yet from every node's point of view,
// or nil.
func clusterReady(ctx context.Context, clients []*redis.Client) error {
	for _, rdb := range clients {
		addr := rdb.Options().Addr
		info, err := rdb.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", addr)
		}
		slots, err := rdb.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SLOTS: %w", addr, err)
		}
		covered := 0
		for _, s := range slots {
			covered += int(s.End-s.Start) + 1
		}
		if covered != 16384 {
			return fmt.Errorf("%s: CLUSTER SLOTS covers %d of 16384 slots", addr, covered)
		}
	}
	return nil
}

// SentinelMaster is the master name the Sentinel of StartSentinel monitors.
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
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	master := StartRedis(tb)
	dir := tb.TempDir()
	port := FreePort(tb)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	// A sentinel needs a config file it can rewrite.
	conf := filepath.Join(dir, "sentinel.conf")
	var b strings.Builder
	fmt.Fprintf(&b, "bind 127.0.0.1\nport %d\ndir %s\nprotected-mode no\n", port, dir)
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d 1\n", SentinelMaster, master.Port())
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s 5000\n", SentinelMaster)
	fmt.Fprintf(&b, "sentinel failover-timeout %s 10000\n", SentinelMaster)
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		tb.Fatalf("testserver: write %s: %v", conf, err)
	}
	s := &Sentinel{
		Master:     master,
		Sentinel:   Start(tb, addr, redisHint, "redis-server", conf, "--sentinel"),
		MasterName: SentinelMaster,
		Addr:       addr,
	}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := s.waitReady(ctx); err != nil {
		tb.Fatalf("testserver: sentinel on %s not ready after %v: %v\n%s",
			addr, readyTimeout, err, s.Sentinel.Output())
	}
	return s
}

// waitReady polls the sentinel until it names the master's address.
func (s *Sentinel) waitReady(ctx context.Context) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, Protocol: 2, MaxRetries: -1})
	defer sc.Close()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err == nil && len(got) == 2 && net.JoinHostPort(got[0], got[1]) == s.Master.Addr {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("get-master-addr-by-name %s = %v, want %s", s.MasterName, got, s.Master.Addr)
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// Kill stops the sentinel and the master at once (SIGKILL).
func (s *Sentinel) Kill() {
	s.Sentinel.Kill()
	s.Master.Kill()
}

// RedisInfo returns the fields that INFO section reports on the redis-server at addr, for
// tests that check server-side counters (such as commandstats).
func RedisInfo(ctx context.Context, addr, section string) (map[string]string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: -1})
	defer rdb.Close()
	raw, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	fields := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(raw))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && !strings.HasPrefix(k, "#") {
			fields[k] = v
		}
	}
	return fields, sc.Err()
}
