package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

// DefaultPrefix is the prefix of every key and channel of a Store unless WithPrefix sets
// another.
const DefaultPrefix = "guard:"

// fenceRetention is how long a fence key outlives the lease that last set it: fences count
// up in it while a name is in use, and fall back on the server's clock once it is gone.
const fenceRetention = time.Minute

// boxed is a script argument kept boxed with the value it was boxed from.
type boxed struct {
	from any // a string or an int64
	arg  any
}

// box returns v as a script argument, boxed once while it stays the same as at p.
func box[T comparable](p *atomic.Pointer[boxed], v T) any {
	if b := p.Load(); b != nil {
		if last, ok := b.from.(T); ok && last == v {
			return b.arg
		}
	}
	var arg any = v
	p.Store(&boxed{from: arg, arg: arg})
	return arg
}

// Script arguments that never change, boxed once.
var (
	retentionArg any = millis(fenceRetention)
	zeroArg      any = int64(0)
	exclusiveArg any = int64(-1) // acquire.lua's ARGV[9] for an exclusive hold
)

// Sentinel errors. The errors of a Store wrap them, or return the driver's error.
var (
	// ErrUnexpectedReply reports a script reply the Store cannot read: a server that does not
	// run the Store's scripts as written, or keys written by something else.
	ErrUnexpectedReply = errors.New("redisstore: unexpected reply")
	// ErrSubscriptionClosed reports a Watch on a closed Subscription.
	ErrSubscriptionClosed = errors.New("redisstore: subscription closed")
	// ErrEvictingServer reports a server whose maxmemory-policy may evict keys: it could
	// drop a held lock and hand it to a second owner. See AllowEviction.
	ErrEvictingServer = errors.New("redisstore: the server may evict keys (maxmemory-policy is not noeviction)")
	// ErrNotReplicated reports a write that fewer replicas acknowledged than
	// WithReplicaAcks asks for: a failover could lose it.
	ErrNotReplicated = errors.New("redisstore: not acknowledged by enough replicas")
)

// The scripts, one per operation. acquire.lua, acquire_all.lua, release.lua and force.lua
// start with lock.lua, the functions they share.
var (
	//go:embed lock.lua
	lockSrc string

	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = newScript(lockSrc + acquireSrc)

	//go:embed acquire_all.lua
	acquireAllSrc    string
	acquireAllScript = redis.NewScript(lockSrc + acquireAllSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)

	//go:embed release.lua
	releaseSrc    string
	releaseScript = newScript(lockSrc + releaseSrc)

	//go:embed inspect.lua
	inspectSrc    string
	inspectScript = redis.NewScript(inspectSrc)

	//go:embed force.lua
	forceSrc    string
	forceScript = redis.NewScript(lockSrc + forceSrc)
)

// scripts are every script of a Store, for loading them ahead.
var scripts = []*redis.Script{acquireScript.Script, acquireAllScript, extendScript, releaseScript.Script, inspectScript, forceScript}

// Store is a guard.Backend, guard.Notifier, guard.Inspector, guard.Sharing and guard.Batcher
// on Redis. It is safe for concurrent use. It does not own its client: closing the client is
// the caller's job, after the Guard using the Store is closed.
type Store struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // client, when it is a cluster client
	prefix  string

	allowEviction bool
	acks          int           // replicas that must acknowledge a write; 0: none
	ackTimeout    time.Duration // how long WAIT waits for them
	queueTimeout  time.Duration // how long a waiter keeps its place after its last request, at most

	// The last instance, label, value, lease, place and limit of an acquisition, boxed as script
	// arguments: a Guard sends the same ones again and again, and boxing each anew would cost
	// allocations on the path of every lock.
	instanceArg, labelArg, valueArg, ttlArg, placeArg, limitArg atomic.Pointer[boxed]
	keyCache                                                    keyCache // the boxed keys of the names used last (call.go)

	// checked is closed once the server's eviction policy has been found safe (or the
	// check is off); checkMu serializes the checks until then.
	checkMu sync.Mutex
	checked chan struct{}

	// subs are the Store's open subscriptions: a hand-over by a release of this Store reaches
	// them at once, without waiting for its pub/sub message.
	subsMu sync.Mutex // protects subs
	subs   map[*subscription]struct{}

	// Health checks of a Subscription's connection: idleCheck and pongTimeout in notify.go,
	// fields so that tests can shorten them.
	idleCheck, pongTimeout time.Duration

	// The lock path's concurrent scripts, sent together (batch.go): batch on a single node
	// or a Sentinel-managed master; on a Cluster, batches holds a *batcher per master address,
	// and batch only the number of lanes.
	batch   batcher
	batches sync.Map
}

