package main

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// urlForms is the part of the usage that lists the -backend URLs parseBackend accepts.
const urlForms = `backend URLs (-backend, or $GUARDCTL_BACKEND):
  redis://[user:pass@]host:port[/db]                     rediss:// for TLS
  redis+cluster://[user:pass@]host:port[,host:port...]   rediss+cluster:// for TLS
  redis+sentinel://[user:pass@]host:port[,host:port...][/db]?master_name=NAME
                                      (user:pass for the sentinels; ?password= for the master)
  mongodb://[user:pass@]host[:port][,...]/db?collection=NAME    mongodb+srv:// too
  postgres://[user:pass@]host[:port]/db[?table=NAME]            postgresql:// too
  mysql://[user:pass@]host[:port]/db[?table=NAME]               mariadb:// too
  Other query parameters go to the driver: go-redis options (dial_timeout=...), the MongoDB
  connection string, libpq settings (sslmode=...), go-sql-driver parameters (tls=...).`

// kind is the store a -backend URL names.
type kind int

const (
	kindRedis kind = iota + 1
	kindRedisCluster
	kindRedisSentinel
	kindMongo
	kindPostgres
	kindMySQL
)

// backend is a parsed -backend URL: which store it names and the driver's configuration for
// it. Parsing does no I/O; open connects.
type backend struct {
	kind    kind
	url     string        // the URL with its password hidden, for messages
	timeout time.Duration // how long a driver may wait to connect

	redis    *redis.Options         // kindRedis
	cluster  *redis.ClusterOptions  // kindRedisCluster
	failover *redis.FailoverOptions // kindRedisSentinel
	prefix   string                 // the Redis key prefix (redisstore.WithPrefix)
	dials    dialErrors             // of the Redis clients

	mongoURI   string                 // kindMongo: the URI without collection=
	mongo      *options.ClientOptions // parsed from mongoURI; nil for mongodb+srv (see open)
	database   string                 // kindMongo
	collection string                 // kindMongo

	pg    *pgxpool.Config // kindPostgres
	mysql *mysql.Config   // kindMySQL
	table string          // kindPostgres, kindMySQL: "" for the store's default
}

// usageError is a mistake in the command line: guardctl exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// parseBackend parses a -backend URL. prefix is the -prefix flag, nil when not given: only the
// Redis forms take it. timeout bounds how long a driver waits to connect.
func parseBackend(raw string, prefix *string, timeout time.Duration) (*backend, error) {
	b := &backend{url: redact(raw), timeout: timeout}
	fail := func(err error) (*backend, error) {
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err // without the URL it quotes, password and all
		}
		return nil, usagef("-backend %s: %v", b.url, err)
	}
	if raw == "" {
		return nil, usagef("no backend: give -backend URL or set GUARDCTL_BACKEND")
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return fail(errors.New(`not a URL: it must start with a scheme such as "redis://"`))
	}
	scheme = strings.ToLower(scheme)
	isRedis := strings.HasPrefix(scheme, "redis")
	b.prefix = redisstore.DefaultPrefix
	if prefix != nil {
		if !isRedis {
			return fail(errors.New("-prefix applies to Redis backends only"))
		}
		b.prefix = *prefix
	}
	var err error
	switch scheme {
	case "redis", "rediss":
		b.kind = kindRedis
		if b.redis, err = redis.ParseURL(raw); err != nil {
			return fail(err)
		}
		b.redis.ContextTimeoutEnabled = true
		b.redis.Dialer = b.dials.dialer(b.redis.TLSConfig)
		if b.redis.MaxRetries == 0 {
			b.redis.MaxRetries = -1 // one try per request: a failure says why at once
		}
	case "redis+cluster", "rediss+cluster":
		b.kind = kindRedisCluster
		single, err := singleHost(raw, "6379", true)
		if err != nil {
			return fail(err)
		}
		if b.cluster, err = redis.ParseClusterURL(single); err != nil {
			return fail(err)
		}
		b.cluster.ContextTimeoutEnabled = true
		b.cluster.Dialer = b.dials.dialer(b.cluster.TLSConfig)
		if b.cluster.MaxRetries == 0 {
			b.cluster.MaxRetries = -1 // one try per request: a failure says why at once
		}
	case "redis+sentinel", "rediss+sentinel":
		b.kind = kindRedisSentinel
		single, err := singleHost(raw, "26379", false)
		if err != nil {
			return fail(err)
		}
		if b.failover, err = redis.ParseFailoverURL(single); err != nil {
			return fail(err)
		}
		if b.failover.MasterName == "" {
			return fail(errors.New("a Sentinel URL needs ?master_name=NAME"))
		}
		b.failover.ContextTimeoutEnabled = true
		b.failover.Dialer = b.dials.dialer(b.failover.TLSConfig)
		if b.failover.MaxRetries == 0 {
			b.failover.MaxRetries = -1 // one try per request: a failure says why at once
		}
	case "mongodb", "mongodb+srv":
		b.kind = kindMongo
		var q url.Values
		if b.mongoURI, q, err = takeParams(raw, "collection"); err != nil {
			return fail(err)
		}
		b.collection = q.Get("collection")
		if b.database, err = pathOf(b.mongoURI); err != nil {
			return fail(err)
		}
		if b.database == "" || b.collection == "" {
			return fail(errors.New("a MongoDB URL names the database and the collection: mongodb://host/db?collection=NAME"))
		}
		if scheme == "mongodb" {
			// mongodb+srv is parsed when it is opened: parsing it looks its hosts up in DNS.
			if b.mongo, err = mongoOptions(b.mongoURI, timeout); err != nil {
				return fail(err)
			}
		}
	case "postgres", "postgresql":
		b.kind = kindPostgres
		dsn, q, err := takeParams(raw, "table")
		if err != nil {
			return fail(err)
		}
		b.table = q.Get("table")
		if b.pg, err = pgxpool.ParseConfig(dsn); err != nil {
			return fail(err)
		}
		if b.pg.ConnConfig.ConnectTimeout <= 0 || b.pg.ConnConfig.ConnectTimeout > timeout {
			b.pg.ConnConfig.ConnectTimeout = timeout
		}
	case "mysql", "mariadb":
		b.kind = kindMySQL
		if b.mysql, b.table, err = mysqlConfig(raw, timeout); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unknown scheme %q: guardctl knows redis, rediss, redis+cluster, "+
			"redis+sentinel, mongodb, mongodb+srv, postgres, postgresql, mysql and mariadb", scheme))
	}
	return b, nil
}

