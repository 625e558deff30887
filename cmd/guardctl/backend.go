package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/mysqlstore"
	"github.com/guardlock/guard/pgstore"
	"github.com/guardlock/guard/redisstore"
)

// form is one kind of -backend string that guardctl takes: a URL scheme (or, for a DSN
// without one, a test of the string), how the usage shows it, how to hide its secrets, how
// to parse it and how to open its store. forms lists them all: a new form is one more row.
type form struct {
	schemes []string              // the URL schemes of the form, lower case
	match   func(raw string) bool // for a DSN without a scheme: whether raw is one
	usage   string                // its shape, for guardctl -h
	note    string                // what -h says beside it; lines after a newline go under it
	redis   bool                  // a Redis form: -prefix applies
	split   func(raw string) (*connString, error)
	parse   func(b *backend) error
	// open connects to b's backend, and passes closing what it must close before it builds
	// the store (which may panic on an option).
	open func(ctx context.Context, b *backend, closing func(func())) (guard.Inspector, error)
}

// forms are the -backend URLs and DSNs guardctl takes, in the order guardctl -h lists them.
var forms = []form{
	{schemes: []string{"redis", "rediss"}, redis: true, split: splitURL, parse: parseRedis, open: openRedis,
		usage: "redis://[user:pass@]host:port[/db]", note: "rediss:// for TLS"},
	{schemes: []string{"redis+cluster", "rediss+cluster"}, redis: true, split: splitURL, parse: parseCluster, open: openRedis,
		usage: "redis+cluster://[user:pass@]host:port[,host:port...]", note: "rediss+cluster:// for TLS"},
	{schemes: []string{"redis+sentinel", "rediss+sentinel"}, redis: true, split: splitURL, parse: parseSentinel, open: openRedis,
		usage: "redis+sentinel://[user:pass@]host:port[,host:port...][/db]?master_name=NAME",
		note: "rediss+sentinel:// for TLS; the sentinels' credentials in user:pass or\n" +
			"?sentinel_username=&sentinel_password=, the master's in ?password="},
	{schemes: []string{"mongodb", "mongodb+srv"}, split: splitURL, parse: parseMongo, open: openMongo,
		usage: "mongodb://[user:pass@]host[:port][,...]/db?collection=NAME", note: "mongodb+srv:// too"},
	{schemes: []string{"postgres", "postgresql"}, split: splitURL, parse: parsePostgres, open: openPostgres,
		usage: "postgres://[user:pass@]host[:port]/db[?table=NAME]", note: "postgresql:// too"},
	{match: isKeywordDSN, split: splitKeywords, parse: parsePostgres, open: openPostgres,
		usage: "host=H dbname=DB [password=P ...] [table=NAME]", note: "libpq keyword=value"},
	{schemes: []string{"mysql", "mariadb"}, split: splitURL, parse: parseMySQL, open: openMySQL,
		usage: "mysql://[user:pass@]host[:port]/db[?table=NAME]", note: "mariadb:// too"},
	{match: isMySQLDSN, split: splitMySQLDSN, parse: parseMySQLDSN, open: openMySQL,
		usage: "[user[:pass]@]tcp(host:port)/db[?table=NAME]", note: "go-sql-driver DSN"},
	{schemes: []string{"etcd", "etcds"}, split: splitURL, parse: parseEtcd, open: openEtcd,
		usage: "etcd://[user:pass@]host[:port][,host[:port]...][/prefix]",
		note: "etcds:// for TLS: ?cacert=FILE, and ?cert=FILE&key=FILE for a client\n" +
			"certificate; the path is etcdstore.WithPrefix's prefix (default guard/)"},
}

