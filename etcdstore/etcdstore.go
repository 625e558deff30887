package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

// Store is a guard.Backend, guard.Notifier and guard.Inspector on etcd. It is safe for
// concurrent use. It keeps a session of etcd leases and a janitor on goroutines of its own:
// call Close after the Guard that uses it is closed. It does not own its client: closing the
// client is the caller's job, after Close.
type Store struct {
	client         *clientv3.Client
	prefix         string
	queueTimeout   time.Duration // how long a waiter keeps its place after its last request, at most
	requestTimeout time.Duration // bounds a request whose context has no deadline

	life  context.Context // ends with Close
	close context.CancelFunc
	once  sync.Once

	session *session
	janitor *janitor
}

var (
	_ guard.Backend   = (*Store)(nil)
	_ guard.Notifier  = (*Store)(nil)
	_ guard.Inspector = (*Store)(nil)
	_ guard.Sharing   = (*Store)(nil)
)

// Sentinel errors. The errors of a Store wrap them, or return the client's error.
var (
	// ErrUnexpectedReply reports a reply the Store cannot read: keys under its prefix written
	// by something else, or a server that does not answer as etcd v3 does.
	ErrUnexpectedReply = errors.New("etcdstore: unexpected reply")
	// ErrClosed reports a request to a Store after Close.
	ErrClosed = errors.New("etcdstore: store closed")
	// ErrSubscriptionClosed reports a Watch on a closed Subscription.
	ErrSubscriptionClosed = errors.New("etcdstore: subscription closed")
	// ErrBadToken reports an owner token with a NUL byte, which the Store's keys cannot hold.
	ErrBadToken = errors.New("etcdstore: a token must not contain a NUL byte")
)

// DefaultPrefix is the prefix of every key of a Store unless WithPrefix sets another.
const DefaultPrefix = "guard/"

// DefaultQueueTimeout is how long a waiter keeps its place in a name's queue after its last
// request, at most, unless WithQueueTimeout says otherwise.
const DefaultQueueTimeout = 5 * time.Second

// DefaultRequestTimeout bounds each request of a Store whose context has no earlier deadline,
// unless WithRequestTimeout says otherwise.
const DefaultRequestTimeout = 5 * time.Second

// Option configures a Store. Pass options to New, which validates them.
type Option func(*options)

type options struct {
	prefix         string
	queueTimeout   time.Duration
	requestTimeout time.Duration
}

// WithPrefix sets the prefix of every key of the Store, so that several applications can
// share one etcd cluster (and an etcd user's permissions can be limited to it). Default:
// DefaultPrefix ("guard/"). The prefix must not be empty or contain a NUL byte.
func WithPrefix(p string) Option {
	return func(o *options) { o.prefix = p }
}

// WithQueueTimeout sets how long a waiter keeps its place in a name's wait queue after its last
// request, at most: never longer than the lease the waiter asked for (watchdog.Place), so that
// a waiter whose process died or stopped holds up a name — by its place, or by the lease a
// hand-over gives it — no longer than a holder that asked for that lease (plus etcd's rounding
// to whole seconds, see the package doc). A waiting Guard asks again within half of its place.
// Default: DefaultQueueTimeout (5 s). d must be at least 10 ms.
func WithQueueTimeout(d time.Duration) Option {
	return func(o *options) { o.queueTimeout = d }
}

// WithRequestTimeout bounds each request of the Store whose context has no earlier deadline:
// the etcd client waits for a usable member as long as the context lets it, and a lock request
// should fail rather than hang when no member answers. Default: DefaultRequestTimeout (5 s).
// d must be positive.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) { o.requestTimeout = d }
}

// New returns a Store that keeps locks in the etcd cluster client talks to. It does no I/O:
// the first acquisition of each lease length grants the etcd lease it needs. It panics when
// client is nil or an option is invalid.
func New(client *clientv3.Client, opts ...Option) *Store {
	if client == nil {
		panic("guard/etcdstore: New: nil client")
	}
	o := options{prefix: DefaultPrefix, queueTimeout: DefaultQueueTimeout, requestTimeout: DefaultRequestTimeout}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case o.prefix == "" || strings.IndexByte(o.prefix, 0) >= 0:
		panic(fmt.Sprintf("guard/etcdstore: WithPrefix(%q): the prefix must not be empty or contain a NUL byte", o.prefix))
	case o.queueTimeout < 10*time.Millisecond:
		panic(fmt.Sprintf("guard/etcdstore: WithQueueTimeout(%v): must be at least 10ms", o.queueTimeout))
	case o.requestTimeout <= 0:
		panic(fmt.Sprintf("guard/etcdstore: WithRequestTimeout(%v): must be positive", o.requestTimeout))
	}
	s := &Store{client: client, prefix: o.prefix, queueTimeout: o.queueTimeout, requestTimeout: o.requestTimeout}
	s.life, s.close = context.WithCancel(context.Background())
	s.session = newSession(s)
	s.janitor = newJanitor(s)
	return s
}

