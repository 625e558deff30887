package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/redisstore"
)

// The Start functions below deploy one backend each for a chaos run, with a FaultProxy in
// front of it; they stop what they started when the test ends. A new backend
// adds a Conn kind in open (worker.go) and a Start function here.

// redisRequests recognise the requests of redisstore: every lock operation is one script,
// sent as EVALSHA (or EVAL after a NOSCRIPT answer).
var redisRequests = []func([]byte) bool{testserver.MatchCommand("evalsha"), testserver.MatchCommand("eval")}

// StartRedis deploys one redis-server with persistence (an append-only file fsynced before
// every reply), so that a crash keeps every lock it acknowledged; a crash that loses the data
// is simulated by deleting the file before the restart.
func StartRedis(t *testing.T) *Target {
	t.Helper()
	srv := testserver.StartRedis(t, testserver.WithPersistence())
	proxy := testserver.StartFaultProxy(t, srv.Addr)
	names := []string{"chaos-a", "chaos-b", "chaos-c", "chaos-d"}
	return &Target{
		Backend:  "redis",
		Conn:     Conn{Kind: "redis", Addrs: []string{proxy.Addr}},
		Names:    names,
		Proxy:    proxy,
		Requests: redisRequests,
		Pause:    srv.Pause,
		Resume:   srv.Resume,
		Crash:    srv.Restart,
		CrashLosingData: func(tb testing.TB) []string {
			tb.Helper()
			srv.Kill()
			if err := os.RemoveAll(filepath.Join(srv.Dir, "appendonlydir")); err != nil {
				tb.Fatalf("chaos: remove the append-only file: %v", err)
			}
			srv.Restart(tb)
			return names
		},
	}
}

// StartRedisCluster deploys a three-master Redis Cluster (no replicas, no persistence) and
// routes the workers' connections to its first master through the FaultProxy: every fault
// hits that node only. Two of the three lock names live on it, the third on another node,
// which sees only the worker faults. A crash of the node loses its data.
func StartRedisCluster(t *testing.T) *Target {
	t.Helper()
	c := testserver.StartCluster(t)
	victim := c.Nodes[0]
	proxy := testserver.StartFaultProxy(t, victim.Addr)
	names := clusterNames(t, c.Addrs, victim.Addr)
	return &Target{
		Backend:  "redis-cluster",
		Conn:     Conn{Kind: "cluster", Addrs: c.Addrs, Route: map[string]string{victim.Addr: proxy.Addr}},
		Names:    names,
		Proxy:    proxy,
		Requests: redisRequests,
		Pause:    victim.Pause,
		Resume:   victim.Resume,
		CrashLosingData: func(tb testing.TB) []string {
			tb.Helper()
			victim.Restart(tb)
			waitClusterOK(tb, c)
			return names[:2]
		},
	}
}

// clusterNames returns two lock names whose keys live on the node at victim, then one that
// lives on another node.
func clusterNames(tb testing.TB, seeds []string, victim string) []string {
	tb.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var on, off []string
	for i := 0; len(on) < 2 || len(off) < 2; i++ {
		name := fmt.Sprintf("chaos-%d", i)
		node, err := client.MasterForKey(ctx, redisstore.DefaultPrefix+"{"+name+"}")
		if err != nil {
			tb.Fatalf("chaos: the master of %q: %v", name, err)
		}
		if node.Options().Addr == victim {
			on = append(on, name)
		} else {
			off = append(off, name)
		}
	}
	return append(on[:2], off[:2]...)
}

// waitClusterOK waits until every node of c reports cluster_state:ok again after a restart.
func waitClusterOK(tb testing.TB, c *testserver.Cluster) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.Nodes {
		client := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := client.ClusterInfo(ctx).Result()
			cancel()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = client.Close()
				tb.Fatalf("chaos: cluster node %s not ok 20 s after a restart: %v %q", n.Addr, err, info)
			}
			time.Sleep(20 * time.Millisecond) // polling the node, not synchronising
		}
		_ = client.Close()
	}
}

// StartMongo deploys FerretDB behind its WireProxy (which gives it MongoDB's single-document
// atomicity) and the FaultProxy in front of that. FerretDB keeps its data in SQLite files, so
// a crash keeps it.
func StartMongo(t *testing.T) *Target {
	t.Helper()
	m := testserver.StartFerretDB(t)
	proxy := testserver.StartFaultProxy(t, m.Proxy.Addr)
	srv := m.Server()
	return &Target{
		Backend: "mongodb",
		Conn: Conn{
			Kind: "mongo", URI: "mongodb://" + proxy.Addr + "/?directConnection=true", Database: m.Database,
		},
		Names: []string{"chaos-a", "chaos-b", "chaos-c", "chaos-d"},
		Proxy: proxy,
		Requests: []func([]byte) bool{
			testserver.MatchMongoCommand("findAndModify"), // acquire
			testserver.MatchMongoCommand("update"),        // extend, release
		},
		Pause:  srv.Pause,
		Resume: srv.Resume,
		Crash:  srv.Restart,
	}
}

// StartPostgres deploys one PostgreSQL server (fsync off: a killed server keeps what it
// wrote, as the operating system still has it) with the lock table created, and the
// FaultProxy in front of it. The workers' LISTEN connection goes through the proxy too.
func StartPostgres(t *testing.T) *Target {
	t.Helper()
	srv := testserver.StartPostgresServer(t)
	target := sqlTarget(t, "postgres", "postgres", srv.DSN, srv.Addr, testserver.MatchPostgresQuery())
	target.Pause = func(testing.TB) { srv.Pause() }
	target.Resume = func(testing.TB) { srv.Resume() }
	target.Crash = func(testing.TB) { srv.Restart() }
	return target
}

// StartMariaDB deploys one MariaDB server (every commit flushed to its redo log) with the
// lock table created, and the FaultProxy in front of it.
func StartMariaDB(t *testing.T) *Target {
	t.Helper()
	srv := testserver.StartMariaDB(t)
	target := sqlTarget(t, "mariadb", "mysql", srv.DSN, srv.Addr, testserver.MatchMySQLQuery())
	target.Pause, target.Resume, target.Crash = srv.Pause, srv.Resume, srv.Restart
	return target
}

// sqlTarget creates the lock table of the SQL backend kind on the server at addr, which dsn
// reaches, as a deployment's migration would before any instance starts; then it puts a
// FaultProxy in front of the server and returns a Target whose workers dial dsn through it.
// match recognises the statements whose replies may be lost or delayed.
func sqlTarget(tb testing.TB, backend, kind, dsn, addr string, match func([]byte) bool) *Target {
	tb.Helper()
	b, closeClient, err := openStore(Conn{Kind: kind, URI: dsn})
	if err != nil {
		tb.Fatalf("chaos: %v", err)
	}
	defer closeClient()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.(interface{ CreateTable(context.Context) error }).CreateTable(ctx); err != nil {
		tb.Fatalf("chaos: create the lock table: %v", err)
	}
	proxy := testserver.StartFaultProxy(tb, addr)
	return &Target{
		Backend:  backend,
		Conn:     Conn{Kind: kind, URI: strings.Replace(dsn, addr, proxy.Addr, 1)},
		Names:    []string{"chaos-a", "chaos-b", "chaos-c", "chaos-d"},
		Proxy:    proxy,
		Requests: []func([]byte) bool{match},
	}
}