// urlForms is the part of the usage that lists the forms of -backend.
func urlForms() string {
	var b strings.Builder
	const column = 56 // where a note beside its form starts; a longer form has it below
	b.WriteString("backends (-backend, or $" + backendEnv + "):\n")
	for _, f := range forms {
		indent := column
		b.WriteString("  " + f.usage)
		if len(f.usage)+4 > column {
			indent = 6
			b.WriteString("\n" + strings.Repeat(" ", indent))
		} else {
			b.WriteString(strings.Repeat(" ", column-len(f.usage)-2))
		}
		b.WriteString(strings.ReplaceAll(f.note, "\n", "\n"+strings.Repeat(" ", indent)) + "\n")
	}
	b.WriteString(`  Other query parameters go to the driver: go-redis options (dial_timeout=...), the MongoDB
  connection string, libpq settings (sslmode=...), go-sql-driver parameters (tls=...); an etcd
  URL takes only its TLS files.
  In a URL, a password percent-encodes '/', '?', '#' and '%'; a parameter's value, '#', '&',
  '@' and '%'. In a libpq string, a value with spaces goes in single quotes.
  A name that starts with '-' goes after --: guardctl show -- -name`)
	return b.String()
}

// formOf returns the form of raw, or nil.
func formOf(raw string) *form {
	scheme, _, isURL := strings.Cut(raw, "://")
	scheme = strings.ToLower(scheme)
	for i, f := range forms {
		if isURL && slices.Contains(f.schemes, scheme) || !isURL && f.match != nil && f.match(raw) {
			return &forms[i]
		}
	}
	return nil
}

// schemeLike matches what can be a URL's scheme, which guardctl may repeat in a message.
var schemeLike = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// backend is a parsed -backend string: which form it is and the driver's configuration for
// it. Parsing does no I/O; open connects.
type backend struct {
	form    *form
	conn    *connString   // the string taken apart
	url     string        // the URL or DSN with its secrets hidden, for messages
	timeout time.Duration // how long a driver may wait to connect

	redis    *redis.Options         // redis://
	cluster  *redis.ClusterOptions  // redis+cluster://
	failover *redis.FailoverOptions // redis+sentinel://
	prefix   string                 // the Redis key prefix (redisstore.WithPrefix)
	dials    dialErrors             // of the Redis clients

	mongo      *options.ClientOptions // nil for mongodb+srv (see openMongo)
	srv        bool                   // mongodb+srv
	database   string
	collection string

	pg    *pgxpool.Config
	mysql *mysql.Config
	table string // PostgreSQL, MySQL: "" for the store's default

	etcd       *clientv3.Config
	etcdPrefix string // etcdstore.WithPrefix
}

// usageError is a mistake in the command line: guardctl exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// parseBackend parses a -backend string. prefix is the -prefix flag, nil when not given: only
// the Redis forms take it. timeout bounds how long a driver waits to connect. A string of no
// known form is never repeated: it may be all secret; nor is one that guardctl cannot take
// apart.
func parseBackend(raw string, prefix *string, timeout time.Duration) (*backend, error) {
	if raw == "" {
		return nil, usagef("no backend: give -backend URL or set " + backendEnv)
	}
	f := formOf(raw)
	if f == nil {
		if scheme, _, ok := strings.Cut(raw, "://"); ok && schemeLike.MatchString(scheme) {
			var known []string
			for _, f := range forms {
				known = append(known, f.schemes...)
			}
			return nil, usagef("-backend: unknown scheme %q: guardctl knows %s, and libpq and go-sql-driver DSNs",
				strings.ToLower(scheme), strings.Join(known, ", "))
		}
		return nil, usagef("-backend: neither a URL nor a DSN that guardctl knows")
	}
	b := &backend{form: f, timeout: timeout, prefix: redisstore.DefaultPrefix}
	var err error
	if b.conn, err = f.split(raw); err != nil {
		return nil, usagef("-backend %s: %v", f.label(raw), err)
	}
	b.url = b.conn.render(true)
	if prefix != nil {
		if !f.redis {
			hint := ""
			if slices.Contains(f.schemes, "etcd") {
				hint = " (an etcd URL's path is its prefix: etcd://host:2379/PREFIX)"
			}
			return nil, usagef("-backend %s: -prefix applies to Redis backends only%s", b.url, hint)
		}
		b.prefix = *prefix
	}
	if err := f.parse(b); err != nil {
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err // without the URL it quotes
		}
		return nil, usagef("-backend %s: %v", b.url, err)
	}
	return b, nil
}