// Close stops the Store's goroutines and waits for them. Close the Guard that uses the Store
// first: it releases its locks. The Store's etcd leases are left to run out, with whatever
// keys are still on them — a MinHold window goes on to its end (and up to the lease's margin
// beyond). Requests after Close fail with ErrClosed. Calling Close again does nothing.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.close()
		s.janitor.close()
		s.session.close()
	})
	return nil
}

// bound returns ctx for one request: ended by Close and, when ctx has no earlier deadline,
// after the request timeout; and refusing to be served by a member that has no leader (etcd
// answers that at once), so that a member cut off from its cluster answers instead of
// stalling.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, s.requestTimeout)
	stop := context.AfterFunc(s.life, cancel)
	return clientv3.WithRequireLeader(ctx), func() {
		stop()
		cancel()
	}
}

// Retries. A request that fails for want of a member to serve it — the member it went to
// died, hangs, was cut off or lost its leader, or the leader changed under it — is sent again,
// to the next member, within the request's bounds: a failover takes an election timeout or
// two, shorter than a lease, and a lock request should ride it out. A request that changes a
// lock is sent again only when the error proves it did not run, unless it is idempotent: an
// acquisition for its own token, a move of a key onto a lease, and every read.
const (
	retryMin = 25 * time.Millisecond  // the first pause before a request is sent again
	retryMax = 500 * time.Millisecond // the longest
	// tries is how many tries share the request timeout: each try ends after a share of
	// it (but not before minTry), so that a member that hangs (paused, or cut off without a
	// reset) costs one share.
	tries  = 4
	minTry = time.Second
)

// call runs f, sending it again as the retry rules above say: idempotent tells whether f may
// run twice. It returns f's last error, or ErrClosed after Close.
func (s *Store) call(ctx context.Context, idempotent bool, f func(ctx context.Context) error) error {
	if s.life.Err() != nil {
		return ErrClosed
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	share := max(s.requestTimeout/tries, minTry)
	pause := retryMin
	for {
		tctx, tcancel := context.WithTimeout(ctx, share)
		err := f(tctx)
		tcancel()
		if err != nil && s.life.Err() == nil {
			// This try may have run, or may run later — even when a retry below succeeds:
			// a copy held up in a paused leader can land after the key it wrote was
			// released. The janitor sweeps for keys nobody knows.
			s.janitor.doubt()
		}
		switch {
		case err == nil:
			return nil
		case s.life.Err() != nil:
			return ErrClosed
		case ctx.Err() != nil || !retryable(err, idempotent):
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		pause = min(2*pause, retryMax)
	}
}

// retryable reports whether a request that failed with err may be sent again: when err says
// the request never ran, or, for an idempotent one, when it says the member or the cluster
// failed to answer.
func retryable(err error, idempotent bool) bool {
	if errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrNotLeader) {
		return true // refused before anything ran
	}
	if !idempotent {
		return false
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), // this try's share of the timeout
		errors.Is(err, rpctypes.ErrLeaderChanged),
		errors.Is(err, rpctypes.ErrTimeout),
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail),
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost),
		errors.Is(err, rpctypes.ErrTimeoutWaitAppliedIndex),
		errors.Is(err, rpctypes.ErrTooManyRequests):
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// txn runs one transaction that is not idempotent (see call).
func (s *Store) txn(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	return s.txnOnce(ctx, false, cmps, then, els)
}

// txnIdempotent runs one transaction that may run twice (see call).
func (s *Store) txnIdempotent(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	return s.txnOnce(ctx, true, cmps, then, els)
}