// dialErrors keeps the last error of a go-redis client's dials. A Cluster or Sentinel client
// that cannot reach a server keeps trying until the request's deadline and then reports only
// the deadline; the dial error says why.
type dialErrors struct {
	last atomic.Pointer[error]
}

// dialer returns a go-redis dialer, the same as go-redis's own but for the dial error it
// records and a TLS handshake bounded by ctx.
func (d *dialErrors) dialer(tlsConfig *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nd := &net.Dialer{KeepAlive: 5 * time.Minute}
		var conn net.Conn
		var err error
		if tlsConfig == nil {
			conn, err = nd.DialContext(ctx, network, addr)
		} else {
			conn, err = (&tls.Dialer{NetDialer: nd, Config: tlsConfig}).DialContext(ctx, network, addr)
		}
		if err != nil {
			d.last.Store(&err)
		}
		return conn, err
	}
}

// lastError returns the last dial error, or nil.
func (d *dialErrors) lastError() error {
	if p := d.last.Load(); p != nil {
		return *p
	}
	return nil
}

// singleHost rewrites a URL whose host part lists several hosts (h1:p1,h2:p2) into the form
// go-redis parses: the first host as the URL's host, the others as addr= parameters, and the
// scheme without its "+cluster" or "+sentinel" (redis or rediss). A host without a port gets defaultPort. With
// noPath, the URL must not have a path (a cluster has no database number).
func singleHost(raw, defaultPort string, noPath bool) (string, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	var addrs []string
	for h := range strings.SplitSeq(hosts, ",") {
		if h == "" {
			return "", errors.New("an empty host")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), defaultPort)
		}
		addrs = append(addrs, h)
	}
	scheme, _, _ = strings.Cut(strings.ToLower(scheme), "+") // redis or rediss
	u, err := url.Parse(scheme + "://" + userinfo + addrs[0] + tail)
	if err != nil {
		return "", err
	}
	if noPath && u.Path != "" && u.Path != "/" {
		return "", fmt.Errorf("a cluster URL has no path (no database number): %q", u.Path)
	}
	q := u.Query()
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// takeParams removes the query parameters names from a URL, and returns the URL without them
// and their values. It leaves the rest of the URL as it was: the host part of a MongoDB or
// PostgreSQL URL may list several hosts, which net/url does not parse.
func takeParams(raw string, names ...string) (string, url.Values, error) {
	base, query, _ := strings.Cut(raw, "?")
	query, fragment, hasFragment := strings.Cut(query, "#")
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", nil, err
	}
	taken := url.Values{}
	for _, n := range names {
		if v, ok := q[n]; ok {
			if len(v) > 1 {
				return "", nil, fmt.Errorf("%s= given %d times", n, len(v))
			}
			taken[n] = v
			delete(q, n)
		}
	}
	out := base
	if len(q) > 0 {
		out += "?" + q.Encode()
	}
	if hasFragment {
		out += "#" + fragment
	}
	return out, taken, nil
}

