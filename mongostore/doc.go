// Package mongostore is the MongoDB lock backend for guard, on the official driver
// (go.mongodb.org/mongo-driver/v2). It works with any MongoDB the driver supports (4.4+)
// and with servers that speak its wire protocol (the tests run it against FerretDB), because
// it needs no pipeline updates, no $$NOW, no TTL index, no transactions and no change
// streams.
//
//	client, err := mongo.Connect(options.Client().ApplyURI(uri))
//	...
//	g := guard.New(mongostore.New(client.Database("app").Collection("locks")))
//
// # Schema
//
// One document per lock name, created by the first acquisition and never deleted by the
// store:
//
//	{
//	  _id:      "report:2024-06",          // the lock name
//	  owner:    "Q2ZK…",                   // token of the holder; "" when released
//	  fence:    NumberLong(42),            // +1 on every acquisition, never reset
//	  expires:  ISODate("…"),              // end of the lease, in the server's time
//	  acquired: ISODate("…"),              // when the holder took it, in the server's time
//	  host:     "worker-7",                // holder metadata, for people reading the
//	  pid:      4711,                      //   collection: host name, process id and
//	  instance: "6FJ3KQ2W…",               //   WithInstance (default: random per Store)
//	  renewal:  "665f…"                    // id of the last Extend call that renewed it
//	}
//
// A name is free when owner is "" or expires is not after the server's current time. Because
// the document stays after release, the fence keeps counting across holders: it is the fencing
// token to hand to the resources the lock protects.
//
// # Indexes
//
// None to create: every operation selects by _id, which MongoDB always indexes uniquely, and
// the uniqueness of _id is what turns a lost race into a busy answer. There is deliberately no
// TTL index: correctness never depends on MongoDB's TTL monitor (which runs once a minute and
// would delete documents, and with them their fences). An expired lock is taken over by the
// next acquisition as soon as its lease ends. One small document per distinct lock name
// remains; names built from unbounded values (request ids) therefore grow the collection, and
// an operator may delete documents whose expires is long past, at the cost of restarting
// their fences.
//
// # One command per operation
//
//   - Acquire is one findAndModify: an upsert whose filter matches the name only when it is
//     free or expired; it increments fence, sets owner, expiry and metadata, and returns the
//     new fence. When the name is held the filter matches nothing and the upsert's insert
//     fails on the duplicate _id: that is the busy answer, a *guard.BusyError. Its Remaining
//     is 0 (unknown): reading the holder's expiry would take a second round trip.
//   - Extend is one unordered bulk write (one update command) for the whole batch, each update
//     checked by _id, owner and "not expired". When fewer documents match than leases were
//     sent, one read of the batch's documents tells which leases were extended.
//   - Release is one update checked the same way. It clears owner (or, with keep > 0, moves
//     the expiry to now+keep under the same owner) and keeps the document.
//
// A lock whose lease ran out can be neither extended nor released by its old holder, so a
// late release cannot free the lock of whoever took the name next.
//
// # Whose clock
//
// Expiry is judged against one clock, the server's, so that skew between application hosts
// does not matter. Without $$NOW (FerretDB has no pipeline updates) the store cannot ask the
// server for its time inside an update, so it estimates it: it runs hello on the primary
// (every store must measure the same clock), whose reply carries the server's localTime,
// takes the midpoint of the round trip as the moment that time was read, and from then on
// adds the local monotonic clock's elapsed time. The estimate is
// made by the first operation (or SyncClock) and redone by the first operation after
// WithClockRefresh (default 1 min); each of those operations costs one more round trip.
//
// What skew can still do: the estimate is off by up to half the round trip of its hello plus
// half a millisecond (BSON dates have millisecond resolution), plus how far the two clocks
// drift apart until the next refresh (ppm: microseconds per minute). Two stores whose estimates
// err in opposite directions judge the same expiry that much apart, so a lease can end that
// much earlier than its holder thinks. A Guard's lock context ends 1% of the lease plus a few
// milliseconds before the lease, which covers the estimate on a network whose round trips stay
// within a few milliseconds. A server whose wall clock is stepped (a manual date change, an NTP
// step rather than a slew), or a failover to a member whose clock differs, moves every expiry
// by the step at once, as it would with $$NOW. ClockOffset reports the current estimate and its uncertainty.
//
// # Durability
//
// Writes use write concern majority unless WithWriteConcern says otherwise: an acquisition is
// confirmed only once a majority of a replica set has it, so a failover cannot hand the same
// name, with the same fence, to a second owner. With w:1, a primary that crashes before
// replicating an acquisition comes back (or is replaced) without it. Reads go to the primary
// with read concern local.
//
// # Waiting
//
// The store implements no guard.Notifier: FerretDB has no change streams, and a poll would cost
// round trips on every waiter. A Guard on this store wakes its own waiters at once when one of
// its locks is released, and waiters for a lock held in another process re-try with a jittered
// backoff (10 ms doubling up to 1 s): a release in another process is noticed within about a
// second, and a crashed holder's lock is taken soon after its lease ends.
package mongostore
