package etcdstore

import (
	"container/heap"
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The janitor ends the Store's own keys when their time is up, as the server would end a key
// whose lease ran out: a holder's when its lease does, a waiter's when its place in the queue
// does, a kept one's when its MinHold window does. It keeps the one table of the keys the
// Store's callers have on the server, and every request of the Store that changes a key goes
// through it (begin and end), so that the janitor never deletes a key that a request is
// changing. Its delete is owner-checked: only the key as the Store last wrote it.
//
// A request whose answer never came leaves a key the table does not know of, if it ran, or if
// it runs later: a transaction held up in a paused leader can be applied seconds after the
// client gave up on it, and after the Guard's owner-checked release of its token was answered
// "not held". Such a key sits on one of the session's leases, which the session keeps alive
// for the Store's other keys — a place at the head of a queue that nobody renews or releases,
// blocking the name for as long as the process lives. So for a while after any try of a
// request of the Store failed (doubtHorizon) — even one whose retry succeeded: the first copy
// may still land after the key was released — the janitor sweeps: it lists the keys on the session's leases
// every sweepEvery and deletes those the table does not know, each only as it was listed.
//
// Deadlines are the client's: a key's time runs from when the request that set it was sent,
// so the janitor deletes it no sooner than the server would have (and after the Guard's own
// deadline for it, which is earlier still by its drift).

// ownState is what one of the Store's keys is, as far as the Store knows.
type ownState uint8

const (
	ownUnknown ownState = iota // a request is out and none has answered yet
	ownWaiting                 // a place in the queue (the name may have been handed to it since)
	ownHeld                    // the holder
	ownKept                    // kept for the rest of a MinHold window
)

type ownKey struct{ name, token string }

// own is one key of the Store's callers.
type own struct {
	ownKey
	state   ownState
	rev     int64     // its create revision; 0: not known
	mod     int64     // the revision the Store last wrote it at; 0: not known
	class   *class    // the lease it was last put on
	rec     record    // the record the Store last wrote in it; kind 0: not known
	expires time.Time // when the janitor deletes it
	setAt   time.Time // when the request that set expires was sent
	busy    int       // requests of the Store about it that are out
	gen     uint64    // which expiry of it the heap entries are for
	known   bool      // in the table
}

// lasts records that a request sent at start set the key's life to d: it ends at start + d,
// unless a request sent later set it already. A renewal sent while another is out (a hedge)
// may be answered first; the one sent earlier, answered last, must not take the end back.
func (o *own) lasts(start time.Time, d time.Duration) {
	if !start.Before(o.setAt) {
		o.expires, o.setAt = start.Add(d), start
	}
}

// janitor keeps the table of the Store's keys and deletes each when its time is up.
type janitor struct {
	s *Store

	mu      sync.Mutex // protects keys, due, started and the fields of every own
	keys    map[ownKey]*own
	due     expiries
	started bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	deletes sync.WaitGroup

	// doubtAt is when a request of the Store last failed (it may have run, or run later);
	// sweeping is set while the sweeper runs. Both are protected by mu.
	doubtAt  time.Time
	sweeping bool
	closed   bool
}

// How long and how often the janitor sweeps the session's leases after a request failed.
const (
	doubtHorizon = 2 * time.Minute
	sweepEvery   = 2 * time.Second
)

func newJanitor(s *Store) *janitor {
	return &janitor{s: s, keys: make(map[ownKey]*own), wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// begin returns the table's entry for token's key of name, made when there is none, and
// counts one more request out about it. Every begin is followed by one end.
func (j *janitor) begin(name, token string) *own {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := ownKey{name, token}
	o := j.keys[k]
	if o == nil {
		o = &own{ownKey: k, known: true}
		j.keys[k] = o
	}
	o.busy++
	return o
}

// snapshot returns a copy of o's fields, read under the table's lock.
func (j *janitor) snapshot(o *own) own {
	j.mu.Lock()
	defer j.mu.Unlock()
	return *o
}

// end counts o's request as answered and applies what it learned: update, when not nil,
// changes o's fields (state, revisions, class, expiry). A key whose state is ownUnknown once
// no request about it is out leaves the table: the Store knows of no key of it on the server.
func (j *janitor) end(o *own, update func(o *own)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	o.busy--
	old := o.class
	if update != nil {
		update(o)
	}
	if o.state == ownUnknown {
		o.class = nil
	}
	if o.class != old {
		j.s.session.adjust(old, -1)
		j.s.session.adjust(o.class, 1)
	}
	if o.state == ownUnknown && o.busy == 0 && o.known {
		delete(j.keys, o.ownKey)
		o.known = false
	}
	j.scheduleLocked(o)
}

// scheduleLocked puts o's expiry in the heap. j.mu must be held.
func (j *janitor) scheduleLocked(o *own) {
	if !o.known || o.busy > 0 || o.state == ownUnknown {
		return
	}
	o.gen++
	heap.Push(&j.due, expiry{at: o.expires, o: o, gen: o.gen})
	if !j.started {
		j.started = true
		go j.loop()
	}
	if j.due[0].o == o {
		select {
		case j.wake <- struct{}{}:
		default:
		}
	}
}

// loop deletes keys as their time comes, until close.
func (j *janitor) loop() {
	defer close(j.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		for _, o := range j.expired() {
			j.deletes.Go(func() { j.expire(o) })
		}
		j.mu.Lock()
		wait := time.Hour
		if len(j.due) > 0 {
			wait = time.Until(j.due[0].at)
		}
		j.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-j.stop:
			return
		case <-j.wake:
		case <-timer.C:
		}
	}
}

// expired takes the keys whose time is up out of the heap and marks each busy.
func (j *janitor) expired() []*own {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	var out []*own
	for len(j.due) > 0 && !j.due[0].at.After(now) {
		e := heap.Pop(&j.due).(expiry)
		if o := e.o; o.known && o.gen == e.gen && o.busy == 0 {
			o.busy++
			out = append(out, o)
		}
	}
	return out
}

// retryExpire is how soon the janitor tries again to delete a key after a failure.
const retryExpire = time.Second

// expire deletes o's key if it is still as the Store last wrote it.
func (j *janitor) expire(o *own) {
	snap := j.snapshot(o)
	key := j.s.key(o.name, o.token)
	var cmp clientv3.Cmp
	switch {
	case snap.mod != 0:
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", snap.mod)
	case snap.rev != 0:
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", snap.rev)
	default:
		cmp = clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	}
	_, err := j.s.txn(j.s.life, []clientv3.Cmp{cmp}, []clientv3.Op{clientv3.OpDelete(key)}, nil)
	j.end(o, func(o *own) {
		if err != nil {
			o.expires = time.Now().Add(retryExpire)
			return
		}
		o.state = ownUnknown
	})
}

// doubt records that a request of the Store failed: a key it wrote may be on the server, or
// land there later, unknown to the table. It starts the sweeper when it is not running.
func (j *janitor) doubt() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.doubtAt = time.Now()
	if j.sweeping || j.closed {
		return
	}
	j.sweeping = true
	j.deletes.Go(j.sweeper)
}

// sweeper sweeps every sweepEvery until doubtHorizon has passed since the last doubt, or
// close.
func (j *janitor) sweeper() {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C:
		}
		j.sweep()
		j.mu.Lock()
		if time.Since(j.doubtAt) > doubtHorizon {
			j.sweeping = false
			j.mu.Unlock()
			return
		}
		j.mu.Unlock()
	}
}

