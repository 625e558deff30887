package guardtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the driver mysqlstore runs on
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// Server is a lock backend that tests run on: the server behind it, started for one test,
// and the clients the test's service instances open to it.
type Server struct {
	// Name names the backend in subtest names: "memstore", "redis", "redis-cluster", "mongo",
	// "postgres", "mariadb".
	Name string
	// Start starts what the backend needs for the test (a redis-server, a Cluster, FerretDB;
	// nothing for memstore), stopped when the test ends. It returns open, which returns a new
	// Backend on that server with a client of its own — a service instance — closed when the
	// test that opened it ends.
	Start func(t *testing.T) (open func(t *testing.T) guard.Backend)
}

// Servers lists every backend. A test that ranges over it runs on each; a new backend is one
// more line here.
func Servers() []Server {
	return []Server{
		{"memstore", startMemory},
		{"redis", startRedis},
		{"redis-cluster", startCluster},
		{"mongo", startMongo},
		{"postgres", startPostgres},
		{"mariadb", startMariaDB},
	}
}

// startMemory shares one memstore.Store between the instances, as they would share a server.
func startMemory(*testing.T) func(*testing.T) guard.Backend {
	store := memstore.New()
	return func(*testing.T) guard.Backend { return store }
}

func startRedis(t *testing.T) func(*testing.T) guard.Backend {
	srv := testserver.StartRedis(t)
	return func(t *testing.T) guard.Backend {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		return redisstore.New(client)
	}
}

func startCluster(t *testing.T) func(*testing.T) guard.Backend {
	c := testserver.StartCluster(t)
	return func(t *testing.T) guard.Backend {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		return redisstore.New(client)
	}
}

func startMongo(t *testing.T) func(*testing.T) guard.Backend {
	srv := testserver.StartMongo(t)
	return func(t *testing.T) guard.Backend {
		client, err := mongo.Connect(options.Client().ApplyURI(srv.URI).SetServerSelectionTimeout(5 * time.Second))
		if err != nil {
			t.Fatalf("guardtest: connect to %s: %v", srv.URI, err)
		}
		t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
		return mongostore.New(client.Database(srv.Database).Collection("locks"))
	}
}

func startPostgres(t *testing.T) func(*testing.T) guard.Backend {
	srv := testserver.StartPostgres(t)
	table := "guard_locks"
	first := true
	return func(t *testing.T) guard.Backend {
		pool, err := pgxpool.New(context.Background(), srv.DSN)
		if err != nil {
			t.Fatalf("guardtest: connect to %s: %v", srv.DSN, err)
		}
		t.Cleanup(pool.Close)
		s := pgstore.New(pool, pgstore.WithTable(table))
		if first {
			if err := s.CreateTable(t.Context()); err != nil {
				t.Fatalf("guardtest: create table: %v", err)
			}
			first = false
		}
		return s
	}
}

func startMariaDB(t *testing.T) func(*testing.T) guard.Backend {
	srv := testserver.StartMySQL(t)
	first := true
	return func(t *testing.T) guard.Backend {
		db, err := sql.Open("mysql", srv.DSN)
		if err != nil {
			t.Fatalf("guardtest: open %s: %v", srv.DSN, err)
		}
		t.Cleanup(func() { _ = db.Close() })
		s := mysqlstore.New(db)
		if first {
			if err := s.CreateTable(t.Context()); err != nil {
				t.Fatalf("guardtest: create table: %v", err)
			}
			first = false
		}
		return s
	}
}

// Instance returns a Guard with opts on a new client from open — a service instance on a
// Server — warmed up (WarmUp); the test fails if it does not close cleanly when the test ends.
func Instance(t *testing.T, open func(*testing.T) guard.Backend, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g := guard.New(open(t), opts...)
	t.Cleanup(func() {
		if err := g.Close(context.Background()); err != nil {
			t.Errorf("guardtest: close the Guard: %v", err)
		}
	})
	WarmUp(t, g)
	return g
}

// WarmUp takes and releases a lock of its own on g, so that g's client has connected (and
// mongostore has measured the server's clock) before a test's first tick: a first run that
// waited for that would hold its window that much later, into the next tick.
func WarmUp(t *testing.T, g *guard.Guard) {
	t.Helper()
	l, err := g.TryAcquire(t.Context(), "warm-up:"+rand.Text())
	if err != nil {
		t.Fatalf("guardtest: warm up: %v", err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("guardtest: warm up: %v", err)
	}
}