// txnAgain runs one transaction that is not idempotent, but whose outcome the caller can
// read from a second run: it is sent again after an ambiguous failure too, and ambiguous
// reports whether a try failed so (it may have run).
func (s *Store) txnAgain(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (resp *clientv3.TxnResponse, ambiguous bool, err error) {
	err = s.call(ctx, true, func(ctx context.Context) (err error) {
		resp, err = s.client.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		if err != nil && !retryable(err, false) {
			ambiguous = true
		}
		return err
	})
	return resp, ambiguous, err
}

func (s *Store) txnOnce(ctx context.Context, idempotent bool, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := s.call(ctx, idempotent, func(ctx context.Context) (err error) {
		resp, err = s.client.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		return err
	})
	return resp, err
}

// first returns the Op that reads the first n keys of name's queue: its holder, then its
// waiters.
func (s *Store) first(name string, n int64) clientv3.Op {
	start, end := s.nameRange(name)
	return clientv3.OpGet(start, clientv3.WithRange(end), clientv3.WithLimit(n),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// onlyFrom compares true when no key of name was created before rev: a key of name created at
// rev is then its holder.
func (s *Store) onlyFrom(name string, rev int64) clientv3.Cmp {
	start, end := s.nameRange(name)
	return clientv3.Compare(clientv3.CreateRevision(start), ">", rev-1).WithRange(end)
}

// isFree compares true when name has no key.
func (s *Store) isFree(name string) clientv3.Cmp {
	start, end := s.nameRange(name)
	return clientv3.Compare(clientv3.CreateRevision(start), "=", 0).WithRange(end)
}

// isCaller compares true when key holds a caller's record: it exists and is not kept.
func isCaller(key string) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(key), "<", notKept)
}

// Acquire makes one attempt to take r.Name for r.Token with a lease of r.TTL: one etcd
// transaction (after a grant of the lease class's etcd lease, the first time; see the package
// doc). r.Token takes the name when the name has no key, or when r.Token's key is the name's
// first (a waiter whose turn came, or a retry); its key then moves to a holder's lease, and
// its create revision is the fence. Otherwise Acquire returns a *guard.BusyError with what is
// left of the holder's lease — after queueing r.Token (a key of its own, on a waiter's
// lease) when r.Wait is set. It returns the client's error, ErrClosed, ErrBadToken or
// ErrUnexpectedReply otherwise.
func (s *Store) Acquire(ctx context.Context, r guard.Request) (uint64, error) {
	if err := checkRequest(r.Token, r.TTL); err != nil {
		return 0, err
	}
	o := s.janitor.begin(r.Name, r.Token)
	acquire := s.acquire
	if r.Shared {
		acquire = s.acquireShared
	}
	fence, busy, learned, err := acquire(ctx, r, o)
	s.janitor.end(o, learned)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) && s.session.verify(ctx) {
		// A lease the session believed in is gone — revoked by a leader that resumed after
		// a pause — and etcd refused the transaction whole: once more, on a lease granted anew.
		o = s.janitor.begin(r.Name, r.Token)
		fence, busy, learned, err = acquire(ctx, r, o)
		s.janitor.end(o, learned)
	}
	switch {
	case err != nil:
		return 0, err
	case busy != nil:
		return 0, busy
	}
	return fence, nil
}

// checkRequest refuses what the Store cannot keep.
func checkRequest(token string, ttl time.Duration) error {
	switch {
	case strings.IndexByte(token, 0) >= 0:
		return ErrBadToken
	case ttl <= 0:
		return fmt.Errorf("etcdstore: lease %v is not positive", ttl)
	}
	return nil
}