var (
	_ guard.Backend     = (*Store)(nil)
	_ guard.Notifier    = (*Store)(nil)
	_ guard.Inspector   = (*Store)(nil)
	_ guard.Partitioned = (*Store)(nil)
	_ guard.Sharing     = (*Store)(nil)
	_ guard.Batcher     = (*Store)(nil)
)

// SharedLocks tells that a Store grants shared holds (guard.Sharing): semaphores' permits and
// readers, kept beside the exclusive lock in keys of the same Cluster slot (see
// docs/backends.md).
func (*Store) SharedLocks() {}

// Option configures a Store. Pass options to New, which validates them.
type Option func(*options)

type options struct {
	prefix        string
	allowEviction bool
	acks          int
	ackTimeout    time.Duration
	queueTimeout  time.Duration
	pipelines     int
}

// DefaultQueueTimeout is how long a waiter keeps its place in a name's queue after its last
// request, at most, unless WithQueueTimeout says otherwise.
const DefaultQueueTimeout = 5 * time.Second

// WithQueueTimeout sets how long a waiter keeps its place in a name's wait queue after its last
// request, at most: never longer than the lease the waiter asked for (watchdog.Place), so that
// a waiter whose process died or stopped holds up a name — by its place, or by the lease a
// hand-over gives it — no longer than a holder that asked for that lease. A waiting Guard asks
// again within half of its place. Default: DefaultQueueTimeout (5 s). d must be at least 10 ms.
func WithQueueTimeout(d time.Duration) Option {
	return func(o *options) { o.queueTimeout = d }
}

// WithPrefix sets the prefix of every key and channel of the Store, so that several
// applications can share one Redis. Default: DefaultPrefix ("guard:"). p must not contain
// '{' or '}': the Store puts the lock name in a Cluster hash tag right after the prefix.
func WithPrefix(p string) Option {
	return func(o *options) { o.prefix = p }
}

// AllowEviction lets the Store run on a server whose maxmemory-policy may evict keys (any
// policy but noeviction). This is unsafe: under memory pressure the server may drop a held
// lock — and, under an allkeys policy, its fence counter — and hand the name to a second owner
// while the first one's context is live. Without it, the first Acquire checks the policy
// (INFO memory, on every master) and fails with ErrEvictingServer. Use it only for a server
// that never reaches its maxmemory, or locks whose loss does no harm.
func AllowEviction() Option {
	return func(o *options) { o.allowEviction = true }
}

// WithReplicaAcks makes every acquisition, renewal and MinHold release wait until n replicas
// acknowledge it (Redis WAIT, sent in the same round trip), for up to timeout; a write that
// fewer replicas acknowledge fails with ErrNotReplicated, and an acquisition that fails so is
// given back. This keeps a lock from being lost when a Sentinel or Cluster failover promotes a
// replica that had not received it yet — at the cost of a replica's round trip on every write,
// and of no lock at all while fewer than n replicas answer. Default: 0, no waiting: a failover
// can then lose the latest acquisitions (see docs/semantics.md). n must not be negative, and
// timeout must be positive when n > 0.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return func(o *options) { o.acks, o.ackTimeout = n, timeout }
}

// New returns a Store that keeps locks in the Redis that client talks to: a *redis.Client, a
// *redis.ClusterClient, or a failover client from redis.NewFailoverClient. It does no I/O. It
// panics when client is nil or an option is invalid.
func New(client redis.UniversalClient, opts ...Option) *Store {
	if client == nil {
		panic("guard/redisstore: New: nil client")
	}
	o := options{prefix: DefaultPrefix, queueTimeout: DefaultQueueTimeout, pipelines: DefaultPipelines}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if strings.ContainsAny(o.prefix, "{}") {
		panic(fmt.Sprintf("guard/redisstore: WithPrefix(%q): the prefix must not contain '{' or '}'", o.prefix))
	}
	if o.acks < 0 || (o.acks > 0 && o.ackTimeout <= 0) {
		panic(fmt.Sprintf("guard/redisstore: WithReplicaAcks(%d, %v): n must not be negative, and the timeout must be positive", o.acks, o.ackTimeout))
	}
	if o.pipelines < 0 {
		panic(fmt.Sprintf("guard/redisstore: WithPipelines(%d): must not be negative", o.pipelines))
	}
	if o.queueTimeout < 10*time.Millisecond {
		panic(fmt.Sprintf("guard/redisstore: WithQueueTimeout(%v): must be at least 10ms", o.queueTimeout))
	}
	s := &Store{
		client: client, prefix: o.prefix,
		allowEviction: o.allowEviction, acks: o.acks, ackTimeout: o.ackTimeout,
		queueTimeout: o.queueTimeout,
		checked:      make(chan struct{}),
		subs:         make(map[*subscription]struct{}),
		idleCheck:    idleCheck, pongTimeout: pongTimeout,
	}
	s.cluster, _ = client.(*redis.ClusterClient)
	s.batch.lanes = o.pipelines
	s.keyCache.seed = maphash.MakeSeed()
	if s.allowEviction {
		close(s.checked)
	}
	return s
}

