// Package etcdstore is the etcd backend of guard: a guard.Backend, guard.Notifier,
// guard.Inspector, guard.Sharing and guard.Batcher over an etcd v3 client
// (go.etcd.io/etcd/client/v3). etcd keeps every lock
// in its Raft log, so a grant survives the loss of any minority of members: a leader that
// dies, a member cut off from the others. It is the backend for locks that must not be lost
// at a failover.
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"etcd-0:2379", "etcd-1:2379", "etcd-2:2379"}})
//	...
//	store := etcdstore.New(cli)
//	defer store.Close() // after the Guard's Close
//	g := guard.New(store)
//
// The package is a module of its own (github.com/guardlock/guard/etcdstore), so that the etcd
// client and gRPC reach only the builds that use etcd.
//
// Each caller of a name, holding or waiting, is one key under the name's range; the key with
// the lowest create revision holds the lock, the others wait behind it in the order etcd
// wrote them — first come, first served across processes — and the holder's create revision
// is the fence. A release deletes the holder's key, which hands the name to the next key at
// that revision, and the waiter's Guard hears of it by its watch. Acquire, Release and a
// renewal batch are one request each.
//
// Shared holds (semaphore permits, readers) are keys too, whose record says so: the name's
// holders are then its first keys in create-revision order that fit — every shared key up to
// the first exclusive one, or the first that would make more holders than its own limit — so
// no caller is served past an earlier one, and a waiting writer holds later readers back.
// AcquireAll takes names that have no key at all in one transaction.
//
// A guard TTL maps to etcd leases this way. etcd leases count whole seconds (at least the
// server's minimum: ⌈1.5 election timeouts⌉, 2 s by default) and expire only as a whole, so
// a Store puts each key on a lease shared by its keys of the same kind and TTL in whole
// seconds, c = ⌈TTL⌉: the lease is granted for c + max(1 s, ⌈c/10⌉) and kept alive by the
// Store's session, so that every key put on it has at least its TTL left on the server. The
// key itself ends at its TTL — the Store deletes it then, owner-checked — and the Guard's local
// deadline (start + TTL − drift) is unchanged, always before the server could drop the key. If
// the process dies, hangs or is cut off from the cluster, nobody keeps its leases alive and
// etcd deletes its keys when they run out: a crashed holder blocks its name for at most
// c + max(1 s, ⌈c/10⌉) after its last keep-alive, plus an election timeout for each leader
// change meanwhile (a new leader extends every lease by that). A lock renewal costs no
// write: a batch is one look at its lease's keys, which confirms every lock on it at once.
//
// etcd leaves nothing behind: a name has keys only while it is held or waited for, and the
// fence needs no per-name state (etcd's revision never goes back), so there is nothing to
// reclaim.
//
// The [backends guide] compares it with the other backends: what a failover can do, and
// what each operation costs.
//
// [backends guide]: https://github.com/guardlock/guard/blob/main/docs/backends.md
package etcdstore
