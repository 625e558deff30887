// Package memstore is the in-process lock backend: the embedded default when no server is
// configured. Several Guards sharing one Store behave like service instances sharing a Redis:
// mutual exclusion, fences, leases and release notifications all hold between them. Nothing
// leaves the process, so it serves tests, examples and single-process deployments; use a
// server backend (redisstore, mongostore, pgstore, mysqlstore) to coordinate processes.
//
//	store := memstore.New()
//	g := guard.New(store) // every Guard on store shares its locks, as instances share a server
//
// A Store keeps a wait queue per name, as redisstore does: a free name goes to the caller
// that has waited longest (a release hands it over at once), and a newcomer does not take it
// past waiting callers.
//
// A Store keeps state only for names that are held or waited for: a release forgets the
// name, and names whose lease ran out are swept as the Store is used, so a service that locks
// one name per request does not grow. Fences come from one counter for the whole Store, so
// they strictly increase per name although nothing is kept per name.
package memstore