// Suffixes of a lock's other keys and of its channel, after its lock key.
const (
	fenceSuffix   = ":fence"
	queueSuffix   = ":queue"
	waitersSuffix = ":waiters"
	sharedSuffix  = ":shared"
	holdersSuffix = ":holders"
	channelSuffix = ":released"
)

// lockKey returns the key that holds name's lock: <prefix>{<name>}.
//
// Redis Cluster hashes only the hash tag of a key: the bytes between its first '{' and the
// first '}' after it, when there is at least one. The prefix has no braces, so that '{' is
// the one before the name, and the '}' that ends the tag is either inside the name (a name
// may contain braces) or the one after it. Either way the tag lies within <prefix>{<name>},
// which the fence key and the channel start with too: a lock's keys always share a slot.
//
// One case needs care: a name that starts with '}' would give an empty tag "{}", and Redis
// then hashes the whole key, sending the fence key elsewhere. Such names get a NUL byte
// before them inside the braces: the tag is then "\x00", the same for both keys. No lock name
// contains NUL (guard.CheckName), so no other name maps to those keys.
func (s *Store) lockKey(name string) string {
	if strings.HasPrefix(name, "}") {
		return s.prefix + "{\x00" + name + "}"
	}
	return s.prefix + "{" + name + "}"
}

// keys returns the keys of name, in the order the scripts take them (lock.lua) — the lock,
// its fence, its queue, its waiters, its shared holders and their data — and, seventh, its
// release channel. They share one string: two allocations in all, on the path of every lock.
func (s *Store) keys(name string) []string {
	open := "{"
	if strings.HasPrefix(name, "}") {
		open = "{\x00" // see lockKey
	}
	n := len(s.prefix) + len(open) + len(name) + 1 // the lock key
	suffixes := [...]string{"", fenceSuffix, queueSuffix, waitersSuffix, sharedSuffix, holdersSuffix, channelSuffix}
	var b strings.Builder
	b.Grow(len(suffixes)*n + len(fenceSuffix) + len(queueSuffix) + len(waitersSuffix) +
		len(sharedSuffix) + len(holdersSuffix) + len(channelSuffix))
	var ends [len(suffixes)]int
	for i, suffix := range suffixes {
		b.WriteString(s.prefix)
		b.WriteString(open)
		b.WriteString(name)
		b.WriteByte('}')
		b.WriteString(suffix)
		ends[i] = b.Len()
	}
	all := b.String()
	keys := make([]string, len(suffixes))
	from := 0
	for i, end := range ends {
		keys[i], from = all[from:end], end
	}
	return keys
}

// channel returns the channel that a release of name is published on.
func (s *Store) channel(name string) string { return s.lockKey(name) + channelSuffix }

// nameOfKey returns the lock name whose lock key is key.
func (s *Store) nameOfKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, s.prefix+"{")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "}")
	if !ok || name == "" {
		return "", false
	}
	return strings.TrimPrefix(name, "\x00"), true
}

// nameOfHolders returns the lock name whose shared holders' data is at key.
func (s *Store) nameOfHolders(key string) (string, bool) {
	lock, ok := strings.CutSuffix(key, holdersSuffix)
	if !ok {
		return "", false
	}
	return s.nameOfKey(lock)
}

// nameOf returns the lock name whose release channel is ch.
func (s *Store) nameOf(ch string) (string, bool) {
	key, ok := strings.CutSuffix(ch, channelSuffix)
	if !ok {
		return "", false
	}
	return s.nameOfKey(key)
}

