// Package mysqlstore is the MySQL and MariaDB lock backend of guard, on database/sql with
// github.com/go-sql-driver/mysql: a guard.Backend and guard.Inspector for MySQL 8 and
// MariaDB 10.6+.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	...
//	store := mysqlstore.New(db)
//	if err := store.CreateTable(ctx); err != nil { … } // or run the DDL from docs/backends.md
//	g := guard.New(store)
//
// Each lock name is one row of one table (guard_locks unless WithTable says otherwise),
// holding the owner's token, the fence, the lease's end and who took it. Acquire, Release
// and a batched Extend are one statement and one round trip each; the database's clock,
// read inside each statement, decides when a lease ends. Releasing keeps the row, so fences
// keep increasing; Reclaim deletes rows of names that have been free for a long time.
//
// MySQL has no notifications, so the Store is not a guard.Notifier: a waiter in another
// process re-tries when the holder's lease would end, and with a backoff of at most a
// second. See docs/backends.md for the schema, the statements, the clocks and the costs.
package mysqlstore
