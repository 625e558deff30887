package mysqlstore

import (
	"context"
	"database/sql"
	"io"
	"log"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/holdertest"
	"github.com/guardlock/guard/internal/testserver"
)

func TestMain(m *testing.M) {
	holdertest.Main(openHolder)
	// The driver logs connections it finds broken, which the crash tests break on purpose.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m)
}

// server is a MySQL or MariaDB server of the tests with the store's table created.
type server struct {
	*testserver.MySQL
	admin *sql.DB // goes behind the stores' backs
}

// startServer returns the shared server of a test: GUARD_MYSQL_DSN's, or a MariaDB of its
// own.
func startServer(tb testing.TB) *server {
	tb.Helper()
	return prepare(tb, testserver.StartMySQL(tb))
}

// startMariaDB returns a MariaDB of the test's own, which it may kill, restart and pause.
func startMariaDB(tb testing.TB) *server {
	tb.Helper()
	return prepare(tb, testserver.StartMariaDB(tb))
}

func prepare(tb testing.TB, m *testserver.MySQL) *server {
	tb.Helper()
	srv := &server{MySQL: m}
	srv.admin = srv.open(tb, nil)
	require.NoError(tb, New(srv.admin).CreateTable(context.Background()))
	return srv
}

// open returns a new *sql.DB on the server, closed when the test ends, with its
// configuration changed by each of configure. With rt, it counts the round trips of its
// connections.
func (srv *server) open(tb testing.TB, rt *roundTrips, configure ...func(*mysql.Config)) *sql.DB {
	tb.Helper()
	cfg, err := mysql.ParseDSN(srv.DSN)
	require.NoError(tb, err)
	for _, c := range configure {
		c(cfg)
	}
	if rt != nil {
		cfg.DialFunc = rt.dial
	}
	connector, err := mysql.NewConnector(cfg)
	require.NoError(tb, err)
	db := sql.OpenDB(connector)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// store returns a Store with a pool of its own, one connection of which is open already (so
// that the first operation does not pay for the connection), and its round-trip counter.
func (srv *server) store(tb testing.TB, configure ...func(*mysql.Config)) (*Store, *roundTrips) {
	tb.Helper()
	rt := &roundTrips{}
	db := srv.open(tb, rt, configure...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(tb, db.PingContext(ctx))
	return New(db), rt
}

// session returns a configuration that sets a session variable on every connection.
func session(variable, value string) func(*mysql.Config) {
	return func(c *mysql.Config) {
		if c.Params == nil {
			c.Params = make(map[string]string)
		}
		c.Params[variable] = value
	}
}

// roundTrips counts the network round trips of the connections of one *sql.DB, at the
// socket: a write that follows a read starts a new request–response turn. It sees every
// packet the driver sends — statements, prepares, pings, handshakes — and nothing of other
// clients, which a server-side counter (the Questions status) would mix in.
type roundTrips struct {
	n atomic.Int64
}

// Load returns the round trips so far.
func (rt *roundTrips) Load() int64 { return rt.n.Load() }

func (rt *roundTrips) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, rt: rt}, nil
}

// countingConn is a connection whose turns rt counts.
type countingConn struct {
	net.Conn
	rt      *roundTrips
	writing atomic.Bool // the last I/O was a write: the request is still going out
}

func (c *countingConn) Write(p []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.rt.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.writing.Store(false)
	}
	return n, err
}

// deadlocks returns a function that says how many deadlocks InnoDB reported since deadlocks
// was called, from the server's status (MariaDB's Innodb_deadlocks; "unknown" elsewhere).
func (srv *server) deadlocks(tb testing.TB) func() string {
	tb.Helper()
	read := func() (int64, bool) {
		var name string
		var n int64
		err := srv.admin.QueryRowContext(context.Background(), "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").Scan(&name, &n)
		return n, err == nil
	}
	before, ok := read()
	return func() string {
		after, ok2 := read()
		if !ok || !ok2 {
			return "unknown"
		}
		return strconv.FormatInt(after-before, 10)
	}
}

// guard returns a Guard on a Store with a pool of its own, closed when the test ends.
func (srv *server) guard(tb testing.TB, opts ...guard.Option) *guard.Guard {
	tb.Helper()
	s, _ := srv.store(tb)
	g := guard.New(s, opts...)
	tb.Cleanup(func() { _ = g.Close(context.Background()) })
	return g
}