// millis returns d in whole milliseconds for PX and PEXPIRE, rounded up: the server keeps a
// lock at least as long as its owner was told.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Acquire makes one attempt to take r.Name for r.Token with a lease of r.TTL — exclusive, or
// shared among at most r.Limit holders when r.Shared (see guard.Request) — and keeps r.Value
// with it: one EVALSHA of acquire.lua (with WAIT in the same round trip under
// WithReplicaAcks). It returns the fence, a *guard.BusyError with how long the name stays
// unavailable to r (the holder's lease, a MinHold window, the shared holders' leases, or the
// place of a waiter ahead), or the driver's error, ErrUnexpectedReply, ErrNotReplicated or
// ErrEvictingServer. The first call checks the server's eviction policy first (one more round
// trip, once).
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if r.TTL <= 0 {
		return 0, fmt.Errorf("redisstore: lease %v is not positive", r.TTL)
	}
	if err := s.checkEviction(ctx); err != nil {
		return 0, err
	}
	place := zeroArg
	if r.Wait {
		place = box(&s.placeArg, millis(watchdog.Place(s.queueTimeout, r.TTL)))
	}
	args := append(evalArgs(acquireScript, s.keysOf(r.Name), 9),
		r.Token, box(&s.ttlArg, millis(r.TTL)), box(&s.instanceArg, r.Instance), box(&s.labelArg, r.Label),
		retentionArg, place, r.Attempt, box(&s.valueArg, r.Value), s.limit(r))
	reply, err := s.evalAcquire(ctx, r.Name, r.Token, args)
	if err != nil {
		return 0, err
	}
	vals, _ := reply.([]any)
	switch {
	case len(vals) == 2 && vals[0] == int64(1):
		if fence, ok := fenceOf(vals[1]); ok {
			return fence, nil
		}
	case len(vals) == 3 && vals[0] == int64(0):
		pttl, ok1 := vals[1].(int64)
		queued, ok2 := vals[2].(int64)
		if ok1 && ok2 {
			return 0, &guard.BusyError{Name: r.Name,
				Remaining: max(time.Duration(pttl)*time.Millisecond, 0),
				Queued:    time.Duration(queued) * time.Millisecond}
		}
	}
	return 0, fmt.Errorf("%w %v", ErrUnexpectedReply, reply)
}

// limit returns acquire.lua's ARGV[9] for r: -1 for an exclusive hold, else the shared
// holders' limit (0: none).
func (s *Store) limit(r guard.Request) any {
	if !r.Shared {
		return exclusiveArg
	}
	return box(&s.limitArg, int64(max(r.Limit, 0)))
}

// fenceOf reads a fence from a script's reply: an integer, or a string beyond 2^53.
func fenceOf(v any) (uint64, bool) {
	switch v := v.(type) {
	case int64:
		return uint64(v), v > 0
	case string:
		f, err := strconv.ParseUint(v, 10, 64)
		return f, err == nil
	}
	return 0, false
}

// isNoScript reports whether err is a server's answer that it does not have the script.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// Release gives name up if token holds it, exclusively or shared: one EVALSHA of
// release.lua. With keep > 0 the holder's place stays taken for keep under no owner (under
// WithReplicaAcks, once replicas have it); otherwise what it frees goes to the first live
// waiters of its queue that fit — one, or several shared ones — whose Guards are told on the
// name's channel, one message each. The fence key is kept. A token that waits for name
// instead of holding it leaves the queue. Release returns guard.ErrNotHeld when token does not
// hold name, or the driver's error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	return s.release(ctx, name, token, keep)
}

// release runs release.lua.
func (s *Store) release(ctx context.Context, name, token string, keep time.Duration) error {
	n, err := s.eval(ctx, releaseScript, name, s.releaseArgs(name, token, keep))
	return s.released(name, token, n, err)
}

// releaseArgs returns the command of release.lua for token on name.
func (s *Store) releaseArgs(name, token string, keep time.Duration) []any {
	keys := s.keysOf(name)
	keepArg := zeroArg
	if keep > 0 {
		keepArg = millis(keep)
	}
	return append(evalArgs(releaseScript, keys, 4), token, keepArg, keys.channel, retentionArg)
}

// released reads release.lua's reply n (or err) for token on name, and tells this Store's
// subscriptions of the waiters it handed name to.
func (s *Store) released(name, token string, n any, err error) error {
	if err != nil {
		return err
	}
	switch n := n.(type) {
	case int64:
		switch n {
		case 1:
			return nil
		case 0:
			return guard.ErrNotHeld
		}
	case []any:
		if notices, ok := handOvers(name, token, n); ok {
			for _, nt := range notices {
				s.handedOver(nt)
			}
			return nil
		}
	}
	return fmt.Errorf("%w %v", ErrUnexpectedReply, n)
}

