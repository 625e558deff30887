package main

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseBackend(t *testing.T) {
	const timeout = 3 * time.Second
	appPrefix := "app:"
	tests := []struct {
		name   string
		url    string
		prefix *string
		check  func(t *testing.T, b *backend)
	}{
		{"redis", "redis://127.0.0.1:6390", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.redis)
			assert.Equal(t, "127.0.0.1:6390", b.redis.Addr)
			assert.Zero(t, b.redis.DB)
			assert.Nil(t, b.redis.TLSConfig)
			assert.Equal(t, "guard:", b.prefix)
			assert.True(t, b.redis.ContextTimeoutEnabled, "requests must honour -timeout")
		}},
		{"redis with a user, a database and a prefix", "redis://ops:s3cret@cache:6379/3", &appPrefix, func(t *testing.T, b *backend) {
			require.NotNil(t, b.redis)
			assert.Equal(t, "ops", b.redis.Username)
			assert.Equal(t, "s3cret", b.redis.Password)
			assert.Equal(t, 3, b.redis.DB)
			assert.Equal(t, "app:", b.prefix)
			assert.Equal(t, "redis://ops:xxxxx@cache:6379/3", b.url)
		}},
		{"redis with TLS", "rediss://cache.internal:6380", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.redis.TLSConfig)
			assert.Equal(t, "cache.internal", b.redis.TLSConfig.ServerName)
		}},
		{"redis with a driver option", "redis://cache:6379?dial_timeout=2s&max_retries=2", nil, func(t *testing.T, b *backend) {
			assert.Equal(t, 2*time.Second, b.redis.DialTimeout)
			assert.Equal(t, 2, b.redis.MaxRetries, "an explicit max_retries stays")
		}},
		{"cluster", "redis+cluster://h1:7000,h2:7001,h3", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.cluster)
			assert.Equal(t, []string{"h1:7000", "h2:7001", "h3:6379"}, b.cluster.Addrs)
			assert.Nil(t, b.cluster.TLSConfig)
		}},
		{"cluster with TLS and a password", "rediss+cluster://:pw@h1:7000,h2:7001/", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.cluster)
			assert.Equal(t, []string{"h1:7000", "h2:7001"}, b.cluster.Addrs)
			assert.Equal(t, "pw", b.cluster.Password)
			require.NotNil(t, b.cluster.TLSConfig)
			assert.Equal(t, "rediss+cluster://:xxxxx@h1:7000,h2:7001/", b.url)
		}},
		{"sentinel", "redis+sentinel://s1:26380,s2?master_name=locks", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.failover)
			assert.Equal(t, []string{"s1:26380", "s2:26379"}, b.failover.SentinelAddrs)
			assert.Equal(t, "locks", b.failover.MasterName)
		}},
		{"sentinel with credentials and a database", "redis+sentinel://sen:spw@s1:26379/2?master_name=m&password=mpw", nil, func(t *testing.T, b *backend) {
			assert.Equal(t, "sen", b.failover.SentinelUsername)
			assert.Equal(t, "spw", b.failover.SentinelPassword)
			assert.Equal(t, "mpw", b.failover.Password)
			assert.Equal(t, 2, b.failover.DB)
		}},
		{"mongodb", "mongodb://app:pw@m1:27017,m2:27018/locksdb?collection=locks&replicaSet=rs0", nil, func(t *testing.T, b *backend) {
			require.NotEmpty(t, b.collection)
			assert.Equal(t, "locksdb", b.database)
			assert.Equal(t, "locks", b.collection)
			require.NotNil(t, b.mongo)
			assert.Equal(t, []string{"m1:27017", "m2:27018"}, b.mongo.Hosts)
			require.NotNil(t, b.mongo.ServerSelectionTimeout)
			assert.Equal(t, timeout, *b.mongo.ServerSelectionTimeout)
			assert.Equal(t, "mongodb://app:xxxxx@m1:27017,m2:27018/locksdb?collection=locks&replicaSet=rs0", b.url)
		}},
		{"mongodb+srv, resolved when opened", "mongodb+srv://app:pw@cluster0.example.net/locksdb?collection=locks", nil, func(t *testing.T, b *backend) {
			require.NotEmpty(t, b.collection)
			assert.Nil(t, b.mongo, "parsing an SRV URI looks it up in DNS: open does it")
			assert.Equal(t, "locksdb", b.database)
			assert.Equal(t, "locks", b.collection)
		}},
		{"postgres", "postgres://app:pw@db.internal:5433/appdb?table=ops.locks&sslmode=disable", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.pg)
			assert.Equal(t, "ops.locks", b.table)
			c := b.pg.ConnConfig
			assert.Equal(t, "db.internal", c.Host)
			assert.Equal(t, uint16(5433), c.Port)
			assert.Equal(t, "appdb", c.Database)
			assert.Equal(t, "app", c.User)
			assert.Equal(t, "pw", c.Password)
			assert.NotContains(t, c.RuntimeParams, "table", "table= must not reach the server as a setting")
			assert.Equal(t, timeout, c.ConnectTimeout)
		}},
		{"postgresql with the default table", "postgresql://db/appdb", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.pg)
			assert.Empty(t, b.table)
		}},
		{"mysql", "mysql://app:p%40ss@db:3307/appdb?table=locks&tls=skip-verify&timeout=1s", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.mysql)
			assert.Equal(t, "locks", b.table)
			c := b.mysql
			assert.Equal(t, "app", c.User)
			assert.Equal(t, "p@ss", c.Passwd)
			assert.Equal(t, "tcp", c.Net)
			assert.Equal(t, "db:3307", c.Addr)
			assert.Equal(t, "appdb", c.DBName)
			assert.Equal(t, "skip-verify", c.TLSConfig)
			assert.Equal(t, time.Second, c.Timeout, "a shorter dial timeout of the URL stays")
			assert.NotContains(t, c.Params, "table")
		}},
		{"mariadb with the default port", "mariadb://root@db/appdb", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.mysql)
			assert.Equal(t, "db:3306", b.mysql.Addr)
			assert.Equal(t, timeout, b.mysql.Timeout)
		}},
		{"mysql with the table's schema instead of a database", "mysql://root@db/?table=appdb.locks", nil, func(t *testing.T, b *backend) {
			assert.Empty(t, b.mysql.DBName)
			assert.Equal(t, "appdb.locks", b.table)
		}},
		{"sentinel with ?sentinel_username= and ?sentinel_password=",
			"redis+sentinel://s1:26380?master_name=m&sentinel_username=sen&sentinel_password=spw&password=mpw", nil, func(t *testing.T, b *backend) {
				require.NotNil(t, b.failover)
				assert.Equal(t, "sen", b.failover.SentinelUsername)
				assert.Equal(t, "spw", b.failover.SentinelPassword)
				assert.Equal(t, "mpw", b.failover.Password)
				assert.Equal(t, "redis+sentinel://s1:26380?master_name=m&sentinel_username=sen&sentinel_password=xxxxx&password=xxxxx", b.url)
			}},
		{"libpq keyword/value", "host=db.internal port=5433 user=app password='p w' dbname=appdb table=ops.locks sslmode=disable", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.pg)
			assert.Equal(t, "ops.locks", b.table)
			c := b.pg.ConnConfig
			assert.Equal(t, "db.internal", c.Host)
			assert.Equal(t, uint16(5433), c.Port)
			assert.Equal(t, "appdb", c.Database)
			assert.Equal(t, "p w", c.Password)
			assert.NotContains(t, c.RuntimeParams, "table")
			assert.Equal(t, "host=db.internal port=5433 user=app password=xxxxx dbname=appdb table=ops.locks sslmode=disable", b.url)
		}},
		{"mysql DSN", "app:p@ss@tcp(db:3307)/appdb?table=locks&parseTime=true", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.mysql)
			assert.Equal(t, "locks", b.table)
			assert.Equal(t, "app", b.mysql.User)
			assert.Equal(t, "p@ss", b.mysql.Passwd)
			assert.Equal(t, "db:3307", b.mysql.Addr)
			assert.Equal(t, "appdb", b.mysql.DBName)
			assert.True(t, b.mysql.ParseTime)
			assert.NotContains(t, b.mysql.Params, "table")
			assert.Equal(t, timeout, b.mysql.Timeout)
		}},
		{"mongodb+srv checked, resolved when opened", "mongodb+srv://app:pw@cluster0.example.net/locksdb?collection=locks&retryWrites=true", nil, func(t *testing.T, b *backend) {
			assert.Nil(t, b.mongo)
			assert.True(t, b.srv)
		}},
		{"etcd, the default prefix", "etcd://e1", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.etcd)
			assert.Equal(t, []string{"e1:2379"}, b.etcd.Endpoints)
			assert.Equal(t, "guard/", b.etcdPrefix)
			assert.Empty(t, b.etcd.Username)
			assert.Nil(t, b.etcd.TLS)
			assert.Equal(t, timeout, b.etcd.DialTimeout)
		}},
		{"etcd, endpoints, a user and a prefix", "etcd://ops:p%2Fw@e1:2379,[::1]:2479,e3/my%20app/locks/", nil, func(t *testing.T, b *backend) {
			assert.Equal(t, []string{"e1:2379", "[::1]:2479", "e3:2379"}, b.etcd.Endpoints)
			assert.Equal(t, "ops", b.etcd.Username)
			assert.Equal(t, "p/w", b.etcd.Password)
			assert.Equal(t, "my app/locks/", b.etcdPrefix, "the path as it is, unescaped: the Store's prefix")
			assert.Equal(t, "etcd://ops:xxxxx@e1:2379,[::1]:2479,e3/my%20app/locks/", b.url)
		}},
		{"etcds", "ETCDS://e1:2379/app", nil, func(t *testing.T, b *backend) {
			require.NotNil(t, b.etcd.TLS)
			assert.Nil(t, b.etcd.TLS.RootCAs, "the system's roots")
			assert.Equal(t, "app", b.etcdPrefix)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := parseBackend(tt.url, tt.prefix, timeout)
			require.NoError(t, err)
			tt.check(t, b)
		})
	}
}

