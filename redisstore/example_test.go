package redisstore_test

import (
	"context"
	"log"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/redisstore"
)

// A Guard on a single Redis node. Every instance of the service builds the same; only one of
// them runs the nightly report at a time.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer rdb.Close() // after the Guard: it releases its locks through rdb

	g := guard.New(redisstore.New(rdb))
	defer g.Close(context.Background())

	err := g.Do(context.Background(), "report:nightly", func(ctx context.Context) error {
		// ctx ends if the lock is lost; pass it to everything the report does.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// A Redis Cluster: a lock's keys share one hash slot, and release notifications reach
// waiters connected to any node.
func ExampleNew_cluster() {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: strings.Split(os.Getenv("REDIS_CLUSTER_ADDRS"), ","),
	})
	defer rdb.Close()

	g := guard.New(redisstore.New(rdb, redisstore.WithPrefix("billing:lock:")))
	defer g.Close(context.Background())

	l, err := g.Acquire(context.Background(), "account:42", guard.WaitTime(5*time.Second))
	if err != nil {
		log.Print(err)
		return
	}
	defer l.Release(context.Background())
	// Hand l.Fence() to the storage you write to, so that it can refuse a stale holder.
}

// A master managed by Redis Sentinel: the failover client follows the master when Sentinel
// promotes a replica.
func ExampleNew_sentinel() {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "mymaster",
		SentinelAddrs: strings.Split(os.Getenv("REDIS_SENTINEL_ADDRS"), ","),
	})
	defer rdb.Close()

	g := guard.New(redisstore.New(rdb))
	defer g.Close(context.Background())
}
