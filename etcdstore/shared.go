package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/watchdog"
)

// Shared holds. A shared caller's record says so, with its limit. A name's holders are the
// longest run of its first keys, in create-revision order, that fit: the first key alone when
// it is exclusive; otherwise every shared key up to the first that is exclusive or would make
// more holders than its own limit. No key is granted past an earlier one, so a waiting writer
// holds back the readers that come after it.
//
// Whether a key holds can only change one way: keys created before it only go (every new key
// has a higher create revision), so a key that holds goes on holding until it goes itself. A
// transaction cannot count keys, so a shared caller writes its key and reads the name's keys in
// one transaction, and decides from that read, which stays true: its key holds, or waits (and
// is deleted again when the caller does not wait).

// SharedLocks tells that a Store grants shared holds (guard.Sharing).
func (*Store) SharedLocks() {}

// holding returns how many of callers, in create-revision order, hold the name.
func holding(callers []caller) int {
	if len(callers) == 0 {
		return 0
	}
	if !callers[0].rec.shared {
		return 1
	}
	n := 0
	for _, c := range callers {
		if !c.rec.shared || c.rec.limit > 0 && n >= c.rec.limit {
			break
		}
		n++
	}
	return n
}

// callersOf reads kvs, keys of one name, in create-revision order.
func (s *Store) callersOf(kvs []*mvccpb.KeyValue) ([]caller, error) {
	out := make([]caller, 0, len(kvs))
	for _, kv := range kvs {
		c, err := s.callerOf(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b caller) int { return cmp.Compare(a.create, b.create) })
	return out, nil
}