func TestParseBackendErrors(t *testing.T) {
	appPrefix := "app:"
	tests := []struct {
		name   string
		url    string
		prefix *string
		want   string // in the message
	}{
		{"no URL", "", nil, "GUARDCTL_BACKEND"},
		{"no scheme", "localhost:6379", nil, "neither a URL nor a DSN that guardctl knows"},
		{"unknown scheme", "memcached://cache:11211", nil, `unknown scheme "memcached"`},
		{"redis database not a number", "redis://cache:6379/x", nil, "invalid database number"},
		{"redis unknown option", "redis://cache:6379?bogus=1", nil, "unexpected option: bogus"},
		{"password never echoed", "redis://ops:s3cret@cache:6379/x", nil, "redis://ops:xxxxx@cache:6379/x"},
		{"password never echoed by net/url", "redis://ops:s3cret@cache:port", nil, `invalid port ":port" after host`},
		{"password never echoed by net/url, cluster", "redis+cluster://ops:s3cret@h1:port,h2", nil, `invalid port ":port" after host`},
		{"password never echoed by net/url, mysql", "mysql://ops:s3%zzcret@db/app", nil, `the password has a '%' that is not followed by two hex digits`},
		{"cluster with a database", "redis+cluster://h1:7000/2", nil, "no database number"},
		{"cluster with an empty host", "redis+cluster://h1:7000,,h2:7001", nil, "empty host"},
		{"sentinel without a master", "redis+sentinel://s1:26379", nil, "master_name"},
		{"mongodb without a collection", "mongodb://m1/locksdb", nil, "collection=NAME"},
		{"mongodb without a database", "mongodb://m1/?collection=locks", nil, "collection=NAME"},
		{"mongodb with two collections", "mongodb://m1/db?collection=a&collection=b", nil, "given 2 times"},
		{"mongodb bad option", "mongodb://m1/db?collection=a&connectTimeoutMS=soon", nil, "invalid value for \"connectTimeoutMS\""},
		{"postgres bad port", "postgres://db:port/appdb", nil, "cannot parse"},
		{"mysql without a database", "mysql://root@db", nil, "names the database"},
		{"mysql without a host", "mysql:///appdb", nil, "needs a host"},
		{"prefix off Redis", "postgres://db/appdb", &appPrefix, "-prefix applies to Redis"},
		{"mysql with two tables", "mysql://root@db/appdb?table=a&table=b", nil, "table= given 2 times"},
		{"mysql DSN with two tables", "root@tcp(db)/appdb?table=a&table=b", nil, "table= given 2 times"},
		{"libpq with two tables", "host=db table=a table=b", nil, "table= given 2 times"},
		{"postgres with two tables", "postgres://db/appdb?table=a&table=b", nil, "table= given 2 times"},
		{"mongodb+srv with a port", "mongodb+srv://m1:27017/db?collection=locks", nil, "no port"},
		{"mongodb+srv with two hosts", "mongodb+srv://m1,m2/db?collection=locks", nil, "one host name"},
		{"mongodb+srv bad option", "mongodb+srv://m1/db?collection=a&connectTimeoutMS=soon", nil, "invalid value for \"connectTimeoutMS\""},
		{"sentinel credentials twice", "redis+sentinel://u:pw1@s1?master_name=m&sentinel_password=pw2", nil, "both give the sentinels' password"},
		{"etcd, an empty endpoint", "etcd://e1:2379,,e2:2379", nil, "an empty endpoint"},
		{"etcd, a bad port", "etcd://e1:70000", nil, "from 1 to 65535"},
		{"etcd, a user without a password", "etcd://ops@e1", nil, "give both"},
		{"etcd, an empty password", "etcd://ops:@e1", nil, "give both"},
		{"etcd, an unknown parameter", "etcd://e1?dial_timeout=1s", nil, "no parameter dial_timeout="},
		{"etcd, TLS files without TLS", "etcd://e1?cacert=/etc/ca.pem", nil, "write etcds://"},
		{"etcd, a certificate without its key", "etcds://e1?cert=/etc/c.pem", nil, "both ?cert= and ?key="},
		{"etcd, a CA file that is not there", "etcds://e1?cacert=/nonexistent/ca.pem", nil, "?cacert=: open /nonexistent/ca.pem"},
		{"etcd, a key file that is not there, not named", "etcds://e1?cert=backend_test.go&key=/nonexistent/s3cret.pem", nil, "?key=: no such file"},
		{"etcd, a NUL in the prefix", "etcd://e1/app%00", nil, "NUL"},
		{"etcd, -prefix", "etcd://e1", &appPrefix, "etcd://host:2379/PREFIX"},
		{"mysql DSN bad parameter", "root@tcp(db)/appdb?timeout=soon", nil, "invalid duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseBackend(tt.url, tt.prefix, time.Second)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "s3cret")
			assert.NotContains(t, err.Error(), "s3%zzcret")
			var u usageError
			assert.True(t, errors.As(err, &u), "a bad URL is a usage error: %v", err)
		})
	}
}

// TestOpenInvalidOption checks that what a store refuses at construction (by panicking) comes
// out of open as a usage error, with what open had opened closed again (goleak would see a
// pool's goroutines).
func TestOpenInvalidOption(t *testing.T) {
	badPrefix := "a{b}"
	tests := []struct {
		name   string
		url    string
		prefix *string
		want   string
	}{
		{"postgres table", "postgres://127.0.0.1:1/db?table=no-dashes", nil, "guard/pgstore: WithTable"},
		{"mysql table", "mysql://root@127.0.0.1:1/db?table=no-dashes", nil, "guard/mysqlstore: WithTable"},
		{"redis prefix", "redis://127.0.0.1:1", &badPrefix, "guard/redisstore: WithPrefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := parseBackend(tt.url, tt.prefix, time.Second)
			require.NoError(t, err)
			_, _, err = b.open(t.Context())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			var u usageError
			assert.True(t, errors.As(err, &u), "%v", err)
		})
	}
}
