package main

// This file is the program's plumbing: the lock backend that the flags choose, with the
// accounts' store on the same server, tracing, and a shutdown that loses nothing. The worker
// example has a file like it, so that each example can be copied into a module of its own.

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
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
	redis, mongo, postgres, mysql, etcd string
}

// register adds -redis, -mongo, -postgres, -mysql and -etcd to fs; -redis, -mongo and -etcd
// default to GUARD_REDIS_ADDR, GUARD_MONGO_URI and GUARD_ETCD_ENDPOINTS. The balances go
// where the locks go.
func (b *backendFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.redis, "redis", os.Getenv("GUARD_REDIS_ADDR"),
		"lock on the Redis server at `host:port` (env GUARD_REDIS_ADDR)")
	fs.StringVar(&b.mongo, "mongo", os.Getenv("GUARD_MONGO_URI"),
		"lock on MongoDB at `uri`, collection locks of the URI's database, default guard (env GUARD_MONGO_URI); balances in collection httpapi_accounts")
	fs.StringVar(&b.postgres, "postgres", "",
		"lock on the PostgreSQL database at `dsn` (postgres://user:pass@host/db), table guard_locks; balances in table httpapi_accounts; both created if missing")
	fs.StringVar(&b.mysql, "mysql", "",
		"lock on the MySQL or MariaDB database at `dsn` (user:pass@tcp(host:3306)/db), table guard_locks; balances in table httpapi_accounts; both created if missing")
	fs.StringVar(&b.etcd, "etcd", os.Getenv("GUARD_ETCD_ENDPOINTS"),
		"lock on the etcd cluster at `host:port[,host:port...]`, keys guard/ (env GUARD_ETCD_ENDPOINTS); balances under httpapi/account/")
}

// backend is what the flags chose: the locks, and the accounts' store on the same server.
type backend struct {
	locks guard.Backend
	store Store
	// setup creates the store's table when it is missing (nil: nothing to create). Two
	// processes creating one table at once may fail: call it under a lock.
	setup func(context.Context) error
	desc  string // for the log, without credentials
	// disconnect closes the clients: call it after the Guards on the backend are closed,
	// since closing a Guard releases its locks.
	disconnect func() error
}