// all returns the Op that reads every key of name, in create-revision order.
func (s *Store) all(name string) clientv3.Op {
	start, end := s.nameRange(name)
	return clientv3.OpGet(start, clientv3.WithRange(end),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// upTo returns the Op that reads the keys of name created at rev or before, in create-revision
// order.
func (s *Store) upTo(name string, rev int64) clientv3.Op {
	start, end := s.nameRange(name)
	return clientv3.OpGet(start, clientv3.WithRange(end), clientv3.WithMaxCreateRev(rev),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
}

// acquireShared is acquire for a shared request: one transaction that writes the caller's key
// on a holder's lease and reads the name's keys, when the key holds; one more when it does
// not, which moves it to a waiter's lease (the caller waits) or deletes it. A caller that waits
// already (its key exists) reads the keys up to its own, and then moves its key to a holder's
// lease, or keeps its place on a waiter's: two.
func (s *Store) acquireShared(ctx context.Context, r guard.Request, o *own) (uint64, *guard.BusyError, func(*own), error) {
	start := time.Now()
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
		attempt: r.Attempt, instance: r.Instance, label: r.Label, value: r.Value, shared: true, limit: r.Limit}
	queued := held
	queued.expires = wall.Add(place)
	key := s.key(r.Name, r.Token)
	putHeld := clientv3.OpPut(key, held.encode(), clientv3.WithLease(holdID))
	granted := func(kv *mvccpb.KeyValue) (uint64, *guard.BusyError, func(*own), error) {
		return uint64(kv.CreateRevision), nil, func(o *own) {
			o.state, o.rev, o.mod, o.class, o.rec = ownHeld, kv.CreateRevision, kv.ModRevision, hold, held
			o.lasts(start, r.TTL)
		}, nil
	}
	snap := s.janitor.snapshot(o)
	if snap.rev != 0 {
		return s.acquireSharedAgain(ctx, r, snap.rev, putHeld, held, hold, queued, wait, waitID, start)
	}
	// A new key, on a holder's lease, and the name's keys read after it: it holds, or it
	// waits (and goes again unless r.Wait).
	resp, err := s.txnIdempotent(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		[]clientv3.Op{putHeld, s.all(r.Name)}, []clientv3.Op{clientv3.OpGet(key)})
	if err != nil {
		return 0, nil, func(o *own) { o.mod = 0 }, err
	}
	if !resp.Succeeded {
		// Ours, written by a request whose answer was lost: learn it, and ask again.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return 0, nil, nil, fmt.Errorf("%w: no key after finding it", ErrUnexpectedReply)
		}
		kv := kvs[0]
		return s.acquireSharedAgain(ctx, r, kv.CreateRevision, putHeld, held, hold, queued, wait, waitID, start)
	}
	callers, err := s.callersOf(resp.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		return 0, nil, nil, err
	}
	i := slices.IndexFunc(callers, func(c caller) bool { return c.key == key })
	if i < 0 {
		return 0, nil, nil, fmt.Errorf("%w: no key after writing it", ErrUnexpectedReply)
	}
	mine := callers[i]
	n := holding(callers)
	if i < n {
		return granted(mine.kv)
	}
	busy := busyBehind(r.Name, callers, n)
	same := []clientv3.Cmp{isCaller(key), clientv3.Compare(clientv3.CreateRevision(key), "=", mine.create)}
	if r.Wait {
		// It waits where it is, on a waiter's lease: only a holder's key is on a holder's
		// lease (Extend counts on it). Should it hold by now, its record's place bounds the
		// lease a hand-over gave it, which a waiter's lease outlasts.
		resp, err = s.txnIdempotent(ctx, same, []clientv3.Op{clientv3.OpPut(key, queued.encode(), clientv3.WithLease(waitID))}, nil)
		if err != nil {
			return 0, nil, func(o *own) { o.mod = 0 }, err
		}
		if !resp.Succeeded {
			return 0, busy, func(o *own) { o.state, o.rev, o.mod = ownUnknown, 0, 0 }, nil
		}
		busy.Queued = place
		mod := resp.Header.Revision
		return 0, busy, func(o *own) {
			o.state, o.rev, o.mod, o.class, o.rec = ownWaiting, mine.create, mod, wait, queued
			o.lasts(start, place)
		}, nil
	}
	resp, err = s.txnIdempotent(ctx, same[1:], []clientv3.Op{clientv3.OpDelete(key)}, nil)
	if err != nil {
		// The key may stay: the Guard gives it back (an owner-checked release).
		return 0, nil, func(o *own) { o.mod = 0 }, err
	}
	return 0, busy, func(o *own) { o.state, o.rev, o.mod = ownUnknown, 0, 0 }, nil
}

// acquireSharedAgain is acquireShared for a caller whose key exists, created at rev: a waiter
// asking again, or a retry. It reads the keys up to its own; when its key holds, it moves to a
// holder's lease (a second transaction); when it waits, it keeps its place, refreshed.
func (s *Store) acquireSharedAgain(ctx context.Context, r guard.Request, rev int64, putHeld clientv3.Op, held record,
	hold *class, queued record, wait *class, waitID clientv3.LeaseID, start time.Time,
) (uint64, *guard.BusyError, func(*own), error) {
	key := s.key(r.Name, r.Token)
	holds, callers, err := s.holds(ctx, r.Name, key, rev)
	switch {
	case err != nil:
		return 0, nil, nil, err
	case callers == nil:
		// Our key is gone (its place or lease ran out): busy for now — the caller asks again
		// and starts over, from the back of the queue. Never a grant: nothing is held.
		return 0, &guard.BusyError{Name: r.Name}, func(o *own) { o.state, o.rev, o.mod = ownUnknown, 0, 0 }, nil
	}
	mine := []clientv3.Cmp{isCaller(key), clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}
	if holds {
		resp, err := s.txnIdempotent(ctx, mine, []clientv3.Op{putHeld}, nil)
		if err != nil {
			return 0, nil, func(o *own) { o.mod = 0 }, err
		}
		if !resp.Succeeded {
			return 0, &guard.BusyError{Name: r.Name}, func(o *own) { o.state, o.rev, o.mod = ownUnknown, 0, 0 }, nil
		}
		mod := resp.Header.Revision
		return uint64(rev), nil, func(o *own) {
			o.state, o.rev, o.mod, o.class, o.rec = ownHeld, rev, mod, hold, held
			o.lasts(start, r.TTL)
		}, nil
	}
	n := holding(callers)
	busy := busyBehind(r.Name, callers, n)
	if !r.Wait {
		return 0, busy, nil, nil
	}
	resp, err := s.txnIdempotent(ctx, mine, []clientv3.Op{clientv3.OpPut(key, queued.encode(), clientv3.WithLease(waitID))}, nil)
	if err != nil {
		return 0, nil, func(o *own) { o.mod = 0 }, err
	}
	if !resp.Succeeded {
		return 0, busy, func(o *own) { o.state, o.rev, o.mod = ownUnknown, 0, 0 }, nil
	}
	busy.Queued = queued.place
	mod := resp.Header.Revision
	return 0, busy, func(o *own) {
		o.state, o.rev, o.mod, o.class, o.rec = ownWaiting, rev, mod, wait, queued
		o.lasts(start, queued.place)
	}, nil
}

// holds reads the keys of name up to key, created at rev, and reports whether key holds the
// name, and the keys read (nil when key is gone).
func (s *Store) holds(ctx context.Context, name, key string, rev int64) (bool, []caller, error) {
	resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{s.upTo(name, rev)}, nil)
	if err != nil {
		return false, nil, err
	}
	callers, err := s.callersOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return false, nil, err
	}
	i := slices.IndexFunc(callers, func(c caller) bool { return c.key == key && c.create == rev })
	if i < 0 {
		return false, nil, nil
	}
	return i < holding(callers), callers, nil
}

// busyBehind is the busy answer to a caller behind callers, of which the first n hold: how
// long the first of them stays.
func busyBehind(name string, callers []caller, n int) *guard.BusyError {
	busy := &guard.BusyError{Name: name}
	now := time.Now()
	for _, c := range callers[:min(max(n, 1), len(callers))] {
		left := c.staysFor(now)
		if busy.Remaining == 0 || left < busy.Remaining {
			busy.Remaining = left
		}
	}
	return busy
}