// sweep deletes the keys on the session's leases that the table does not know: keys of
// requests whose answers never came. Each is deleted only as it was read, so that a request
// about it that is out wins.
func (j *janitor) sweep() {
	s := j.s
	ctx, cancel := context.WithTimeout(s.life, s.requestTimeout)
	defer cancel()
	for _, id := range s.session.leaseIDs() {
		resp, err := s.client.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
		if err != nil {
			continue
		}
		for _, k := range resp.Keys {
			name, token, ok := s.split(string(k))
			if !ok || j.knows(name, token) {
				continue
			}
			got, err := s.client.Get(ctx, string(k))
			if err != nil || len(got.Kvs) != 1 || clientv3.LeaseID(got.Kvs[0].Lease) != id || j.knows(name, token) {
				continue
			}
			// As read: a request that began since and wrote it changed its revision.
			_, _ = s.client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(k)), "=", got.Kvs[0].ModRevision)).
				Then(clientv3.OpDelete(string(k))).Commit()
		}
	}
}

// knows reports whether the table has token's key of name, or a request about it is out.
func (j *janitor) knows(name, token string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.keys[ownKey{name, token}]
	return ok
}

// close stops the loop and the sweeper and waits for them and for the deletes that are out.
func (j *janitor) close() {
	j.mu.Lock()
	started := j.started
	j.started = true
	j.closed = true
	j.mu.Unlock()
	close(j.stop)
	if started {
		<-j.done
	}
	j.deletes.Wait()
}

// expiry is one entry of the janitor's heap.
type expiry struct {
	at  time.Time
	o   *own
	gen uint64
}

// expiries is a min-heap of expiries by time.
type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, k int) bool { return h[i].at.Before(h[k].at) }
func (h expiries) Swap(i, k int)      { h[i], h[k] = h[k], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
