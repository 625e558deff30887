package guard

import (
	"context"
	"time"
)

// Backend is the storage contract every lock backend implements. It is deliberately small:
// one attempt to take a name, a batched extension, and an owner-checked release. Everything
// else — waiting, the watchdog, reentrancy, contexts, telemetry — lives in the Guard.
//
// Every method acts only for the owner identified by a token: Extend and Release never touch a
// lock held under another token. Each uncontended call is expected to be one network round
// trip. Methods return bare causes (ErrNotHeld, a *BusyError, the driver's error): the Guard
// adds the operation and the lock name.
//
// Package locktest is the conformance suite that proves a Backend keeps this contract; every
// store of this module runs it.
type Backend interface {
	// Acquire makes one attempt to take r.Name for r.Token, with a lease of r.TTL measured
	// by the backend's clock. On success it returns the fence: a number that strictly
	// increases with every successful acquisition of the name on this backend, for all time.
	// Release never resets it, and neither does losing the backend's per-name state (a
	// restart without persistence, eviction, reclaiming idle names): where that state can
	// vanish, the fence is floored by the backend's clock (see docs/semantics.md).
	//
	// Acquire is idempotent for its own token: when r.Token already holds the name — a
	// retry of an attempt whose reply was lost — it succeeds again, sets the lease to r.TTL
	// from now, and returns a fence no lower than the one the first attempt took.
	//
	// When another owner holds the name, Acquire returns a *BusyError (which matches
	// ErrNotAcquired) carrying how long the name stays taken — the holder's remaining lease,
	// or what is left of a MinHold window — when the backend knows it. Any other error is a
	// backend failure and must not match ErrNotAcquired.
	//
	// The backend records r.Instance and r.Label with the lock, and the time it granted it,
	// in the same round trip, for Inspector (see Request for what it may change in them).
	//
	// A backend may keep a wait queue per name (see Request.Wait): then a free name goes to
	// the caller that has waited longest, across all processes, and a caller that did not
	// wait is busy while others do.
	Acquire(ctx context.Context, r Request) (fence uint64, err error)

	// Extend sets the lease of each lock in leases to its TTL, measured from now, if the lock
	// is still held by its token. It returns one error per lease, in order: nil when
	// extended, ErrNotHeld (or an error matching it) when the name is free or held by
	// another token, or a backend failure. A backend should send the whole batch in as few
	// round trips as it can (the watchdog renews the locks of a Guard in one call per tick).
	//
	// The batch acts as the leases would one after another: when it names one lock — name and
	// token — more than once, the last of those leases stands, and each is answered as
	// extended.
	Extend(ctx context.Context, leases []Lease) []error

	// Release gives name up if token still holds it, and returns ErrNotHeld (or an error
	// matching it) when it does not. A release that frees the name should tell waiters in
	// other processes (see Notifier).
	//
	// With keep > 0 the name is not freed: it stays taken for keep more (the rest of a
	// MinHold window), under an owner that no token matches, so that a renewal of token
	// still in flight cannot shorten the window; waiters should be told, so that they learn
	// when the window ends.
	//
	// A backend with a wait queue hands a name it frees to the first live waiter at once —
	// the waiter holds it from then on, with a new fence, under the token of its last
	// request, for that request's TTL or its place in the queue (BusyError.Queued), whichever
	// is shorter, so that a waiter that died holds it no longer — and tells it in a Notice.
	// Release also takes token out of the name's queue when token is waiting rather than
	// holding (a caller that gave up); it then returns ErrNotHeld.
	Release(ctx context.Context, name, token string, keep time.Duration) error
}

