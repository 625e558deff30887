package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/guardlock/guard"
)

// Inspect reports name's holder — its first key, or of shared holders the newest — how many
// hold it, and how many callers wait behind them: one read of the name's keys. A free name has
// no key, and so no fence to report (Fence 0). The holder's AcquiredAt and Remaining come from
// the record its last request wrote, by its own clock: a lock renewed since reports its TTL as
// Remaining, what it has left at most (a renewal writes no record).
func (s *Store) Inspect(ctx context.Context, name string) (guard.LockInfo, error) {
	resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{s.all(name)}, nil)
	if err != nil {
		return guard.LockInfo{}, err
	}
	callers, err := s.callersOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return guard.LockInfo{}, err
	}
	if len(callers) == 0 {
		return guard.LockInfo{Name: name}, nil
	}
	return newest(name, callers, time.Now()), nil
}

// newest is what callers, the keys of name in create-revision order, say of the lock: its
// newest holder, how many hold it and how many wait.
func newest(name string, callers []caller, now time.Time) guard.LockInfo {
	n := holding(callers)
	info := callers[n-1].info(name, now)
	info.Holders, info.Waiting = n, len(callers)-n
	return info
}

// info is what c, a name's holder, says of the lock.
func (c caller) info(name string, now time.Time) guard.LockInfo {
	return guard.LockInfo{
		Name: name, Held: true, Kept: c.rec.kind == kindKept, Fence: uint64(c.create),
		Instance: c.rec.instance, Label: c.rec.label, Value: c.rec.value, Shared: c.rec.shared, Holders: 1,
		AcquiredAt: c.rec.at, Remaining: c.staysFor(now),
	}
}

// List returns the holders of the names that start with prefix — one entry each, several for
// a name held shared — in name and fence order, after the cursor: the last name of the
// previous page, or, when a name's holders did not fit in one page, that name and the last
// fence listed after a NUL. It reads the keys under the prefix, a name's holders being its
// first keys; a page ends before a name whose holders do not all fit in it, unless they are
// the page's first.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]guard.LockInfo, string, error) {
	limit = max(limit, 1)
	from := s.prefix + prefix
	after, fence, inside := strings.Cut(cursor, "\x00")
	var skip uint64
	switch {
	case inside:
		var err error
		if skip, err = strconv.ParseUint(fence, 10, 64); err != nil {
			return nil, "", fmt.Errorf("etcdstore: bad List cursor %q", cursor)
		}
		from = s.prefix + after + "\x00" // the rest of the name's holders
	case cursor != "":
		from = s.prefix + cursor + "\x01" // after every key of the name cursor
	}
	end := clientv3.GetPrefixRangeEnd(s.prefix + prefix)
	chunk := int64(4*limit + 16)
	var page []guard.LockInfo
	// add adds name's holders to the page, and returns the next cursor when the page is full.
	add := func(name string, callers []caller, now time.Time) (string, bool) {
		holders := each(name, callers, now)
		if inside && name == after {
			holders = slices.DeleteFunc(holders, func(h guard.LockInfo) bool { return h.Fence <= skip })
		}
		switch {
		case len(page) > 0 && len(page)+len(holders) > limit:
			return page[len(page)-1].Name, true
		case len(holders) > limit:
			page = holders[:limit]
			return name + "\x00" + strconv.FormatUint(page[limit-1].Fence, 10), true
		}
		page = append(page, holders...)
		from = s.prefix + name + "\x01"
		return "", false
	}
	for len(page) < limit {
		resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{clientv3.OpGet(from, clientv3.WithRange(end),
			clientv3.WithLimit(chunk), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))}, nil)
		if err != nil {
			return nil, "", err
		}
		rr := resp.Responses[0].GetResponseRange()
		now := time.Now()
		groups := groupByName(s, rr.Kvs)
		if rr.More && len(groups) > 0 {
			// The last name's keys may go on past this read: read them alone.
			last := groups[len(groups)-1]
			groups = groups[:len(groups)-1]
			if len(groups) == 0 {
				resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{s.all(last.name)}, nil)
				if err != nil {
					return nil, "", err
				}
				callers, err := s.callersOf(resp.Responses[0].GetResponseRange().Kvs)
				if err != nil {
					return nil, "", err
				}
				if next, full := add(last.name, callers, time.Now()); full {
					return page, next, nil
				}
				from = s.prefix + last.name + "\x01"
				continue
			}
		}
		for _, g := range groups {
			if next, full := add(g.name, g.callers, now); full {
				return page, next, nil
			}
		}
		if !rr.More {
			return page, "", nil
		}
	}
	return page, page[len(page)-1].Name, nil
}

// each is what callers, the keys of name in create-revision order, say of each holder.
func each(name string, callers []caller, now time.Time) []guard.LockInfo {
	n := holding(callers)
	out := make([]guard.LockInfo, n)
	for i, c := range callers[:n] {
		out[i] = c.info(name, now)
		out[i].Holders, out[i].Waiting = n, len(callers)-n
	}
	return out
}

// group is the keys of one name in a read, in create-revision order.
type group struct {
	name    string
	callers []caller
}

// groupByName groups kvs, which are in key order, by name; keys that are not the Store's are
// skipped.
func groupByName(s *Store, kvs []*mvccpb.KeyValue) []group {
	var out []group
	for _, kv := range kvs {
		name, _, ok := s.split(string(kv.Key))
		if !ok {
			continue
		}
		c, err := s.callerOf(kv)
		if err != nil {
			continue
		}
		if len(out) == 0 || out[len(out)-1].name != name {
			out = append(out, group{name: name})
		}
		g := &out[len(out)-1]
		g.callers = append(g.callers, c)
	}
	for _, g := range out {
		slices.SortFunc(g.callers, func(a, b caller) int { return cmp.Compare(a.create, b.create) })
	}
	return out
}

// forceTries bounds how often ForceRelease reads the holder again when it changed between its
// read and its delete.
const forceTries = 5

// ForceRelease deletes the key of name's holder whose fence (its create revision) is fence,
// or of every holder for fence 0: a read, then a transaction that deletes the keys only while
// they are the ones read (their create revisions unchanged). The next keys of the name hold it
// from then on, and their Guards are told by their watch. It returns guard.ErrNotHeld when name
// is free, and a *guard.ChangedHandsError when no holder has fence.
func (s *Store) ForceRelease(ctx context.Context, name string, fence uint64) error {
	for range forceTries {
		resp, err := s.txnIdempotent(ctx, nil, []clientv3.Op{s.all(name)}, nil)
		if err != nil {
			return err
		}
		callers, err := s.callersOf(resp.Responses[0].GetResponseRange().Kvs)
		if err != nil {
			return err
		}
		if len(callers) == 0 {
			return guard.ErrNotHeld
		}
		holders := callers[:holding(callers)]
		if fence != 0 {
			i := slices.IndexFunc(holders, func(c caller) bool { return uint64(c.create) == fence })
			if i < 0 {
				return &guard.ChangedHandsError{Name: name, Fence: fence, Found: uint64(holders[len(holders)-1].create)}
			}
			holders = holders[i : i+1]
		}
		var cmps []clientv3.Cmp
		var dels []clientv3.Op
		for _, h := range holders {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.create))
			dels = append(dels, clientv3.OpDelete(h.key))
		}
		resp, err = s.txn(ctx, cmps, dels, nil)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("%w: %q changed hands %d times while it was being released", ErrUnexpectedReply, name, forceTries)
}