// pathOf returns the unescaped path of a URL after its first '/', without the query.
func pathOf(raw string) (string, error) {
	_, rest, _ := strings.Cut(raw, "://")
	rest, _, _ = strings.Cut(rest, "?")
	rest, _, _ = strings.Cut(rest, "#")
	_, path, ok := strings.Cut(rest, "/")
	if !ok {
		return "", nil
	}
	return url.PathUnescape(path)
}

// mongoOptions parses a MongoDB URI and bounds how long the driver waits for a server.
func mongoOptions(uri string, timeout time.Duration) (*options.ClientOptions, error) {
	o := options.Client().ApplyURI(uri)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.ServerSelectionTimeout == nil || *o.ServerSelectionTimeout > timeout {
		o.SetServerSelectionTimeout(timeout)
	}
	if o.ConnectTimeout == nil || *o.ConnectTimeout > timeout {
		o.SetConnectTimeout(timeout)
	}
	return o, nil
}

// mysqlConfig converts mysql://user:pass@host:port/db?params into a go-sql-driver
// configuration: the parameters other than table= are the driver's DSN parameters.
func mysqlConfig(raw string, timeout time.Duration) (*mysql.Config, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", err
	}
	q := u.Query()
	table := q.Get("table")
	q.Del("table")
	cfg := mysql.NewConfig()
	if len(q) > 0 {
		if cfg, err = mysql.ParseDSN("/?" + q.Encode()); err != nil {
			return nil, "", err
		}
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return nil, "", errors.New("a MySQL URL needs a host: mysql://user:pass@host:port/db")
	}
	if port == "" {
		port = "3306"
	}
	cfg.Addr = net.JoinHostPort(host, port)
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if strings.Contains(cfg.DBName, "/") {
		return nil, "", fmt.Errorf("bad database name %q", cfg.DBName)
	}
	if cfg.DBName == "" && !strings.Contains(table, ".") {
		return nil, "", errors.New("a MySQL URL names the database (mysql://host/db), or the table with its schema (?table=db.locks)")
	}
	if cfg.Timeout <= 0 || cfg.Timeout > timeout {
		cfg.Timeout = timeout
	}
	return cfg, table, nil
}

// redact returns raw with the password of its user information, if any, replaced by "xxxxx".
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return raw
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// open connects to the backend and returns its store, and a function that closes what open
// opened. The command uses only the store's guard.Inspector methods.
func (b *backend) open(ctx context.Context) (_ guard.Inspector, closeFn func(), err error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		// The stores validate their options by panicking (a table name that is not a plain
		// identifier, a prefix with braces): here that is a mistake in the URL or the flags.
		if p := recover(); p != nil {
			err = usagef("-backend %s: %v", b.url, p)
		}
		if err != nil {
			closeAll()
		}
	}()
	switch b.kind {
	case kindRedis, kindRedisCluster, kindRedisSentinel:
		var client redis.UniversalClient
		switch b.kind {
		case kindRedis:
			client = redis.NewClient(b.redis)
		case kindRedisCluster:
			client = redis.NewClusterClient(b.cluster)
		default:
			client = redis.NewFailoverClient(b.failover)
		}
		closers = append(closers, func() { _ = client.Close() })
		return redisstore.New(client, redisstore.WithPrefix(b.prefix)), closeAll, nil
	case kindMongo:
		opts := b.mongo
		if opts == nil {
			if opts, err = mongoOptions(b.mongoURI, b.timeout); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", b.url, err)
			}
		}
		client, err := mongo.Connect(opts)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", b.url, err)
		}
		closers = append(closers, func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = client.Disconnect(ctx)
		})
		return mongostore.New(client.Database(b.database).Collection(b.collection)), closeAll, nil
	case kindPostgres:
		pool, err := pgxpool.NewWithConfig(ctx, b.pg)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", b.url, err)
		}
		closers = append(closers, pool.Close)
		var opts []pgstore.Option
		if b.table != "" {
			opts = append(opts, pgstore.WithTable(b.table))
		}
		return pgstore.New(pool, opts...), closeAll, nil
	case kindMySQL:
		connector, err := mysql.NewConnector(b.mysql)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", b.url, err)
		}
		db := sql.OpenDB(connector)
		closers = append(closers, func() { _ = db.Close() })
		var opts []mysqlstore.Option
		if b.table != "" {
			opts = append(opts, mysqlstore.WithTable(b.table))
		}
		return mysqlstore.New(db, opts...), closeAll, nil
	}
	return nil, nil, fmt.Errorf("guardctl: backend kind %d not handled", b.kind) // parseBackend sets one
}