// open connects to the backend b chooses and checks that it answers.
func (b backendFlags) open(ctx context.Context) (*backend, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	chosen := 0
	for _, v := range []string{b.redis, b.mongo, b.postgres, b.mysql, b.etcd} {
		if v != "" {
			chosen++
		}
	}
	switch {
	case chosen > 1:
		return nil, errors.New("choose one of -redis, -mongo, -postgres, -mysql and -etcd")
	case b.redis != "":
		// ContextTimeoutEnabled: acquire and release honour their context on a hung connection.
		client := redis.NewClient(&redis.Options{Addr: b.redis, ContextTimeoutEnabled: true})
		if err := client.Ping(ctx).Err(); err != nil {
			return nil, errors.Join(fmt.Errorf("Redis at %s: %w", b.redis, err), client.Close())
		}
		return &backend{redisstore.New(client), NewRedisStore(client), nil,
			"Redis at " + b.redis + " (redisstore)", client.Close}, nil
	case b.mongo != "":
		cs, err := connstring.ParseAndValidate(b.mongo)
		if err != nil {
			return nil, fmt.Errorf("MongoDB URI: %w", err)
		}
		db := cs.Database
		if db == "" {
			db = "guard"
		}
		client, err := mongo.Connect(options.Client().ApplyURI(b.mongo).SetServerSelectionTimeout(connectTimeout))
		if err != nil {
			return nil, fmt.Errorf("MongoDB: %w", err)
		}
		disconnect := func() error { return within(client.Disconnect) }
		hosts := strings.Join(cs.Hosts, ",")
		if err := client.Ping(ctx, nil); err != nil {
			return nil, errors.Join(fmt.Errorf("MongoDB at %s: %w", hosts, err), disconnect())
		}
		return &backend{mongostore.New(client.Database(db).Collection("locks")),
			NewMongoStore(client.Database(db).Collection("httpapi_accounts")), nil,
			fmt.Sprintf("MongoDB at %s, collection %s.locks (mongostore)", hosts, db), disconnect}, nil
	case b.postgres != "":
		pool, err := pgxpool.New(ctx, b.postgres)
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL DSN: %w", err)
		}
		cc := pool.Config().ConnConfig
		where := fmt.Sprintf("%s/%s", net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cc.Database)
		store := pgstore.New(pool)
		if err := store.CreateTable(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("PostgreSQL at %s: %w", where, err)
		}
		db := stdlib.OpenDBFromPool(pool) // the accounts' database/sql handle on the same pool
		accts := NewPostgresStore(db)
		return &backend{store, accts, accts.CreateTable,
			fmt.Sprintf("PostgreSQL at %s, table %s (pgstore)", where, store.Table()),
			func() error { err := db.Close(); pool.Close(); return err }}, nil
	case b.mysql != "":
		cfg, err := mysql.ParseDSN(b.mysql)
		if err != nil {
			return nil, fmt.Errorf("MySQL DSN: %w", err)
		}
		where := cfg.Addr + "/" + cfg.DBName
		db, err := sql.Open("mysql", b.mysql)
		if err != nil {
			return nil, fmt.Errorf("MySQL: %w", err)
		}
		store := mysqlstore.New(db)
		if err := store.CreateTable(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("MySQL at %s: %w", where, err), db.Close())
		}
		accts := NewMySQLStore(db)
		return &backend{store, accts, accts.CreateTable,
			fmt.Sprintf("MySQL at %s, table %s (mysqlstore)", where, mysqlstore.DefaultTable), db.Close}, nil
	case b.etcd != "":
		endpoints, err := etcdEndpoints(b.etcd)
		if err != nil {
			return nil, fmt.Errorf("-etcd %q: %w", b.etcd, err)
		}
		// No client log: a request cut short at shutdown is no warning, and this program
		// reports the errors it meets itself. The dialer keeps the last error of its dials,
		// which the client's own error — a timeout — does not tell.
		var dials dialErrors
		client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: connectTimeout, Logger: zap.NewNop(),
			DialOptions: []grpc.DialOption{grpc.WithContextDialer(dials.dial)}})
		if err != nil {
			return nil, fmt.Errorf("etcd at %s: %w", b.etcd, err)
		}
		// A read that a quorum must answer: the cluster serves, not just one member.
		if _, err := client.Get(ctx, "httpapi/account/"); err != nil {
			if last := dials.last(); last != nil {
				err = fmt.Errorf("%w; last error: %w", err, last)
			}
			return nil, errors.Join(fmt.Errorf("etcd at %s: %w", b.etcd, err), client.Close())
		}
		store := etcdstore.New(client)
		return &backend{store, NewEtcdStore(client), nil,
			fmt.Sprintf("etcd at %s, keys %s (etcdstore)", b.etcd, etcdstore.DefaultPrefix),
			func() error { return errors.Join(store.Close(), client.Close()) }}, nil
	}
	return &backend{memstore.New(), &Ledger{}, nil, inProcess, func() error { return nil }}, nil
}

