// Package redisstore is the Redis backend of guard: a guard.Backend and guard.Notifier over a
// go-redis v9 client — a single node (*redis.Client), a Redis Cluster (*redis.ClusterClient)
// or a Sentinel-managed master (redis.NewFailoverClient).
//
// # Keys
//
// A lock named name lives in two keys that share one hash tag, so that in a Cluster they sit
// in one slot and one script can touch both:
//
//	<prefix>{<name>}        the owner's token, with the lease as its expiry (PX)
//	<prefix>{<name>}:fence  the fence counter, INCR on every acquisition; never expires and is
//	                        never deleted, so fences keep increasing across releases
//
// The prefix is "guard:" unless WithPrefix says otherwise. Release notifications are
// published on <prefix>{<name>}:released.
//
// # Round trips
//
// Acquire, Release and Extend of one lock are one EVALSHA each (acquire.lua, release.lua,
// extend.lua, embedded in the package). Extend of many locks sends all of them in one
// pipeline, which go-redis splits into one round trip per Cluster node. When a server has
// lost its script cache (a restart, SCRIPT FLUSH) the Store sends the script itself with
// EVAL and the server caches it again.
//
// # Notifications
//
// Subscribe opens one go-redis PubSub for all the waiters of a Guard, read by one goroutine,
// with one channel per watched name. A release that frees a name publishes on its channel
// (plain PUBLISH, which a Cluster delivers on every node). If the PubSub connection breaks,
// go-redis reconnects and subscribes again; a notification sent in between is lost, and the
// waiter then tries again when the holder's lease ends.
package redisstore
