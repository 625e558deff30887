package pgstore_test

import (
	"context"
	"errors"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/pgstore"
)

// A Guard on PostgreSQL. Every instance of the service builds the same; only one of them runs
// the nightly report at a time.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // after the Guard: it releases its locks through pool

	store := pgstore.New(pool)
	if err := store.CreateTable(ctx); err != nil { // or create it by migration
		log.Fatal(err)
	}
	g := guard.New(store)
	defer g.Close(ctx)

	err = g.Do(ctx, "report:nightly", func(ctx context.Context) error {
		// ctx ends if the lock is lost; pass it to everything the report does.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}

// A table in a schema of its own, and a job that every instance runs now and then: one of
// them, at most once an hour, deletes the rows of names nobody has locked for a week.
func ExampleStore_Reclaim() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := pgstore.New(pool, pgstore.WithTable("ops.locks"))
	g := guard.New(store)
	defer g.Close(ctx)

	err = g.Do(ctx, "locks:reclaim", func(ctx context.Context) error {
		n, err := store.Reclaim(ctx, 7*24*time.Hour)
		log.Printf("reclaimed %d idle lock names", n)
		return err
	}, guard.WaitTime(0), guard.MinHold(time.Hour)) // one try; once an hour at most, across instances
	if err != nil && !errors.Is(err, guard.ErrNotAcquired) {
		log.Print(err)
	}
}
