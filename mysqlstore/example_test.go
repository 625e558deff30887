package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	_ "github.com/go-sql-driver/mysql"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/mysqlstore"
)

// A nightly report that runs on one instance of a service at a time, with its locks in the
// service's MySQL or MariaDB database.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN")) // e.g. "app:secret@tcp(db:3306)/app"
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	store := mysqlstore.New(db)
	if err := store.CreateTable(ctx); err != nil { // or run the DDL of docs/backends.md
		log.Fatal(err)
	}
	g := guard.New(store)
	defer g.Close(ctx)

	err = g.Do(ctx, "report:nightly", func(ctx context.Context) error {
		l, _ := guard.FromContext(ctx)
		fmt.Println("building the report with fence", l.Fence())
		return nil // ctx ends if the lock is lost
	}, guard.WaitTime(0))
	if err != nil {
		log.Println(err) // errors.Is(err, guard.ErrNotAcquired): another instance runs it
	}
}
