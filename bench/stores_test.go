package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// The store comparison of issue 21: what a lock costs on each of guard's stores, through a
// real Guard, each store on a server of its own that the run starts on free ports.

var (
	storesOps = flag.Int("charts.stores.ops", 1000, "uncontended operations per store in TestCharts")
	storesRun = flag.Duration("charts.stores.run", 3*time.Second, "how long each contended case of TestCharts' store comparison runs")
)

// storesTurn is the number of uncontended operations each store runs in its turn.
const storesTurn = 20

// backend is one of guard's stores under comparison.
type backend struct {
	name  string // the store's package, and the sub-benchmark's name
	start func(tb testing.TB) storeServer
}

// storeServer is a store's server, started for one test or benchmark and stopped when it ends.
type storeServer struct {
	server  string // what the store runs on, for the charts: "Redis", "FerretDB", …
	version string // the server, its version and its set-up, for figures.md
	// open opens one instance of a service on the server: a Guard on a Store with a client
	// of its own, closed when tb ends, and the round trips that client has made so far (nil
	// for memstore, which makes none).
	open func(tb testing.TB) (*guard.Guard, func() int64)
}

var backends = []backend{
	{"memstore", startMemstore},
	{"redisstore", startRedisStore},
	{"redisstore-cluster", startClusterStore},
	{"mongostore", startMongoStore},
	{"pgstore", startPgStore},
	{"mysqlstore", startMySQLStore},
	{"etcdstore", startEtcdStore},
}

// newGuard returns a Guard with the default options on b, closed when tb ends.
func newGuard(tb testing.TB, b guard.Backend) *guard.Guard {
	g := guard.New(b)
	tb.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}

func startMemstore(testing.TB) storeServer {
	s := memstore.New() // the instances of one process share it
	return storeServer{server: "in-process", version: "memstore: in the benchmark's process, no server",
		open: func(tb testing.TB) (*guard.Guard, func() int64) { return newGuard(tb, s), nil }}
}

func startRedisStore(tb testing.TB) storeServer {
	srv := testserver.StartRedis(tb)
	return storeServer{server: "Redis", version: "redisstore: redis-server " + redisVersion(tb, srv.Addr),
		open: func(tb testing.TB) (*guard.Guard, func() int64) {
			client, cnt := newClient(tb, srv.Addr)
			return newGuard(tb, redisstore.New(client)), cnt.Load
		}}
}

func startClusterStore(tb testing.TB) storeServer {
	c := testserver.StartCluster(tb)
	return storeServer{server: "Redis Cluster",
		version: "redisstore-cluster: a Redis Cluster of 3 masters without replicas, redis-server " + redisVersion(tb, c.Addrs[0]),
		open: func(tb testing.TB) (*guard.Guard, func() int64) {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
			cnt := testserver.CountRoundTrips(client)
			tb.Cleanup(func() { _ = client.Close() })
			return newGuard(tb, redisstore.New(client)), cnt.Load
		}}
}

func redisVersion(tb testing.TB, addr string) string {
	tb.Helper()
	info, err := testserver.RedisInfo(context.Background(), addr, "server")
	if err != nil {
		tb.Fatal(err)
	}
	return info["redis_version"]
}

// startMongoStore starts FerretDB behind the tests' write-serialising proxy, or uses the
// MongoDB that MONGODB_URI names (a database of its own, dropped at the end).
func startMongoStore(tb testing.TB) storeServer {
	m := testserver.StartMongo(tb)
	connect := func(tb testing.TB, opts *options.ClientOptions) *mongo.Client {
		tb.Helper()
		mc, err := mongo.Connect(opts.ApplyURI(m.URI).SetServerSelectionTimeout(30 * time.Second))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
		return mc
	}
	var info struct {
		Version  string `bson:"version"`
		FerretDB string `bson:"ferretdbVersion"`
	}
	err := connect(tb, options.Client()).Database("admin").RunCommand(context.Background(), bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info)
	if err != nil {
		tb.Fatal(err)
	}
	s := storeServer{server: "MongoDB", version: "mongostore: MongoDB " + info.Version + " (MONGODB_URI)"}
	if info.FerretDB != "" {
		if info.FerretDB == "unknown" { // as tools/ferretdb builds it
			info.FerretDB = requiredVersion(tb, "../tools/ferretdb/go.mod", "github.com/FerretDB/FerretDB")
		}
		s.server = "FerretDB"
		s.version = fmt.Sprintf("mongostore: FerretDB %s (SQLite; it answers as MongoDB %s), behind the tests' proxy "+
			"that lets one write at a time into it (internal/testserver: FerretDB v1's writes are not atomic)", info.FerretDB, info.Version)
	}
	s.open = func(tb testing.TB) (*guard.Guard, func() int64) {
		var cmds atomic.Int64
		mc := connect(tb, options.Client().SetMonitor(&event.CommandMonitor{
			Started: func(context.Context, *event.CommandStartedEvent) { cmds.Add(1) },
		}))
		st := mongostore.New(mc.Database(m.Database).Collection("guard_locks"))
		if err := st.SyncClock(context.Background()); err != nil {
			tb.Fatal(err)
		}
		return newGuard(tb, st), cmds.Load
	}
	return s
}

