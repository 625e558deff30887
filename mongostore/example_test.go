package mongostore_test

import (
	"context"
	"errors"
	"log"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/mongostore"
)

// ExampleNew runs a nightly report at most once at a time across every instance of a
// service. It needs a server, so it has no output to check.
func ExampleNew() {
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("MONGODB_URI")))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)

	store := mongostore.New(client.Database("app").Collection("locks"))
	// Optional: measure the server's clock now rather than on the first lock operation.
	if err := store.SyncClock(ctx); err != nil {
		log.Fatal(err)
	}

	g := guard.New(store, guard.WithInstance(os.Getenv("HOSTNAME")))
	defer g.Close(ctx)

	err = g.Do(ctx, "report:nightly", func(ctx context.Context) error {
		l, _ := guard.FromContext(ctx)
		log.Printf("building the report under fence %d", l.Fence())
		return nil // ctx ends if the lock is lost: stop the work then
	}, guard.WaitTime(0), guard.MinHold(time.Hour)) // one attempt; run at most hourly
	switch {
	case errors.Is(err, guard.ErrNotAcquired):
		log.Print("another instance has it")
	case err != nil:
		log.Fatal(err)
	}
}
