package etcdstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/guardlock/guard"
)

var _ guard.Batcher = (*Store)(nil)

// maxBatch is the most names AcquireAll takes in one transaction: each costs two operations,
// and etcd refuses a transaction of more than 128 (its --max-txn-ops default).
const maxBatch = 48

// AcquireAll takes every request's name at once, or none: one transaction that writes a key
// for each on a holder's lease if every name has no key at all. It returns the fences (the
// keys' create revisions), or a *guard.BusyError for the first name that has a key — a
// holder, or waiters — with what is left of its first key's lease. It queues nobody, and a
// batch of more than maxBatch names, which one transaction cannot hold, is answered busy, so
// that the Guard takes the names one by one. The transaction is not sent again after a failure
// that leaves it unknown whether it ran: the Guard then gives back every token.
func (s *Store) AcquireAll(ctx context.Context, reqs []guard.Request) ([]uint64, error) {
	for _, r := range reqs {
		if err := checkRequest(r.Token, r.TTL); err != nil {
			return nil, err
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	if len(reqs) > maxBatch {
		return nil, &guard.BusyError{Name: reqs[0].Name}
	}
	owns := make([]*own, len(reqs))
	learned := make([]func(*own), len(reqs))
	for i, r := range reqs {
		owns[i] = s.janitor.begin(r.Name, r.Token)
	}
	defer func() {
		for i, o := range owns {
			s.janitor.end(o, learned[i])
		}
	}()
	start := time.Now()
	classes := make([]*class, len(reqs))
	recs := make([]record, len(reqs))
	cmps := make([]clientv3.Cmp, 0, len(reqs))
	then := make([]clientv3.Op, 0, 2*len(reqs))
	els := make([]clientv3.Op, 0, len(reqs))
	for i, r := range reqs {
		c, id, err := s.session.leaseFor(ctx, holdLease, r.TTL)
		if err != nil {
			return nil, err
		}
		wall := time.Now()
		classes[i] = c
		recs[i] = record{kind: kindCaller, at: wall, expires: wall.Add(r.TTL), ttl: r.TTL, attempt: r.Attempt,
			instance: r.Instance, label: r.Label, value: r.Value, shared: r.Shared, limit: r.Limit}
		cmps = append(cmps, s.isFree(r.Name))
		then = append(then, clientv3.OpPut(s.key(r.Name, r.Token), recs[i].encode(), clientv3.WithLease(id)))
		els = append(els, s.first(r.Name, 1))
	}
	for _, r := range reqs {
		then = append(then, clientv3.OpGet(s.key(r.Name, r.Token)))
	}
	resp, err := s.txn(ctx, cmps, then, els)
	if err != nil {
		for i := range learned {
			learned[i] = func(o *own) { o.mod = 0 }
		}
		return nil, err
	}
	if !resp.Succeeded {
		now := time.Now()
		for i, r := range reqs {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			busy := &guard.BusyError{Name: r.Name}
			if c, err := s.callerOf(kvs[0]); err == nil {
				busy.Remaining = c.staysFor(now)
			}
			return nil, busy
		}
		return nil, &guard.BusyError{Name: reqs[0].Name} // freed in between
	}
	fences := make([]uint64, len(reqs))
	for i, r := range reqs {
		kvs := resp.Responses[len(reqs)+i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil, fmt.Errorf("%w: no key after taking %q", ErrUnexpectedReply, r.Name)
		}
		kv, c, rec, ttl := kvs[0], classes[i], recs[i], r.TTL
		fences[i] = uint64(kv.CreateRevision)
		learned[i] = func(o *own) {
			o.state, o.rev, o.mod, o.class, o.rec = ownHeld, kv.CreateRevision, kv.ModRevision, c, rec
			o.lasts(start, ttl)
		}
	}
	return fences, nil
}