// startTracing installs an OpenTelemetry SDK TracerProvider as the global one when spans go
// somewhere; otherwise the global provider stays a no-op. Spans go
//
//   - to an OTLP/HTTP exporter, in batches, when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (a URL such as http://127.0.0.1:4318,
//     Jaeger's OTLP/HTTP port), which the standard OTEL_* variables configure;
//   - to printTo, one line each as it ends, when printTo is not nil (-trace-stdout).
//
// The service name is service unless OTEL_SERVICE_NAME says otherwise. It returns a
// description for the log, and flush, which exports the spans still queued: call it last,
// after the Guards are closed, so that their release spans are exported too.
func startTracing(ctx context.Context, service string, printTo io.Writer) (flush func() error, desc string, err error) {
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" && printTo == nil {
		return func() error { return nil },
			"tracing off (-trace-stdout prints spans; OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://127.0.0.1:4318, exports them)", nil
	}
	// The environment's resource wins over the default service name.
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return nil, "", fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	name, _ := res.Set().Value(semconv.ServiceNameKey)
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	var to []string
	if endpoint != "" {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("OTLP trace exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
		to = append(to, "OTLP/HTTP to "+endpoint)
	}
	if printTo != nil {
		// A syncer, not a batcher: each span is printed as it ends, which is what someone
		// watching the terminal wants; a production exporter batches.
		opts = append(opts, sdktrace.WithSyncer(&spanPrinter{w: printTo}))
		to = append(to, "printed to stdout")
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func() error { return within(tp.Shutdown) },
		fmt.Sprintf("tracing: %s as service %s", strings.Join(to, " and "), name.Emit()), nil
}

// spanPrinter is a span exporter that prints one line per span: the start of its trace ID
// (the spans of one request share it), its name, its duration, its guard.lock.* attributes
// but the label and the backend (the name says them), its events and an error status.
//
//	span 5c1e0f2a guard.acquire tenant:{header.X-Tenant}:account:{id} 61.4ms outcome=acquired wait_seconds=0.0614 attempts=2 wakeups=1 fence=7 …
type spanPrinter struct {
	mu sync.Mutex // serialises the lines
	w  io.Writer
}

func (p *spanPrinter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range spans {
		var b strings.Builder
		fmt.Fprintf(&b, "span %.8s %s %v", s.SpanContext().TraceID(), s.Name(), s.EndTime().Sub(s.StartTime()).Round(100*time.Microsecond))
		for _, kv := range s.Attributes() {
			key, ok := strings.CutPrefix(string(kv.Key), "guard.lock.")
			if ok && key != "label" && key != "backend" {
				fmt.Fprintf(&b, " %s=%s", key, kv.Value.Emit())
			}
		}
		for _, e := range s.Events() {
			fmt.Fprintf(&b, " event=%s", e.Name)
		}
		if s.Status().Code == codes.Error {
			fmt.Fprintf(&b, " status=error(%s)", s.Status().Description)
		}
		if _, err := fmt.Fprintln(p.w, b.String()); err != nil {
			return err
		}
	}
	return nil
}

func (p *spanPrinter) Shutdown(context.Context) error { return nil }

// within calls f with a context that ends after shutdownTimeout.
func within(f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return f(ctx)
}

// etcdEndpoints returns the endpoints of list, host:port[,host:port...], each host:port or
// http://host:port. An empty entry, or one that is not host:port with a port from 1 to
// 65535, is an error at once, where the client would only time out.
func etcdEndpoints(list string) ([]string, error) {
	endpoints := strings.Split(list, ",")
	for i, e := range endpoints {
		addr := strings.TrimPrefix(e, "http://")
		if addr == "" {
			return nil, fmt.Errorf("endpoint %d is empty: want host:port[,host:port...]", i+1)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("endpoint %q: want host:port: %w", e, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || n == 0 {
			return nil, fmt.Errorf("endpoint %q: want host:port, with a host and a port from 1 to 65535", e)
		}
	}
	return endpoints, nil
}

// dialErrors keeps the last error of an etcd client's dials: a dead endpoint shows as a
// timeout in the client's errors, and as "connection refused" here.
type dialErrors struct {
	mu  sync.Mutex
	err error // the last dial's error; nil once a dial succeeds
}

// dial is the client's dialer, a plain TCP dial (gRPC does the TLS).
func (d *dialErrors) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	d.mu.Lock()
	d.err = err
	d.mu.Unlock()
	return conn, err
}

// last returns the last dial's error, or nil.
func (d *dialErrors) last() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}