// handOvers reads the reply {1, next, fence, lease, attempt, ...} of a release that handed
// name to waiters (see hand_over in lock.lua): a Notice per waiter, with released as its
// Token.
func handOvers(name, released string, reply []any) ([]guard.Notice, bool) {
	if len(reply) < 5 || (len(reply)-1)%4 != 0 || reply[0] != int64(1) {
		return nil, false
	}
	notices := make([]guard.Notice, 0, (len(reply)-1)/4)
	for i := 1; i < len(reply); i += 4 {
		next, ok1 := reply[i].(string)
		fence, ok2 := fenceOf(reply[i+1])
		lease, ok3 := reply[i+2].(int64)
		attempt, ok4 := reply[i+3].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return nil, false
		}
		notices = append(notices, guard.Notice{Name: name, Token: released, Next: next, Fence: fence,
			Lease: time.Duration(lease) * time.Millisecond, Attempt: int(attempt)})
	}
	return notices, true
}

// run runs script on the keys of name: EVALSHA, then EVAL if the server lacks the script. It
// waits for replicas under WithReplicaAcks.
func (s *Store) run(ctx context.Context, script *redis.Script, name string, keys []string, args ...any) (any, error) {
	if s.acks > 0 {
		return s.runAcked(ctx, script, name, keys, args...)
	}
	return script.Run(ctx, s.client, keys, args...).Result()
}

// runAcked runs script and WAIT in one pipeline on the master of name's keys.
func (s *Store) runAcked(ctx context.Context, script *redis.Script, name string, keys []string, args ...any) (any, error) {
	node, err := s.nodeFor(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.pipeAcked(ctx, node, func(useSHA bool, pipe redis.Pipeliner) *redis.Cmd {
		if useSHA {
			return script.EvalSha(ctx, pipe, keys, args...)
		}
		return script.Eval(ctx, pipe, keys, args...)
	})
}

// errScriptNotLoaded reports a script the server still lacked after EVAL sent its source.
var errScriptNotLoaded = fmt.Errorf("%w: the script could not be loaded", ErrUnexpectedReply)

// wait queues WAIT for the replicas WithReplicaAcks asks for. (go-redis's Wait is not part of
// its Pipeliner interface.)
func (s *Store) wait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	return pipe.Do(ctx, "wait", s.acks, s.ackTimeout.Milliseconds())
}

// acked returns WAIT's verdict: nil when enough replicas acknowledged.
func (s *Store) acked(w *redis.Cmd) error {
	n, err := w.Int64()
	if err != nil {
		return err
	}
	if int(n) < s.acks {
		return fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, s.acks, s.ackTimeout)
	}
	return nil
}

// nodeFor returns a client of the master that holds name's keys: the client itself, unless it
// is a cluster client.
func (s *Store) nodeFor(ctx context.Context, name string) (redis.Cmdable, error) {
	if s.cluster == nil {
		return s.client, nil
	}
	return s.cluster.MasterForKey(ctx, s.lockKey(name))
}

// partitionTimeout bounds Partition's look-up of a slot's master, in the rare case that the
// cluster client has to load the slot map first.
const partitionTimeout = time.Second

// Partition returns the address of the Cluster master that holds name's keys, so that the
// watchdog renews the locks of each master in a call of its own; "" for a single node or a
// Sentinel-managed master, or when the master is not known.
func (s *Store) Partition(name string) string {
	if s.cluster == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), partitionTimeout)
	defer cancel()
	node, err := s.cluster.MasterForKey(ctx, s.lockKey(name))
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// checkEviction makes sure, once, that the server will not evict a held lock: it reads
// maxmemory_policy from INFO memory on every master (CONFIG is often renamed on managed
// servers; INFO is not). A failure to ask is returned and asked again next time.
func (s *Store) checkEviction(ctx context.Context) error {
	select {
	case <-s.checked:
		return nil
	default:
	}
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	select {
	case <-s.checked:
		return nil
	default:
	}
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return fmt.Errorf("redisstore: checking the eviction policy (pass AllowEviction to skip it): %w", err)
		}
		policy := infoField(info, "maxmemory_policy")
		if policy != "noeviction" {
			return fmt.Errorf("%w: it is %q on %s", ErrEvictingServer, policy, c.Options().Addr)
		}
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	default:
		info, ierr := s.client.Info(ctx, "memory").Result()
		if ierr != nil {
			err = fmt.Errorf("redisstore: checking the eviction policy (pass AllowEviction to skip it): %w", ierr)
		} else if p := infoField(info, "maxmemory_policy"); p != "noeviction" {
			err = fmt.Errorf("%w: it is %q", ErrEvictingServer, p)
		}
	}
	if err == nil {
		close(s.checked)
	}
	return err
}

// infoField returns the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
