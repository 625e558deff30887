// Package mongostore is the MongoDB backend of guard, on the official driver
// (go.mongodb.org/mongo-driver/v2): a guard.Backend and guard.Inspector that keeps one
// document per lock name in a collection.
//
//	g := guard.New(mongostore.New(client.Database("app").Collection("locks")))
//
// Acquire is one findAndModify (a conditional upsert), a renewal batch one bulk update, release
// one update; writes use write concern majority by default. Expiry is judged on the server's
// clock, which the store estimates from hello. It needs no TTL index, no pipeline updates, no
// transactions and no change streams, so it also runs on servers that speak MongoDB's wire
// protocol, such as FerretDB. It has no release notifications: waiters in other processes
// re-try with a backoff. Reclaim deletes the documents of names idle for long.
//
// docs/backends.md describes the schema, the commands, the clock estimate and the costs;
// docs/semantics.md what each fault does.
package mongostore
