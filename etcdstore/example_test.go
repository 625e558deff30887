package etcdstore_test

import (
	"context"
	"log"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
)

// A Guard on an etcd cluster. Every instance of the service builds the same; only one of them
// runs the nightly report at a time, and a leader that dies mid-report loses it no lock.
func Example() {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(os.Getenv("ETCD_ENDPOINTS"), ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close() // last: the Store and the Guard release through it

	store := etcdstore.New(cli)
	defer store.Close() // after the Guard's Close

	g := guard.New(store)
	defer g.Close(context.Background())

	err = g.Do(context.Background(), "report:nightly", func(ctx context.Context) error {
		// ctx ends if the lock is lost; pass it to everything the report does.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}