// label names raw's form in a message about a string that guardctl could not take apart.
func (f *form) label(raw string) string {
	if scheme, _, ok := strings.Cut(raw, "://"); ok {
		return strings.ToLower(scheme) + "://…"
	}
	return "(" + f.note + ")"
}

// driverParse runs parse — a driver's parser, and guardctl's checks of what it parsed — on
// the backend's string with its secrets. When that fails it returns the error of parse on the
// string with each secret replaced by xxxxx, the one a message may quote: a driver's error
// may quote what it parsed. When only that one parses, a secret parameter's value is what the
// driver refused, and the error says which parameters hold one.
func (b *backend) driverParse(parse func(text string) error) error {
	if parse(b.conn.render(false)) == nil {
		return nil
	}
	if err := parse(b.conn.render(true)); err != nil {
		return err
	}
	var secrets []string
	for _, p := range b.conn.params {
		if p.secret() {
			secrets = append(secrets, p.key+"=")
		}
	}
	if len(secrets) == 0 {
		secrets = []string{"the password"}
	}
	return fmt.Errorf("the driver refused the value of %s (its message is not shown: it may quote the value)",
		strings.Join(secrets, ", "))
}

// parseRedis parses redis:// and rediss://.
func parseRedis(b *backend) error {
	return b.driverParse(func(text string) (err error) {
		if b.redis, err = redis.ParseURL(text); err != nil {
			return err
		}
		b.redis.ContextTimeoutEnabled = true
		b.redis.Dialer = b.dials.dialer(b.redis.TLSConfig)
		oneTry(&b.redis.MaxRetries)
		return nil
	})
}

// oneTry makes a go-redis client send each request once, unless the URL asks for retries: a
// failure then says why at once.
func oneTry(maxRetries *int) {
	if *maxRetries == 0 {
		*maxRetries = -1
	}
}

// parseCluster parses redis+cluster:// and rediss+cluster://: a host list.
func parseCluster(b *backend) error {
	return b.driverParse(func(text string) error {
		single, err := singleHost(text, "6379", true)
		if err != nil {
			return err
		}
		if b.cluster, err = redis.ParseClusterURL(single); err != nil {
			return err
		}
		b.cluster.ContextTimeoutEnabled = true
		b.cluster.Dialer = b.dials.dialer(b.cluster.TLSConfig)
		oneTry(&b.cluster.MaxRetries)
		return nil
	})
}

// parseSentinel parses redis+sentinel:// and rediss+sentinel://: a host list of sentinels,
// and ?sentinel_username= and ?sentinel_password=, which go-redis takes only from the user
// information.
func parseSentinel(b *backend) error {
	taken := make(map[string]*string)
	for _, param := range []string{"sentinel_username", "sentinel_password"} {
		v, ok, err := b.conn.take(param)
		if err != nil {
			return err
		}
		if ok {
			taken[param] = &v
		}
	}
	err := b.driverParse(func(text string) error {
		single, err := singleHost(text, "26379", false)
		if err != nil {
			return err
		}
		b.failover, err = redis.ParseFailoverURL(single)
		return err
	})
	if err != nil {
		return err
	}
	for param, field := range map[string]*string{
		"sentinel_username": &b.failover.SentinelUsername,
		"sentinel_password": &b.failover.SentinelPassword,
	} {
		if taken[param] == nil {
			continue
		}
		if *field != "" {
			return fmt.Errorf("the user information and ?%s= both give the sentinels' %s",
				param, strings.TrimPrefix(param, "sentinel_"))
		}
		*field = *taken[param]
	}
	if b.failover.MasterName == "" {
		return errors.New("a Sentinel URL needs ?master_name=NAME")
	}
	b.failover.ContextTimeoutEnabled = true
	b.failover.Dialer = b.dials.dialer(b.failover.TLSConfig)
	oneTry(&b.failover.MaxRetries)
	return nil
}