// acquire is Acquire's transaction: it returns the fence or the busy answer, and what the
// janitor is to learn of r.Token's key.
func (s *Store) acquire(ctx context.Context, r guard.Request, o *own) (uint64, *guard.BusyError, func(*own), error) {
	start := time.Now()
	snap := s.janitor.snapshot(o)
	hold, holdID, err := s.session.leaseFor(ctx, holdLease, r.TTL)
	if err != nil {
		return 0, nil, nil, err
	}
	var wait *class
	var waitID clientv3.LeaseID
	var place time.Duration
	if r.Wait {
		place = watchdog.Place(s.queueTimeout, r.TTL)
		if wait, waitID, err = s.session.leaseFor(ctx, waitLease, place); err != nil {
			return 0, nil, nil, err
		}
	}
	wall := time.Now()
	held := record{kind: kindCaller, at: wall, expires: wall.Add(r.TTL), ttl: r.TTL, place: place,
		attempt: r.Attempt, instance: r.Instance, label: r.Label, value: r.Value}
	queued := held
	queued.expires = wall.Add(place)

	key := s.key(r.Name, r.Token)
	putHeld := clientv3.OpPut(key, held.encode(), clientv3.WithLease(holdID))
	head := s.first(r.Name, 1)
	asWaiter := []clientv3.Op{head}
	if r.Wait {
		asWaiter = []clientv3.Op{clientv3.OpPut(key, queued.encode(), clientv3.WithLease(waitID)), head}
	}
	var then []clientv3.Op
	if snap.rev != 0 {
		// Ours already: a waiter asking again, or a retry. It holds the name when no key
		// of the name is older.
		then = []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{s.onlyFrom(r.Name, snap.rev)}, []clientv3.Op{putHeld}, asWaiter)}
	}
	then = append(then, clientv3.OpGet(key))
	els := []clientv3.Op{
		clientv3.OpTxn([]clientv3.Cmp{s.isFree(r.Name)}, []clientv3.Op{putHeld}, []clientv3.Op{
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, asWaiter, []clientv3.Op{head}),
		}),
		clientv3.OpGet(key),
	}
	resp, err := s.txnIdempotent(ctx, []clientv3.Cmp{isCaller(key)}, then, els)
	if err != nil {
		// It may have run: the key is there or not, as it was written or not. The Guard
		// gives it back (an owner-checked release); meanwhile the janitor must not trust the
		// revision it knew.
		return 0, nil, func(o *own) { o.mod = 0 }, err
	}
	mine := resp.Responses[len(resp.Responses)-1].GetResponseRange()
	if resp.Succeeded && snap.rev == 0 {
		// Ours, written by a request whose answer was lost: learn its revision, and ask again.
		if mine == nil || len(mine.Kvs) == 0 {
			return 0, nil, nil, fmt.Errorf("%w: no key after finding it", ErrUnexpectedReply)
		}
		kv := mine.Kvs[0]
		s.janitor.end(o, func(o *own) {
			o.rev, o.mod = kv.CreateRevision, kv.ModRevision
			if o.state == ownUnknown {
				o.state = ownWaiting
				o.lasts(start, max(place, r.TTL))
			}
		})
		s.janitor.begin(r.Name, r.Token)
		return s.acquire(ctx, r, o)
	}
	// Walk down the nested answers to the one that decided.
	granted, queuedNow := false, false
	var heads *clientv3.GetResponse
	tx := resp.Responses[0].GetResponseTxn()
	for depth := 0; tx != nil && depth < 3; depth++ {
		last := tx.Responses[len(tx.Responses)-1]
		switch {
		case tx.Succeeded && depth == 0:
			granted = true
		case tx.Succeeded && depth == 1:
			queuedNow = r.Wait // the key is new, and waits
		}
		if granted {
			break
		}
		if next := last.GetResponseTxn(); next != nil {
			tx = next
			continue
		}
		if rr := last.GetResponseRange(); rr != nil {
			heads = (*clientv3.GetResponse)(rr)
			if depth == 0 {
				queuedNow = r.Wait // an old key of ours, waiting still
			}
		}
		break
	}
	if granted {
		if mine == nil || len(mine.Kvs) == 0 {
			return 0, nil, nil, fmt.Errorf("%w: no key after taking the lock", ErrUnexpectedReply)
		}
		kv := mine.Kvs[0]
		return uint64(kv.CreateRevision), nil, func(o *own) {
			o.state, o.rev, o.mod, o.class, o.rec = ownHeld, kv.CreateRevision, kv.ModRevision, hold, held
			o.lasts(start, r.TTL)
		}, nil
	}
	busy := &guard.BusyError{Name: r.Name}
	if heads != nil && len(heads.Kvs) > 0 {
		if c, err := s.callerOf(heads.Kvs[0]); err == nil {
			busy.Remaining = c.staysFor(time.Now())
		}
	}
	if !queuedNow || mine == nil || len(mine.Kvs) == 0 {
		return 0, busy, nil, nil
	}
	busy.Queued = place
	kv := mine.Kvs[0]
	return 0, busy, func(o *own) {
		o.state, o.rev, o.mod, o.class, o.rec = ownWaiting, kv.CreateRevision, kv.ModRevision, wait, queued
		o.lasts(start, place)
	}, nil
}

