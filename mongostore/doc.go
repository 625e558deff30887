// Package mongostore is the MongoDB backend of guard, on the official driver
// (go.mongodb.org/mongo-driver/v2): a guard.Backend, guard.Inspector and guard.Sharing that
// keeps one document per lock name in a collection — its exclusive holder, or its shared
// holders (semaphore permits, readers) in an embedded document.
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
// The [backends guide] describes the schema, the commands, the clock estimate and the costs;
// the [semantics guide] what each fault does.
//
// [backends guide]: https://github.com/guardlock/guard/blob/main/docs/backends.md
// [semantics guide]: https://github.com/guardlock/guard/blob/main/docs/semantics.md
package mongostore