// Request is one attempt to take a lock.
type Request struct {
	Name string // the lock name; CheckName accepts it
	// Token identifies the owner: random, at least 128 bits, the same for every attempt of
	// one acquisition.
	Token string
	TTL   time.Duration // the lease, at least 10 ms
	// Instance identifies the process that asks, for operators (WithInstance: a host name
	// and process id by default).
	Instance string
	// Label is the acquisition's Label, or "".
	//
	// Instance and Label are for people, and hold whatever bytes the caller gave. A backend
	// never fails an acquisition for them. It keeps them as given, or — when its server
	// keeps text — with each NUL byte and each run of bytes that is not valid UTF-8 replaced
	// by U+FFFD, and it may cut them to MinMetadataLen characters or more.
	Label string
	// Wait tells a backend with a wait queue that the caller will wait if the name is busy:
	// the backend queues Token (or keeps its place, refreshed by every request it sends) and
	// says so in BusyError.Queued. A caller that makes one attempt leaves it false.
	Wait bool
	// Attempt numbers the requests of one acquisition: 1, 2, … A backend with a wait queue
	// keeps the number of the request that last refreshed a waiter's place, and says it in
	// the Notice of a hand-over (Notice.Attempt): the Guard counts the handed-over lease from
	// when that request was sent.
	Attempt int
	// Shared asks a backend that implements Sharing for a shared hold: several shared
	// holders hold the name at once — at most Limit of them when Limit > 0 (a semaphore's
	// permits), any number when Limit is 0 (the readers of a read-write lock) — while no
	// exclusive holder (Shared false: a mutex, a writer) does. A shared request is granted
	// when no exclusive holder holds the name, fewer than its own Limit shared holders do
	// (a MinHold window kept after a release counts as a holder), and no waiter queued
	// before it, shared or exclusive, waits: so a waiting writer is not passed by readers
	// that came after it. Every grant, shared or not, has its own token and fence; the
	// fences of a name keep increasing across both. A backend without Sharing is never sent
	// a shared request.
	Shared bool
	Limit  int
	// Value is what the holder publishes with its lock — an election's leader value — for
	// Inspect (LockInfo.Value). A backend keeps it as it keeps Label.
	Value string
}

// Batcher is implemented by backends that can try to take several names at once, all or
// none, in fewer round trips than one per name (one per Redis Cluster slot, say).
// Guard.AcquireAll sends its names to it first, and takes them one by one, in canonical
// order, only when they are not all free.
type Batcher interface {
	// AcquireAll makes one attempt to take every request's name, as Acquire does for each,
	// and grants all of them or none. It returns a fence per request, in order, or the first
	// busy answer (a *BusyError), or a backend failure; in both of the last cases it holds
	// none of the names. A request whose token holds its name already is a retry: it
	// succeeds again, as Acquire's would.
	AcquireAll(ctx context.Context, reqs []Request) ([]uint64, error)
}

// Sharing is implemented by backends that honour Request.Shared and Request.Limit: the ones
// Guard.Semaphore and Guard.RWMutex accept. Extend and Release act on one holder, by its
// token, as they do for an exclusive lock; a release hands the slot it frees to the first
// waiters that fit; Inspect reports one holder of a shared name (the newest) and how many
// there are (LockInfo.Holders); List reports each holder; ForceRelease with a fence frees
// that holder, with 0 every holder.
type Sharing interface {
	// SharedLocks tells that the backend implements Sharing; it does nothing.
	SharedLocks()
}

// MinMetadataLen is the fewest characters of Request.Instance, Request.Label and
// Request.Value that a backend keeps: the length of a SQL column that holds them.
const MinMetadataLen = 255

// Lease names one held lock to extend.
type Lease struct {
	Name  string        // the lock name
	Token string        // the owner token the lock must still hold
	TTL   time.Duration // the new lease, from now
}

// Notifier is implemented by backends that can tell waiters, in this process and others,
// that a name may have become free. A Guard opens one Subscription the first time one of its
// callers waits, shares it between all its waiters, and closes it in Close. Backends without
// it are still correct: waiters then re-try with a backoff (see docs/semantics.md).
type Notifier interface {
	// Subscribe opens a subscription that calls notify for each watched name that may have
	// become free. notify must not block; it may be called from any goroutine.
	Subscribe(notify func(Notice)) (Subscription, error)
}