// Extend sets the lease of each lock in leases that its token still holds. The locks of one
// lease length share one etcd lease (see the package doc), so the batch costs one request per
// length: a look at that lease's keys, which confirms both that each lock is still its token's
// and that the lease has at least the TTL left (else a keep-alive, one request more). A lock
// whose key is on another lease — handed over from the queue, or extended to another length
// — moves to this one, owner-checked: one transaction each. It returns one error per lease, in
// order: nil when extended, guard.ErrNotHeld when the name is free or held by another token,
// or the client's error.
func (s *Store) Extend(ctx context.Context, leases []guard.Lease) []error {
	// The last lease of a lock named twice stands (guard.Backend.Extend): the batch extends
	// with it alone, since the lengths' requests run at once, and the others get its answer.
	last := make(map[[2]string]int, len(leases))
	for i, l := range leases {
		last[[2]string{l.Name, l.Token}] = i
	}
	if len(last) < len(leases) {
		var unique []guard.Lease
		pos := make(map[int]int, len(last)) // leases' index → unique's
		for i, l := range leases {
			if last[[2]string{l.Name, l.Token}] == i {
				pos[i] = len(unique)
				unique = append(unique, l)
			}
		}
		got := s.Extend(ctx, unique)
		errs := make([]error, len(leases))
		for i, l := range leases {
			errs[i] = got[pos[last[[2]string{l.Name, l.Token}]]]
		}
		return errs
	}
	errs := make([]error, len(leases))
	start := time.Now()
	type item struct {
		i int
		o *own
	}
	type batch struct {
		c     *class
		id    clientv3.LeaseID
		items []item
	}
	batches := make(map[*class]*batch)
	for i, l := range leases {
		if err := checkRequest(l.Token, l.TTL); err != nil {
			errs[i] = err
			continue
		}
		c, id, err := s.session.leaseFor(ctx, holdLease, l.TTL)
		if err != nil {
			errs[i] = err
			continue
		}
		b := batches[c]
		if b == nil {
			b = &batch{c: c, id: id}
			batches[c] = b
		}
		b.items = append(b.items, item{i, s.janitor.begin(l.Name, l.Token)})
	}
	var wg sync.WaitGroup
	for _, b := range batches {
		wg.Go(func() {
			at := make([]int, len(b.items))
			for j, it := range b.items {
				at[j] = it.i
			}
			onLease, err := s.onLease(ctx, b.c, b.id, start, leases, at)
			var moves sync.WaitGroup
			for _, it := range b.items {
				l := leases[it.i]
				switch {
				case err != nil:
					errs[it.i] = err
					s.janitor.end(it.o, nil)
				case onLease[it.i]:
					s.janitor.end(it.o, func(o *own) {
						o.state = ownHeld
						o.lasts(start, l.TTL)
					})
				default:
					moves.Go(func() { errs[it.i] = s.move(ctx, it.o, l, b.c, b.id, start) })
				}
			}
			moves.Wait()
		})
	}
	wg.Wait()
	return errs
}

// onLease reports which of the leases at the indices at have their key on the etcd lease id of
// class c, and makes sure that the lease lives at least their TTL from start. A key on the
// lease is its token's holder's: a holder's key moves there only when it holds the name
// (Acquire, move), and leaves when the name is released or kept.
func (s *Store) onLease(ctx context.Context, c *class, id clientv3.LeaseID, start time.Time, leases []guard.Lease,
	at []int) (map[int]bool, error) {
	var resp *clientv3.LeaseTimeToLiveResponse
	err := s.call(ctx, true, func(ctx context.Context) (err error) {
		resp, err = s.client.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
		return err
	})
	if err == nil && resp.TTL <= 0 {
		err = rpctypes.ErrLeaseNotFound
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease ran out (the cluster did not hear from this process for its whole
		// TTL): every key on it is gone. No lock is on it; a move finds its key gone.
		s.session.lost(c, id)
		return map[int]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	left := time.Duration(resp.TTL) * time.Second // at least that much, from when it answered
	s.session.confirmed(c, id, start, left)
	keys := make(map[string]bool, len(resp.Keys))
	for _, k := range resp.Keys {
		keys[string(k)] = true
	}
	found := make(map[int]bool)
	longest := time.Duration(0)
	for _, i := range at {
		if keys[s.key(leases[i].Name, leases[i].Token)] {
			found[i] = true
			longest = max(longest, leases[i].TTL)
		}
	}
	if longest > left {
		// The session has not kept the lease alive lately: do it now.
		var ka *clientv3.LeaseKeepAliveResponse
		sent := time.Now()
		err := s.call(ctx, true, func(ctx context.Context) (err error) {
			sent = time.Now()
			ka, err = s.client.KeepAliveOnce(ctx, id)
			return err
		})
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				s.session.lost(c, id)
				return map[int]bool{}, nil
			}
			return nil, err
		}
		s.session.confirmed(c, id, sent, time.Duration(ka.TTL)*time.Second)
		if time.Duration(ka.TTL)*time.Second < longest {
			return nil, fmt.Errorf("%w: lease %x has a TTL of %ds", ErrUnexpectedReply, id, ka.TTL)
		}
	}
	return found, nil
}

