// Package pgstore is the PostgreSQL backend of guard: a guard.Backend, guard.Notifier,
// guard.Inspector, guard.Sharing (semaphores, read-write locks) and guard.Batcher
// (AcquireAll) over a pgx v5 pool.
//
//	pool, err := pgxpool.New(ctx, "postgres://app:secret@db/app")
//	...
//	store := pgstore.New(pool)
//	if err := store.CreateTable(ctx); err != nil { … } // guard_locks and its functions
//	g := guard.New(store)
//
// Locks live in one table — a row per name, keeping its fence, and a row per holder and per
// waiter — which must exist before the first lock, with its PL/pgSQL functions: create both
// with CreateTable (which also migrates a table of the previous layout), or with the DDL in
// sql/. Acquire, AcquireAll, Release and ForceRelease are one function call each, Extend one
// UPDATE per batch: one round trip each; the database's clock, now(), decides every expiry.
// Waiters queue in the table; a release hands the name to the first waiters that fit and
// tells each with pg_notify in the same transaction, and a Subscription LISTENs on one
// connection of its own, so a waiter in another process holds the lock as soon as the
// release commits. Names' rows stay after release, so fences keep counting; Reclaim deletes
// rows that have been free for long.
//
// The [backends guide] has the schema, the functions, the migration, the clocks, the costs
// and reclaiming.
//
// [backends guide]: https://github.com/guardlock/guard/blob/main/docs/backends.md
package pgstore
