package setup

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/memstore"
	"github.com/guardlock/guard/mongostore"
	"github.com/guardlock/guard/redisstore"
)

// The environment variables that select a backend when the flags are not given.
const (
	RedisEnv = "GUARD_REDIS_ADDR" // host:port of a Redis server
	MongoEnv = "GUARD_MONGO_URI"  // a mongodb:// URI
)

// MongoDatabase is the database of the lock collection when the MongoDB URI names none;
// MongoCollection is the collection.
const (
	MongoDatabase   = "guard"
	MongoCollection = "locks"
)

// InProcess is the description of the embedded default backend.
const InProcess = "the embedded in-process backend (memstore)"

// connectTimeout bounds how long Open waits for a server's first answer.
const connectTimeout = 5 * time.Second

// Backend selects the lock backend of a program: Redis at RedisAddr, MongoDB at MongoURI, or
// with neither, the embedded in-process backend (memstore).
type Backend struct {
	RedisAddr string
	MongoURI  string
}

// BackendFlags registers -redis and -mongo on fs, with defaults from RedisEnv and MongoEnv,
// and returns the Backend they set.
func BackendFlags(fs *flag.FlagSet) *Backend {
	b := &Backend{}
	fs.StringVar(&b.RedisAddr, "redis", os.Getenv(RedisEnv),
		"lock on the Redis server at `host:port` (env "+RedisEnv+"); default: in-process")
	fs.StringVar(&b.MongoURI, "mongo", os.Getenv(MongoEnv),
		"lock on the MongoDB at `uri`, collection "+MongoCollection+" of the URI's database (default "+
			MongoDatabase+") (env "+MongoEnv+"); default: in-process")
	return b
}

// Open connects to the backend b selects and checks that it answers. It returns the backend,
// a description for the log (without credentials), and a function that disconnects it: call
// that after the Guards on it are closed, since closing a Guard releases its locks through
// the backend.
func (b Backend) Open(ctx context.Context) (backend guard.Backend, description string, disconnect func(context.Context) error, err error) {
	switch {
	case b.RedisAddr != "" && b.MongoURI != "":
		return nil, "", nil, errors.New("setup: choose Redis or MongoDB, not both")
	case b.RedisAddr != "":
		return openRedis(ctx, b.RedisAddr)
	case b.MongoURI != "":
		return openMongo(ctx, b.MongoURI)
	}
	return memstore.New(), InProcess, func(context.Context) error { return nil }, nil
}

func openRedis(ctx context.Context, addr string) (guard.Backend, string, func(context.Context) error, error) {
	// ContextTimeoutEnabled: acquire and release honour their context on a hung connection.
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		return nil, "", nil, fmt.Errorf("setup: Redis at %s: %w", addr, err)
	}
	return redisstore.New(client), "Redis at " + addr + " (redisstore)",
		func(context.Context) error { return client.Close() }, nil
}

func openMongo(ctx context.Context, uri string) (guard.Backend, string, func(context.Context) error, error) {
	cs, err := connstring.ParseAndValidate(uri)
	if err != nil {
		return nil, "", nil, fmt.Errorf("setup: MongoDB URI: %w", err)
	}
	db := cs.Database
	if db == "" {
		db = MongoDatabase
	}
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(connectTimeout))
	if err != nil {
		return nil, "", nil, fmt.Errorf("setup: MongoDB: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := client.Ping(pctx, nil); err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, "", nil, fmt.Errorf("setup: MongoDB at %s: %w", strings.Join(cs.Hosts, ","), err)
	}
	desc := fmt.Sprintf("MongoDB at %s, collection %s.%s (mongostore)", strings.Join(cs.Hosts, ","), db, MongoCollection)
	return mongostore.New(client.Database(db).Collection(MongoCollection)), desc, client.Disconnect, nil
}