// move puts l's key on the etcd lease id of class c, if l's token holds the name: one
// owner-checked transaction, which writes the lease's new end into the key's record too.
func (s *Store) move(ctx context.Context, o *own, l guard.Lease, c *class, id clientv3.LeaseID, start time.Time) error {
	snap := s.janitor.snapshot(o)
	key := s.key(l.Name, l.Token)
	if snap.rev == 0 || snap.rec.kind == 0 {
		// A key this Store did not write or lost track of: read it first.
		resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{clientv3.OpGet(key)}, nil)
		if err != nil {
			s.janitor.end(o, nil)
			return err
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			s.janitor.end(o, func(o *own) { o.state = ownUnknown })
			return guard.ErrNotHeld
		}
		cl, err := s.callerOf(kvs[0])
		if err != nil {
			s.janitor.end(o, nil)
			return err
		}
		snap.rev, snap.rec = cl.create, cl.rec
	}
	rec := snap.rec
	rec.kind = kindCaller
	rec.ttl, rec.expires = l.TTL, time.Now().Add(l.TTL)
	held := s.onlyFrom(l.Name, snap.rev)
	if rec.shared {
		// Whether a shared key holds takes a read; once it does, it goes on holding while
		// it lasts (see shared.go).
		holds, _, err := s.holds(ctx, l.Name, key, snap.rev)
		if err != nil {
			s.janitor.end(o, nil)
			return err
		}
		if !holds {
			s.janitor.end(o, nil)
			return guard.ErrNotHeld
		}
		held = clientv3.Compare(clientv3.CreateRevision(key), "=", snap.rev)
	}
	resp, err := s.txnIdempotent(ctx, []clientv3.Cmp{isCaller(key), held},
		[]clientv3.Op{clientv3.OpPut(key, rec.encode(), clientv3.WithLease(id))}, nil)
	if err != nil {
		s.janitor.end(o, func(o *own) { o.mod = 0 })
		return err
	}
	if !resp.Succeeded {
		// Not held: gone, waiting still, or kept for a MinHold window (which the janitor
		// still ends).
		s.janitor.end(o, func(o *own) {
			if o.state == ownHeld {
				o.state = ownUnknown
			}
		})
		return guard.ErrNotHeld
	}
	s.janitor.end(o, func(o *own) {
		o.state, o.rev, o.mod, o.class, o.rec = ownHeld, snap.rev, resp.Header.Revision, c, rec
		o.lasts(start, l.TTL)
	})
	return nil
}