// parseMongo parses mongodb:// and mongodb+srv://. A mongodb+srv URI is checked as a
// mongodb:// one would be — with the rules of SRV on top — and parsed when it is opened:
// parsing it looks its hosts up in DNS.
func parseMongo(b *backend) error {
	var err error
	if b.collection, _, err = b.conn.take("collection"); err != nil {
		return err
	}
	if b.database, err = url.PathUnescape(strings.TrimPrefix(b.conn.path, "/")); err != nil {
		return errors.New("the database name has a '%' that is not followed by two hex digits")
	}
	if b.database == "" || b.collection == "" {
		return errors.New("a MongoDB URL names the database and the collection: mongodb://host/db?collection=NAME")
	}
	b.srv = strings.EqualFold(b.conn.scheme, "mongodb+srv")
	return b.driverParse(func(text string) error {
		_, rest, _ := strings.Cut(text, "://")
		o, err := mongoOptions("mongodb://"+rest, b.timeout)
		if err != nil {
			return err
		}
		if !b.srv {
			b.mongo = o
			return nil
		}
		switch {
		case len(o.Hosts) != 1:
			return errors.New("a mongodb+srv URL has one host name, which DNS resolves")
		case strings.Contains(strings.TrimPrefix(o.Hosts[0], "["), ":"):
			return errors.New("a mongodb+srv URL has no port: DNS gives the ports")
		}
		return nil
	})
}

// parsePostgres parses postgres:// and postgresql:// URLs and libpq keyword/value strings,
// taking table= out of them.
func parsePostgres(b *backend) error {
	var err error
	if b.table, _, err = b.conn.take("table"); err != nil {
		return err
	}
	return b.driverParse(func(text string) (err error) {
		if b.pg, err = pgxpool.ParseConfig(text); err != nil {
			return err
		}
		if c := b.pg.ConnConfig; c.ConnectTimeout <= 0 || c.ConnectTimeout > b.timeout {
			c.ConnectTimeout = b.timeout
		}
		return nil
	})
}

// keywordDSN matches the start of a libpq keyword/value string: a keyword and '='.
var keywordDSN = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// isKeywordDSN reports whether raw is a libpq keyword/value string.
func isKeywordDSN(raw string) bool { return keywordDSN.MatchString(raw) }

// parseMySQL parses mysql:// and mariadb:// URLs into a go-sql-driver configuration: the
// parameters other than table= are the driver's DSN parameters.
func parseMySQL(b *backend) error {
	var err error
	if b.table, _, err = b.conn.take("table"); err != nil {
		return err
	}
	if strings.Contains(b.conn.hosts, ",") {
		return errors.New("a MySQL URL has one host")
	}
	u, err := url.Parse("//" + b.conn.hosts)
	if err != nil {
		return err
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return errors.New("a MySQL URL needs a host: mysql://user:pass@host:port/db")
	}
	if port == "" {
		port = "3306"
	}
	db, err := url.PathUnescape(strings.TrimPrefix(b.conn.path, "/"))
	if err != nil || strings.Contains(db, "/") {
		return errors.New("a MySQL URL names one database after the host: mysql://host/db (a '%' or '/' in it percent-encoded)")
	}
	err = b.driverParse(func(text string) (err error) {
		b.mysql = mysql.NewConfig()
		if _, query, ok := strings.Cut(text, "?"); ok { // the user information holds no '?': it is escaped
			b.mysql, err = mysql.ParseDSN("/?" + query)
		}
		return err
	})
	if err != nil {
		return err
	}
	b.mysql.User, b.mysql.Passwd = b.conn.user, b.conn.password
	b.mysql.Net = "tcp"
	b.mysql.Addr = net.JoinHostPort(host, port)
	b.mysql.DBName = db
	return b.checkMySQL()
}

// isMySQLDSN reports whether raw looks like a go-sql-driver DSN: a database after a '/', and
// a user (an '@') or a network address ("tcp(…)") before it.
func isMySQLDSN(raw string) bool {
	slash := strings.LastIndexByte(raw, '/')
	return slash >= 0 && strings.ContainsAny(raw[:slash], "@(")
}

