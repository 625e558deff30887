// Package redisstore is the Redis backend of guard: a guard.Backend, guard.Notifier,
// guard.Inspector, guard.Sharing (semaphores, read-write locks) and guard.Batcher (AcquireAll)
// over a go-redis v9 client — a single node (*redis.Client), a Redis Cluster
// (*redis.ClusterClient) or a Sentinel-managed master (redis.NewFailoverClient).
//
//	g := guard.New(redisstore.New(redis.NewClient(&redis.Options{Addr: addr})))
//
// Each lock is a hash key with the lease as its expiry and a fence key beside it, in one
// Cluster hash slot; acquire, extend and release are one Lua script each (one round trip), a
// renewal batch one pipeline per master, and the acquisitions and releases of concurrent
// callers share pipelines (WithPipelines). Shared holders (permits, readers) are kept beside
// the lock in two more keys of its slot; AcquireAll takes the names of one slot in one script. Releases are announced over pub/sub, one subscription
// per Guard. Fences are floored by the server's clock, so they keep increasing after the server
// lost its data.
//
// The first Acquire of a Store refuses a server that may evict keys (ErrEvictingServer; see
// AllowEviction). WithReplicaAcks makes writes wait for replicas, so that a failover cannot
// lose a grant.
//
// The [backends guide] describes the keys, the scripts, and what Redis can and cannot
// promise; the [semantics guide] what each fault does.
//
// [backends guide]: https://github.com/guardlock/guard/blob/main/docs/backends.md
// [semantics guide]: https://github.com/guardlock/guard/blob/main/docs/semantics.md
package redisstore
