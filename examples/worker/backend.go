package main

// This file is the program's plumbing: the lock backend that the flags choose, tracing, and a
// shutdown that loses nothing. The httpapi example has the same file, so that each example can
// be copied into a module of its own.

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// inProcess describes the embedded default backend.
const inProcess = "the embedded in-process backend (memstore)"

// connectTimeout bounds the wait for a server's first answer; shutdownTimeout each step of
// the shutdown.
const (
	connectTimeout  = 5 * time.Second
	shutdownTimeout = 10 * time.Second
)

// backendFlags are the flags that choose the lock backend: at most one server, or none for
// the embedded in-process backend.
type backendFlags struct {
	redis, mongo, postgres, mysql string
}

// register adds -redis, -mongo, -postgres and -mysql to fs; -redis and -mongo default to
// GUARD_REDIS_ADDR and GUARD_MONGO_URI.
func (b *backendFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.redis, "redis", os.Getenv("GUARD_REDIS_ADDR"),
		"lock on the Redis server at `host:port` (env GUARD_REDIS_ADDR)")
	fs.StringVar(&b.mongo, "mongo", os.Getenv("GUARD_MONGO_URI"),
		"lock on MongoDB at `uri`, collection locks of the URI's database, default guard (env GUARD_MONGO_URI)")
	fs.StringVar(&b.postgres, "postgres", "",
		"lock on the PostgreSQL database at `dsn` (postgres://user:pass@host/db), table guard_locks, created if missing")
	fs.StringVar(&b.mysql, "mysql", "",
		"lock on the MySQL or MariaDB database at `dsn` (user:pass@tcp(host:3306)/db), table guard_locks, created if missing")
}

// open connects to the backend b chooses and checks that it answers. It returns the backend,
// a description for the log (without credentials), and a function that disconnects it: call
// it after the Guards on the backend are closed, since closing a Guard releases its locks.
func (b backendFlags) open(ctx context.Context) (backend guard.Backend, desc string, disconnect func() error, err error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	chosen := 0
	for _, v := range []string{b.redis, b.mongo, b.postgres, b.mysql} {
		if v != "" {
			chosen++
		}
	}
	switch {
	case chosen > 1:
		return nil, "", nil, errors.New("choose one of -redis, -mongo, -postgres and -mysql")
	case b.redis != "":
		// ContextTimeoutEnabled: acquire and release honour their context on a hung connection.
		client := redis.NewClient(&redis.Options{Addr: b.redis, ContextTimeoutEnabled: true})
		if err := client.Ping(ctx).Err(); err != nil {
			return nil, "", nil, errors.Join(fmt.Errorf("Redis at %s: %w", b.redis, err), client.Close())
		}
		return redisstore.New(client), "Redis at " + b.redis + " (redisstore)", client.Close, nil
	case b.mongo != "":
		cs, err := connstring.ParseAndValidate(b.mongo)
		if err != nil {
			return nil, "", nil, fmt.Errorf("MongoDB URI: %w", err)
		}
		db := cs.Database
		if db == "" {
			db = "guard"
		}
		client, err := mongo.Connect(options.Client().ApplyURI(b.mongo).SetServerSelectionTimeout(connectTimeout))
		if err != nil {
			return nil, "", nil, fmt.Errorf("MongoDB: %w", err)
		}
		disconnect := func() error { return within(client.Disconnect) }
		hosts := strings.Join(cs.Hosts, ",")
		if err := client.Ping(ctx, nil); err != nil {
			return nil, "", nil, errors.Join(fmt.Errorf("MongoDB at %s: %w", hosts, err), disconnect())
		}
		return mongostore.New(client.Database(db).Collection("locks")),
			fmt.Sprintf("MongoDB at %s, collection %s.locks (mongostore)", hosts, db), disconnect, nil
	case b.postgres != "":
		pool, err := pgxpool.New(ctx, b.postgres)
		if err != nil {
			return nil, "", nil, fmt.Errorf("PostgreSQL DSN: %w", err)
		}
		cc := pool.Config().ConnConfig
		where := fmt.Sprintf("%s/%s", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cc.Database)
		store := pgstore.New(pool)
		if err := store.CreateTable(ctx); err != nil {
			pool.Close()
			return nil, "", nil, fmt.Errorf("PostgreSQL at %s: %w", where, err)
		}
		return store, fmt.Sprintf("PostgreSQL at %s, table %s (pgstore)", where, store.Table()),
			func() error { pool.Close(); return nil }, nil
	case b.mysql != "":
		cfg, err := mysql.ParseDSN(b.mysql)
		if err != nil {
			return nil, "", nil, fmt.Errorf("MySQL DSN: %w", err)
		}
		where := cfg.Addr + "/" + cfg.DBName
		db, err := sql.Open("mysql", b.mysql)
		if err != nil {
			return nil, "", nil, fmt.Errorf("MySQL: %w", err)
		}
		store := mysqlstore.New(db)
		if err := store.CreateTable(ctx); err != nil {
			return nil, "", nil, errors.Join(fmt.Errorf("MySQL at %s: %w", where, err), db.Close())
		}
		return store, fmt.Sprintf("MySQL at %s, table %s (mysqlstore)", where, mysqlstore.DefaultTable), db.Close, nil
	}
	return memstore.New(), inProcess, func() error { return nil }, nil
}

// startTracing installs an OpenTelemetry SDK TracerProvider as the global one when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (a URL such as
// http://127.0.0.1:4318, Jaeger's OTLP/HTTP port): spans go in batches to an OTLP/HTTP
// exporter that the standard OTEL_* variables configure, under the service name service
// unless OTEL_SERVICE_NAME says otherwise. Otherwise the global provider stays a no-op. It
// returns a description for the log, and flush, which exports the spans still queued: call it
// last, after the Guards are closed, so that their release spans are exported too.
func startTracing(ctx context.Context, service string) (flush func() error, desc string, err error) {
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" {
		return func() error { return nil },
			"tracing off (set OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://127.0.0.1:4318, to export spans)", nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// The environment's resource wins over the default service name.
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return nil, "", fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	name, _ := res.Set().Value(semconv.ServiceNameKey)
	return func() error { return within(tp.Shutdown) },
		fmt.Sprintf("tracing: OTLP/HTTP to %s as service %s", endpoint, name.Emit()), nil
}

// within calls f with a context that ends after shutdownTimeout.
func within(f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return f(ctx)
}