// Notice tells a Guard that a watched name may have become free.
type Notice struct {
	Name string
	// Token is the token of the lock whose release sent the notice, when the backend knows
	// it: the Guard that released that lock has already woken one of its own waiters. It is
	// empty when the backend only knows that something may have changed — after a
	// subscription lost its connection and watches again, it sends one notice per watched
	// name, because a release may have happened while it was away.
	Token string
	// Next, when set, is the waiter the backend handed the name to (a backend with a wait
	// queue): it holds the lock already, with Fence, and the Guard that waits with that token
	// takes it without another request.
	Next  string
	Fence uint64
	// Lease, with Next, is the lease the backend gave Next, when it knows it: the other
	// Guards' waiters ask again when it could run out (a waiter whose process died holds
	// the name no longer than that).
	Lease time.Duration
	// Attempt, with Next, is Request.Attempt of the request that last refreshed Next's
	// place before the hand-over, or 0 when the backend does not know it (the Guard then
	// confirms the lock with a round trip before it trusts it).
	Attempt int
}

// Subscription is a live stream of notices for a set of names.
type Subscription interface {
	// Watch adds name to the watched set. It returns once the backend confirms the watch,
	// so that a release that happens after Watch returns is reported.
	Watch(ctx context.Context, name string) error
	// Unwatch removes name from the watched set.
	Unwatch(name string)
	// Close ends the subscription and waits for its goroutines.
	Close() error
}

// Partitioned is implemented by a backend whose locks live on several servers, such as a
// Redis Cluster. The watchdog renews the locks of each partition in a call of its own, so that
// one slow or failing server delays only the renewals of the locks it holds.
type Partitioned interface {
	// Partition returns the server that holds name now, as a string that is equal for names
	// on the same server; "" when it cannot tell.
	Partition(name string) string
}

// Inspector is implemented by backends that let operators see and break locks: every store of
// this module does. cmd/guardctl is built on it.
type Inspector interface {
	// Inspect returns what the backend knows of name: its holder, or that it is free (with
	// its last fence, when the backend still has it).
	Inspect(ctx context.Context, name string) (LockInfo, error)

	// List returns held locks whose names start with prefix, at most limit of them (the
	// backend may return fewer), and a cursor for the next page: "" when there is none. Pass
	// "" as cursor for the first page. Paging never misses a lock that is held from the first
	// page to the last. Pages come in an order of the backend's choosing; a backend that
	// pages through a hash table (Redis SCAN) may return a name again when the table is
	// resized between pages, and callers that need each name once skip repeats.
	List(ctx context.Context, prefix, cursor string, limit int) (page []LockInfo, next string, err error)

	// ForceRelease frees name — held, or kept for a MinHold window — when it is held with
	// fence, the holder an operator looked at; fence 0 frees it whoever holds it. The check
	// and the release are one atomic step on the backend, so that a lock taken after the
	// caller looked is never broken. The name keeps its fence, and waiters are told as by a
	// Release (with a Notice without a token: no Guard released it itself); a backend with a
	// wait queue hands the name to its first live waiter. The holder's next renewal finds the
	// lock gone and its context ends with ErrLockLost; the next acquisition gets a higher
	// fence, so a resource that checks fences rejects the old holder's late writes.
	//
	// It returns ErrNotHeld (or an error matching it) when name is free, and a
	// *ChangedHandsError, which says the fence it found, when name is held with another
	// fence: nothing is released then.
	ForceRelease(ctx context.Context, name string, fence uint64) error
}

// LockInfo is what an Inspector reports of one lock name.
type LockInfo struct {
	Name string
	// Held reports whether the name is taken now. When false, the fields below describe
	// the last holder, as far as the backend still knows it.
	Held bool
	// Kept reports a lock that its holder released but whose MinHold window has not ended:
	// the name stays taken for Remaining, and no owner can extend or release it.
	Kept       bool
	Fence      uint64        // the holder's fence; for a free name, the last one given (0: unknown)
	Instance   string        // who took it (Request.Instance)
	Label      string        // the Label of the acquisition
	Value      string        // the Value the holder published (Request.Value)
	Shared     bool          // the holder holds the name shared (Request.Shared)
	Holders    int           // how many hold the name now: 1, or more for a shared name
	AcquiredAt time.Time     // when the backend granted it, by the backend's clock
	Remaining  time.Duration // how long it stays taken, by the backend's clock; 0 when free
	Waiting    int           // callers queued for the name, where the backend keeps a queue
}