// requiredVersion returns the version of module that the go.mod file requires.
func requiredVersion(tb testing.TB, file, module string) string {
	tb.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require ")); len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	return "unknown"
}

// startPgStore starts a PostgreSQL server, or uses the one GUARD_POSTGRES_DSN names (a table
// of its own, dropped at the end).
func startPgStore(tb testing.TB) storeServer {
	pg := testserver.StartPostgres(tb)
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(admin.Close)
	table := "guard_bench_" + strings.ToLower(rand.Text()[:10])
	if err := pgstore.New(admin, pgstore.WithTable(table)).CreateTable(ctx); err != nil {
		tb.Fatal(err)
	}
	if pg.External {
		tb.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	}
	var version, fsync string
	if err := admin.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('fsync')").Scan(&version, &fsync); err != nil {
		tb.Fatal(err)
	}
	return storeServer{server: "PostgreSQL", version: fmt.Sprintf("pgstore: PostgreSQL %s, fsync=%s", version, fsync),
		open: func(tb testing.TB) (*guard.Guard, func() int64) {
			cfg, err := pgxpool.ParseConfig(pg.DSN)
			if err != nil {
				tb.Fatal(err)
			}
			rt := &turns{}
			cfg.ConnConfig.DialFunc = rt.dial
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(pool.Close)
			return newGuard(tb, pgstore.New(pool, pgstore.WithTable(table))), rt.Load
		}}
}

// startMySQLStore starts a MariaDB server, or uses the one GUARD_MYSQL_DSN names (a database
// of its own, dropped at the end).
func startMySQLStore(tb testing.TB) storeServer {
	m := testserver.StartMySQL(tb)
	ctx := context.Background()
	admin, err := sql.Open("mysql", m.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = admin.Close() })
	if err := mysqlstore.New(admin).CreateTable(ctx); err != nil {
		tb.Fatal(err)
	}
	var version, flush string
	if err := admin.QueryRowContext(ctx, "SELECT VERSION(), @@innodb_flush_log_at_trx_commit").Scan(&version, &flush); err != nil {
		tb.Fatal(err)
	}
	server := "MySQL"
	if strings.Contains(version, "MariaDB") {
		server = "MariaDB"
	}
	return storeServer{server: server,
		version: fmt.Sprintf("mysqlstore: %s %s, innodb_flush_log_at_trx_commit=%s", server, version, flush),
		open: func(tb testing.TB) (*guard.Guard, func() int64) {
			cfg, err := mysql.ParseDSN(m.DSN)
			if err != nil {
				tb.Fatal(err)
			}
			rt := &turns{}
			cfg.DialFunc = rt.dial
			connector, err := mysql.NewConnector(cfg)
			if err != nil {
				tb.Fatal(err)
			}
			db := sql.OpenDB(connector)
			tb.Cleanup(func() { _ = db.Close() })
			return newGuard(tb, mysqlstore.New(db)), rt.Load
		}}
}

// startEtcdStore starts one etcd member; the clients dial it directly, not through the
// FaultProxy that testserver puts in front of it.
func startEtcdStore(tb testing.TB) storeServer {
	addr := testserver.StartEtcd(tb).Members[0].Addr
	connect := func(tb testing.TB, opts ...grpc.DialOption) *clientv3.Client {
		tb.Helper()
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second,
			Logger: zap.NewNop(), DialOptions: opts})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	status, err := connect(tb).Status(context.Background(), addr)
	if err != nil {
		tb.Fatal(err)
	}
	return storeServer{server: "etcd", version: "etcdstore: etcd " + status.Version + ", one member, an fsync per Raft commit",
		open: func(tb testing.TB) (*guard.Guard, func() int64) {
			// The requests of lock operations: unary calls, but the session's lease grants.
			// Its lease keep-alives and the waiters' watches are streams, not counted.
			var n atomic.Int64
			cli := connect(tb, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
				cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if !strings.HasPrefix(method, "/etcdserverpb.Lease/") {
					n.Add(1)
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}))
			s := etcdstore.New(cli)
			tb.Cleanup(func() { _ = s.Close() }) // after the Guard's Close, before the client's
			return newGuard(tb, s), n.Load
		}}
}