// parseMySQLDSN parses a go-sql-driver DSN, taking table= out of its parameters.
func parseMySQLDSN(b *backend) error {
	var err error
	if b.table, _, err = b.conn.take("table"); err != nil {
		return err
	}
	if err := b.driverParse(func(text string) (err error) {
		b.mysql, err = mysql.ParseDSN(text)
		return err
	}); err != nil {
		return err
	}
	return b.checkMySQL()
}

// checkMySQL checks b's MySQL configuration and bounds its dial timeout.
func (b *backend) checkMySQL() error {
	if b.mysql.DBName == "" && !strings.Contains(b.table, ".") {
		return errors.New("a MySQL backend names the database (mysql://host/db), or the table with its schema (?table=db.locks)")
	}
	if b.mysql.Timeout <= 0 || b.mysql.Timeout > b.timeout {
		b.mysql.Timeout = b.timeout
	}
	return nil
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
		// The stores validate their options by panicking (a table name that is not an
		// identifier, a prefix with braces): here that is a mistake in the URL or the flags.
		if p := recover(); p != nil {
			err = usagef("-backend %s: %v", b.url, p)
		}
		if err != nil {
			closeAll()
		}
	}()
	store, err := b.form.open(ctx, b, func(f func()) { closers = append(closers, f) })
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", b.url, err)
	}
	return store, closeAll, nil
}

// openRedis opens the client of a Redis form.
func openRedis(_ context.Context, b *backend, closing func(func())) (guard.Inspector, error) {
	var client redis.UniversalClient
	switch {
	case b.redis != nil:
		client = redis.NewClient(b.redis)
	case b.cluster != nil:
		client = redis.NewClusterClient(b.cluster)
	default:
		client = redis.NewFailoverClient(b.failover)
	}
	closing(func() { _ = client.Close() })
	return redisstore.New(client, redisstore.WithPrefix(b.prefix)), nil
}

func openMongo(ctx context.Context, b *backend, closing func(func())) (guard.Inspector, error) {
	opts := b.mongo
	if b.srv { // parsing looks it up in DNS
		if err := b.driverParse(func(text string) (err error) {
			opts, err = mongoOptions(text, b.timeout)
			return err
		}); err != nil {
			return nil, err
		}
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		return nil, err
	}
	closing(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return mongostore.New(client.Database(b.database).Collection(b.collection)), nil
}

func openPostgres(ctx context.Context, b *backend, closing func(func())) (guard.Inspector, error) {
	pool, err := pgxpool.NewWithConfig(ctx, b.pg)
	if err != nil {
		return nil, err
	}
	closing(pool.Close)
	var opts []pgstore.Option
	if b.table != "" {
		opts = append(opts, pgstore.WithTable(b.table))
	}
	return pgstore.New(pool, opts...), nil
}

func openMySQL(_ context.Context, b *backend, closing func(func())) (guard.Inspector, error) {
	connector, err := mysql.NewConnector(b.mysql)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	closing(func() { _ = db.Close() })
	var opts []mysqlstore.Option
	if b.table != "" {
		opts = append(opts, mysqlstore.WithTable(b.table))
	}
	return mysqlstore.New(db, opts...), nil
}

// etcdPort is the port of an etcd endpoint that names none: etcd's client port.
const etcdPort = "2379"

// parseEtcd parses etcd:// and etcds://: a list of endpoints, the user and password of etcd's
// authentication, the key prefix of the Store as the path, and for etcds:// the files of the
// TLS configuration (?cacert= for the servers' CA, ?cert= and ?key= for a client
// certificate). etcd's client has no URL of its own, so guardctl reads it all.
func parseEtcd(b *backend) error {
	tlsFiles := make(map[string]string)
	for _, param := range []string{"cacert", "cert", "key"} {
		v, ok, err := b.conn.take(param)
		switch {
		case err != nil:
			return err
		case ok && v == "":
			return fmt.Errorf("?%s= names no file", param)
		case ok:
			tlsFiles[param] = v
		}
	}
	if len(b.conn.params) > 0 {
		return fmt.Errorf("an etcd URL takes no parameter %s=: only cacert=, cert= and key=, with etcds://", b.conn.params[0].key)
	}
	secure := strings.EqualFold(b.conn.scheme, "etcds")
	if len(tlsFiles) > 0 && !secure {
		return errors.New("?cacert=, ?cert= and ?key= are for TLS: write etcds://")
	}
	if (tlsFiles["cert"] == "") != (tlsFiles["key"] == "") {
		return errors.New("a client certificate needs both ?cert= and ?key=")
	}
	if b.conn.hasUser && (b.conn.user == "" || b.conn.password == "") {
		// etcd's client logs in only with both: with one, it would go on unauthenticated,
		// and the server refuse every request without saying that the login is incomplete.
		return errors.New("etcd authenticates with a user name and a password: give both, user:password@")
	}

	var endpoints []string
	for h := range strings.SplitSeq(b.conn.hosts, ",") {
		if h == "" {
			return errors.New("an empty endpoint: etcd://host:port[,host:port...]")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), etcdPort)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			return errors.New("an endpoint that is not host:port")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return errors.New("an endpoint's port is not a number from 1 to 65535")
		}
		switch {
		case host == "":
			return errors.New("an endpoint without a host name")
		case strings.Contains(host, "%"):
			return errors.New("an endpoint's host holds a '%'")
		}
		endpoints = append(endpoints, h)
	}

	prefix, err := url.PathUnescape(strings.TrimPrefix(b.conn.path, "/"))
	switch {
	case err != nil:
		return errors.New("the prefix has a '%' that is not followed by two hex digits")
	case strings.IndexByte(prefix, 0) >= 0:
		return errors.New("the prefix holds a NUL byte, which no etcd key of guard has")
	case prefix == "":
		prefix = etcdstore.DefaultPrefix
	}
	b.etcdPrefix = prefix

	b.etcd = &clientv3.Config{
		Endpoints:   endpoints,
		Username:    b.conn.user,
		Password:    b.conn.password,
		DialTimeout: b.timeout,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return b.dials.dialer(nil)(ctx, "tcp", addr) // gRPC does the TLS
		})},
	}
	if secure {
		if b.etcd.TLS, err = etcdTLS(tlsFiles); err != nil {
			return err
		}
	}
	return nil
}

