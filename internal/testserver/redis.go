package testserver

import (
	"bufio"
	"context"
	"net"
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

// RedisOption configures a redis-server that StartRedis starts.
type RedisOption func(*redisConfig)

// redisConfig is what RedisOptions set.
type redisConfig struct {
	persistent bool
	extra      []string // more command-line arguments, after the defaults
}

// WithPersistence makes the server log every write to an append-only file that it fsyncs
// before it replies (--appendonly yes --appendfsync always), so that a server killed and
// restarted (Restart) still has every write it acknowledged. Default: no persistence at all
// (no AOF, no RDB snapshots), so a restarted server starts empty.
func WithPersistence() RedisOption {
	return func(c *redisConfig) { c.persistent = true }
}

// WithArgs appends command-line arguments to the defaults, such as a maxmemory-policy.
func WithArgs(args ...string) RedisOption {
	return func(c *redisConfig) { c.extra = append(c.extra, args...) }
}

// StartRedis starts one redis-server on a free loopback port, in a temporary directory,
// without persistence unless WithPersistence is given, and waits until it answers PING. It is
// killed when the test ends.
func StartRedis(tb testing.TB, opts ...RedisOption) *Redis {
	tb.Helper()
	var c redisConfig
	for _, o := range opts {
		o(&c)
	}
	dir := tb.TempDir()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
	args := append(redisArgs(addr, dir, c.persistent), c.extra...)
	r := &Redis{Process: Start(tb, addr, redisHint, "redis-server", args...), Dir: dir}
	r.waitReady(tb)
	return r
}

// redisArgs are the command-line arguments every redis-server of the tests gets.
func redisArgs(addr, dir string, persistent bool) []string {
	_, port, _ := net.SplitHostPort(addr)
	aof := []string{"--appendonly", "no"}
	if persistent {
		aof = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	return append([]string{
		"--bind", "127.0.0.1",
		"--port", port,
		"--dir", dir,
		"--save", "",
		"--protected-mode", "no",
		"--logfile", "",
		// A master that starts a full resync for a replica would wait 5 s for more replicas
		// to share it.
		"--repl-diskless-sync-delay", "0",
		// A master pings its replicas this often (default 10 s), which moves the replication
		// offset; a cluster lists a replica in CLUSTER SLOTS only once its offset is not 0.
		"--repl-ping-replica-period", "1",
	}, aof...)
}

// Restart starts the server again on the same port, in the same directory and with the same
// arguments, and waits until it answers PING (it has loaded its data). A server that still
// runs is killed first (SIGKILL). It comes back with what it persisted: everything it
// acknowledged under WithPersistence, nothing otherwise. A cluster node also keeps its
// nodes.conf, so it rejoins its cluster.
func (r *Redis) Restart(tb testing.TB) {
	tb.Helper()
	r.Process.Restart(tb)
	r.waitReady(tb)
}

// waitReady polls the server until it answers PING: a server that is still loading its data
// answers LOADING.
func (r *Redis) waitReady(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	rdb := newNodeClient(r.Addr)
	defer rdb.Close()
	err := poll(ctx, 10*time.Millisecond, func() error {
		if r.Exited() {
			return errExited
		}
		return rdb.Ping(ctx).Err()
	})
	if err != nil {
		tb.Fatalf("testserver: redis-server on %s does not answer PING: %v\n%s", r.Addr, err, r.Output())
	}
}

// newNodeClient returns a client of one server for the helpers' own checks: RESP2, no
// retries, one connection, short timeouts so that a paused or dead server fails a check
// instead of hanging it.
func newNodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Protocol: 2, MaxRetries: -1, PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
}

// RedisInfo returns the fields that INFO section reports on the redis-server at addr, for
// tests that check server-side counters (such as commandstats) or replication state: section
// "replication" gives role (master or slave), connected_slaves, master_link_status (up or
// down, on a replica), master_repl_offset and slave_repl_offset, among others.
func RedisInfo(ctx context.Context, addr, section string) (map[string]string, error) {
	rdb := newNodeClient(addr)
	defer rdb.Close()
	return info(ctx, rdb, section)
}

// info returns the fields of an INFO section from rdb.
func info(ctx context.Context, rdb *redis.Client, section string) (map[string]string, error) {
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
