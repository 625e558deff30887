// Package pgstore is the PostgreSQL backend of guard: a guard.Backend, guard.Notifier and
// guard.Inspector over a pgx v5 pool.
//
// Locks live in one table, a row per name (CreateTable, or the DDL in docs/backends.md).
// Acquire, Release and a batch of Extend are one SQL statement and one round trip each, and
// the database's clock, now(), decides every expiry; the statements are the files in sql/.
// A release sends pg_notify in the same statement, and a Subscription LISTENs on one
// connection of its own, so a waiter in another process wakes as soon as the release
// commits. Rows stay after release, so fences keep counting; Reclaim deletes rows that have
// been free for long.
//
// See docs/backends.md for the schema, the clocks, the costs and reclaiming.
package pgstore