// Release gives name up if token holds it: one transaction that deletes token's key, so that
// the next key of the name, if any, holds it from that revision on — the first waiter, whose
// Guard hears of it by its watch. With keep > 0 the key stays for keep, as a kept record no
// token matches, on a lease of its own (the janitor deletes it when the window ends). A token
// that waits for name instead of holding it leaves the queue. Release returns guard.ErrNotHeld
// when token does not hold name, or the client's error.
func (s *Store) Release(ctx context.Context, name, token string, keep time.Duration) error {
	if strings.IndexByte(token, 0) >= 0 {
		return ErrBadToken
	}
	o := s.janitor.begin(name, token)
	if keep > 0 {
		learned, err := s.keep(ctx, name, token, keep, o)
		s.janitor.end(o, learned)
		return err
	}
	key := s.key(name, token)
	snap := s.janitor.snapshot(o)
	heads := s.first(name, 1)
	if snap.rec.shared || snap.rec.kind == 0 {
		heads = s.all(name) // whether a shared key held takes its keys
	}
	resp, ambiguous, err := s.txnAgain(ctx, []clientv3.Cmp{isCaller(key)}, []clientv3.Op{heads, clientv3.OpDelete(key)}, nil)
	if err != nil {
		s.janitor.end(o, func(o *own) { o.mod = 0 })
		return err
	}
	if !resp.Succeeded && ambiguous {
		// A try whose answer was lost deleted the key, most likely: the key is gone, and
		// the Guard asked for that. (It cannot be told from a loss just before.)
		s.janitor.end(o, func(o *own) { o.state = ownUnknown })
		return nil
	}
	if !resp.Succeeded {
		// Gone, or kept for a MinHold window, which the janitor still ends.
		s.janitor.end(o, func(o *own) {
			if o.state != ownKept {
				o.state = ownUnknown
			}
		})
		return guard.ErrNotHeld
	}
	s.janitor.end(o, func(o *own) { o.state = ownUnknown })
	callers, err := s.callersOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return nil // released; what it was is not known
	}
	if i := slices.IndexFunc(callers, func(c caller) bool { return c.key == key }); i < 0 || i >= holding(callers) {
		return guard.ErrNotHeld // it waited: it left the queue
	}
	return nil
}

// keep is Release with keep > 0.
func (s *Store) keep(ctx context.Context, name, token string, keep time.Duration, o *own) (func(*own), error) {
	start := time.Now()
	snap := s.janitor.snapshot(o)
	key := s.key(name, token)
	rev, rec := snap.rev, snap.rec
	if rev == 0 || rec.kind == 0 {
		resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{clientv3.OpGet(key)}, nil)
		if err != nil {
			return nil, err
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return func(o *own) { o.state = ownUnknown }, guard.ErrNotHeld
		}
		cl, err := s.callerOf(kvs[0])
		if err != nil {
			return nil, err
		}
		rev, rec = cl.create, cl.rec
	}
	c, id, err := s.session.leaseFor(ctx, keepLease, keep)
	if err != nil {
		return nil, err
	}
	rec.kind = kindKept
	rec.expires = time.Now().Add(keep)
	held := s.onlyFrom(name, rev)
	if rec.shared {
		// A shared key that held goes on holding while it lasts (see shared.go).
		held = clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	}
	resp, ambiguous, err := s.txnAgain(ctx, []clientv3.Cmp{isCaller(key), held},
		[]clientv3.Op{clientv3.OpPut(key, rec.encode(), clientv3.WithLease(id))},
		[]clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{isCaller(key)}, []clientv3.Op{clientv3.OpDelete(key)}, nil),
			clientv3.OpGet(key)})
	if err != nil {
		return func(o *own) { o.mod = 0 }, err
	}
	if !resp.Succeeded && ambiguous {
		// A try whose answer was lost may have kept the key already: it is then ours, kept.
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			if kc, err := s.callerOf(kvs[0]); err == nil && kc.rec.kind == kindKept && kc.create == rev {
				return func(o *own) {
					o.state, o.rev, o.mod, o.class, o.rec = ownKept, rev, kc.mod, c, kc.rec
					o.expires, o.setAt = start.Add(keep), start
				}, nil
			}
		}
	}
	if !resp.Succeeded {
		return func(o *own) {
			if o.state != ownKept {
				o.state = ownUnknown
			}
		}, guard.ErrNotHeld
	}
	return func(o *own) {
		o.state, o.rev, o.mod, o.class, o.rec = ownKept, rev, resp.Header.Revision, c, rec
		o.expires, o.setAt = start.Add(keep), start // a MinHold window is what it is
	}, nil
}

// bookkeepingKey marks the context of a request the Store sends for its own session, not for
// a lock operation: tests that count a lock operation's requests leave those out.
type bookkeepingKey struct{}

func bookkeeping(ctx context.Context) context.Context {
	return context.WithValue(ctx, bookkeepingKey{}, true)
}

// isBookkeeping reports whether ctx is a bookkeeping request's.
func isBookkeeping(ctx context.Context) bool {
	v, _ := ctx.Value(bookkeepingKey{}).(bool)
	return v
}