// turns counts the request–response turns of the connections it dials, at the socket: a write
// that follows a read starts a new round trip. It sees all a driver sends on them —
// statements, prepares, pings, handshakes — and nothing of other clients.
type turns struct{ n atomic.Int64 }

// Load returns the round trips so far.
func (t *turns) Load() int64 { return t.n.Load() }

func (t *turns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &turnConn{Conn: c, turns: t}, nil
}

// turnConn is a connection whose turns are counted.
type turnConn struct {
	net.Conn
	turns   *turns
	writing atomic.Bool // the last I/O was a write: the request is still going out
}

func (c *turnConn) Write(p []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.turns.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *turnConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.writing.Store(false)
	}
	return n, err
}

// acquireRelease returns one uncontended TryAcquire + Release of name on g (without a lease
// time: the watchdog's lease, 30 s).
func acquireRelease(tb testing.TB, g *guard.Guard, name string) func() {
	lock := guardLocker(g)
	return func() {
		unlock, err := lock(context.Background(), name, false)
		if err != nil {
			tb.Fatal(err)
		}
		if err := unlock(); err != nil {
			tb.Fatal(err)
		}
	}
}

// figure formats a measured value for a chart's note: three significant digits or fewer, no
// exponent.
func figure(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// inMs formats d in milliseconds: "1 ms".
func inMs(d time.Duration) string { return fmt.Sprintf("%g ms", float64(d)/float64(time.Millisecond)) }

// loadOf returns rt's count, 0 without one.
func loadOf(rt func() int64) int64 {
	if rt == nil {
		return 0
	}
	return rt()
}

// BenchmarkStores takes and releases a free name through a Guard on each store — P1 of the
// store comparison, for go test -bench — on a server of its own that each sub-benchmark starts
// (not timed). It reports roundtrips/op besides the time and allocations.
func BenchmarkStores(b *testing.B) {
	for _, s := range backends {
		b.Run(s.name, func(b *testing.B) {
			g, rt := s.start(b).open(b)
			once := acquireRelease(b, g, "bench:stores:"+s.name)
			once() // the first operation may measure a clock, prepare statements or grant a lease
			before := loadOf(rt)
			b.ReportAllocs()
			for b.Loop() {
				once()
			}
			b.ReportMetric(float64(loadOf(rt)-before)/float64(b.N), "roundtrips/op")
		})
	}
}

// storeLayouts are the ways the contended workload's 16 goroutines are spread over Guards:
// one instance of a service, and four.
var storeLayouts = []struct {
	name   string
	guards int
}{{"1 Guard × 16", 1}, {"4 Guards × 4", 4}}

// compareStores starts every store's server, measures P1 (ops uncontended operations per store,
// in turns) and P2 (the contended workload, run for run after a warm-up of up to a second, in
// each layout), writes the two charts, and the figures into fig. It returns the servers'
// versions, one line each.
func compareStores(t *testing.T, fig *strings.Builder, ops int, run time.Duration) string {
	servers := make([]storeServer, len(backends))
	var versions strings.Builder
	for i, b := range backends {
		servers[i] = b.start(t)
		fmt.Fprintf(&versions, "  - %s\n", servers[i].version)
	}
	labels := make([]string, len(backends))
	for i, b := range backends {
		labels[i] = b.name
		if servers[i].server != "in-process" {
			labels[i] = strings.TrimSuffix(b.name, "-cluster") + " · " + servers[i].server
		}
	}

	// P1: one Guard per store, in turns.
	calls := make([]func(), len(backends))
	counts := make([]func() int64, len(backends))
	for i, b := range backends {
		var g *guard.Guard
		g, counts[i] = servers[i].open(t)
		calls[i] = acquireRelease(t, g, "bench:stores:p1:"+b.name)
		calls[i]() // the first operation may measure a clock, prepare statements or grant a lease
	}
	before := make([]int64, len(backends))
	for i := range counts {
		before[i] = loadOf(counts[i])
	}
	medians := interleaved(ops, storesTurn, calls)
	fmt.Fprintf(fig, "\n## Stores, P1: uncontended TryAcquire + Release (one Guard each, in turns of %d, %d operations each)\n\n"+
		"| store | server | median µs/op | allocs/op | round trips/op |\n|---|---|---|---|---|\n", storesTurn, ops)
	micros, allocs := series{name: "median"}, series{name: "allocations"}
	var microNotes, allocNotes []string
	for i, b := range backends {
		trips := float64(loadOf(counts[i])-before[i]) / float64(ops)
		a := testing.AllocsPerRun(100, calls[i])
		m := float64(medians[i]) / 1e3
		fmt.Fprintf(fig, "| %s | %s | %.1f | %.0f | %.2f |\n", b.name, servers[i].server, m, a, trips)
		micros.values, allocs.values = append(micros.values, m), append(allocs.values, a)
		microNotes, allocNotes = append(microNotes, figure(m)+" µs"), append(allocNotes, fmt.Sprintf("%.0f", a))
	}
	if err := writeChart("stores-p1.svg", rowChart("Stores, P1: uncontended TryAcquire + Release, median", labels, []panel{
		{title: "µs per operation (log scale)", series: []series{micros}, notes: [][]string{microNotes}, log: true},
		{title: "allocations per operation", series: []series{allocs}, notes: [][]string{allocNotes}},
	})); err != nil {
		t.Fatal(err)
	}

	// P2: the contended workload, each store in turn, in each layout.
	fmt.Fprintf(fig, "\n## Stores, P2: %d goroutines on one name (%s hold, %s work between holds, %v a case after a warm-up)\n\n"+
		"| store | Guards × goroutines | utilisation %% | p50 ms | p99 ms | acquisitions/s | round trips/acquisition |\n|---|---|---|---|---|---|---|\n",
		workers, inMs(holdFor), inMs(2*holdFor), run)
	util := make([]series, len(storeLayouts))
	p99 := make([]series, len(storeLayouts))
	utilNotes := make([][]string, len(storeLayouts))
	p99Notes := make([][]string, len(storeLayouts))
	for k, layout := range storeLayouts {
		util[k].name, p99[k].name = layout.name, layout.name
		for i, b := range backends {
			var locks []func(context.Context, string) (func(), error)
			var rts []func() int64
			for range layout.guards {
				g, rt := servers[i].open(t)
				locks, rts = append(locks, guardContender(g)), append(rts, rt)
			}
			trips := func() (n int64) {
				for _, rt := range rts {
					n += loadOf(rt)
				}
				return n
			}
			// A warm-up, not measured: new pools connect and prepare their statements, new
			// sessions grant their leases (the first second had a p99 several times the rest).
			name := fmt.Sprintf("bench:stores:p2:%d", layout.guards)
			if w := contendFor(name, locks, workers, holdFor, min(run, time.Second)); w.overlaps > 0 {
				t.Errorf("%s, %s, warm-up: %d overlapping holders", b.name, layout.name, w.overlaps)
			}
			start := trips()
			r := contendFor(name, locks, workers, holdFor, run)
			if r.overlaps > 0 || r.failures > 0 || r.acquired == 0 {
				t.Errorf("%s, %s: %d overlapping holders, %d failed acquisitions, %d acquisitions", b.name, layout.name, r.overlaps, r.failures, r.acquired)
			}
			perAcq := float64(trips()-start) / float64(max(r.acquired, 1))
			fmt.Fprintf(fig, "| %s | %s | %.1f | %.2f | %.2f | %.0f | %.2f |\n", b.name, layout.name, r.util, r.p50, r.p99, r.perSecond, perAcq)
			util[k].values, p99[k].values = append(util[k].values, r.util), append(p99[k].values, r.p99)
			utilNotes[k] = append(utilNotes[k], fmt.Sprintf("%.0f %%", r.util))
			p99Notes[k] = append(p99Notes[k], figure(r.p99)+" ms")
		}
	}
	fig.WriteString("\nRound trips: go-redis's commands and pipelines (on the Cluster, per node); the MongoDB driver's commands; " +
		"request–response turns at the socket for PostgreSQL and MariaDB; etcd's unary requests but lease grants " +
		"(the lease keep-alives and the waiters' watches are streams, not counted). A P2 acquisition's include its release.\n")
	if err := writeChart("stores-p2.svg", rowChart(fmt.Sprintf("Stores, P2: %d goroutines on one name, %s hold, %s work between holds", workers, inMs(holdFor), inMs(2*holdFor)), labels, []panel{
		{title: "utilisation, %", series: util, notes: utilNotes},
		{title: "p99 wait, ms (log scale)", series: p99, notes: p99Notes, log: true},
	})); err != nil {
		t.Fatal(err)
	}
	return versions.String()
}