// etcdTLS returns the TLS configuration of an etcds:// URL: the system's roots, or those of
// the PEM file cacert; and the client certificate of the files cert and key, if given.
func etcdTLS(files map[string]string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if name := files["cacert"]; name != "" {
		pem, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("?cacert=: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("?cacert=: no PEM certificate in %s", name)
		}
	}
	if files["cert"] != "" {
		certPEM, err := os.ReadFile(files["cert"])
		if err != nil {
			return nil, fmt.Errorf("?cert=: %w", err)
		}
		// The value of key= is hidden where guardctl shows the URL: its error does not name
		// the file.
		keyPEM, err := os.ReadFile(files["key"])
		if pathErr := (*fs.PathError)(nil); errors.As(err, &pathErr) {
			err = pathErr.Err
		}
		if err != nil {
			return nil, fmt.Errorf("?key=: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("?cert= and ?key=: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// openEtcd opens an etcd client and the Store on it. With a user and a password, the client
// logs in before it returns, within -timeout.
func openEtcd(_ context.Context, b *backend, closing func(func())) (guard.Inspector, error) {
	client, err := clientv3.New(*b.etcd)
	if err != nil {
		// Only a login does I/O here, within -timeout; when it found no member to answer,
		// the client reports only its deadline, and the last dial error says why.
		code := status.Code(err)
		timedOut := errors.Is(err, context.DeadlineExceeded) || code == codes.DeadlineExceeded || code == codes.Unavailable
		if dialErr := b.dials.lastError(); dialErr != nil && timedOut {
			return nil, fmt.Errorf("logging in as %q: no answer within %v (-timeout): %w; last error: %w", b.conn.user, b.timeout, err, dialErr)
		}
		return nil, fmt.Errorf("logging in as %q: %w", b.conn.user, err)
	}
	closing(func() { _ = client.Close() })
	store := etcdstore.New(client, etcdstore.WithPrefix(b.etcdPrefix), etcdstore.WithRequestTimeout(b.timeout))
	closing(func() { _ = store.Close() })
	return store, nil
}
