// Package mysqlstore is the MySQL and MariaDB lock backend of guard, on database/sql with
// github.com/go-sql-driver/mysql: a guard.Backend, guard.Inspector, guard.Sharing
// (semaphores, read-write locks) and guard.Batcher (AcquireAll) for MySQL 8 and MariaDB
// 10.6+.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	...
//	store := mysqlstore.New(db)
//	if err := store.CreateTable(ctx); err != nil { … } // the table and its procedures
//	g := guard.New(store)
//
// Locks live in one table (guard_locks unless WithTable says otherwise): a row per name,
// keeping its fence, and a row per holder — its token, fence, lease and who took it. Acquire,
// AcquireAll, Release and ForceRelease are one CALL of a stored procedure each, and a batched
// Extend one UPDATE: one round trip each; the database's clock, read inside each statement,
// decides when a lease ends. Names' rows stay after release, so fences keep increasing;
// Reclaim deletes rows of names that have been free for a long time.
//
// MySQL has no notifications, so the Store is not a guard.Notifier: a waiter in another
// process re-tries when the holder's lease would end, and with a backoff of at most a
// second. An exclusive request that waits leaves a mark that keeps shared requests out, so
// that readers do not starve a writer. The [backends guide] has the schema, the procedures,
// the migration, the clocks and the costs.
//
// [backends guide]: https://github.com/guardlock/guard/blob/main/docs/backends.md
package mysqlstore
