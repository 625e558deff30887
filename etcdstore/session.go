package etcdstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Store's session: the etcd leases its keys live on, and the goroutine that keeps them
// alive.
//
// etcd leases count whole seconds, cost a request to grant, and expire only as a whole. So a
// Store does not grant one per lock: it keeps one lease per class of keys — what the key is
// (a holder's, a waiter's, a MinHold window's) and its guard TTL rounded up to whole seconds
// — and puts every key of that class on it, so that taking a lock is one transaction, and
// renewing a thousand is a look at one lease. The lease of class c seconds is granted with a
// margin, c + max(1, ⌈c/10⌉) seconds (or the server's minimum, if higher), and kept alive by
// the session long before it could run out: whenever a key is put on it, it still has at
// least the key's TTL to live (the Store sends a keep-alive first if not). The session keeps a
// lease alive while any of its keys is the Store's, or one was put on it within idleClass.
//
// A key still ends when its own TTL does: the Store's janitor (janitor.go) deletes it then,
// as the server would delete a key whose lease ran out. The lease is what ends the keys of a
// process that died, hangs or is cut off from the cluster: nobody keeps it alive then, and
// etcd deletes them all when it runs out — at most c plus the margin after the last keep-alive
// (a leader change extends every lease by an election timeout more).

// leaseKind tells apart the leases of keys whose lives are told apart: a holder's key is
// confirmed by finding it on its class's hold lease, and must not be mistaken for a waiter's
// or a kept one.
type leaseKind uint8

const (
	holdLease leaseKind = iota // holders' keys
	waitLease                  // waiters' keys: their places in the queue
	keepLease                  // keys kept for the rest of a MinHold window
)

// classKey names a class of keys.
type classKey struct {
	kind leaseKind
	secs int64 // the guard TTL, rounded up to whole seconds
}

// idleClass is how long a class's lease is kept alive after the last key was put on it, when
// the Store holds none of its keys.
const idleClass = time.Minute

// retryRenew is how soon the session tries again to keep a lease alive after a failure.
const retryRenew = 200 * time.Millisecond

// leaseSlack is how much longer than a key's TTL a lease must have left, by the Store's last
// confirmation, when the key is put on it: it covers the time between the check and the
// request.
const leaseSlack = 250 * time.Millisecond

// class is one lease of the session.
type class struct {
	key classKey

	// Fields below are protected by session.mu.
	id      clientv3.LeaseID // 0: none granted, or it ran out
	granted time.Duration    // its TTL
	good    time.Time        // it lives at least until then: the last confirmed keep-alive's send time + TTL
	sent    time.Time        // when the last keep-alive (or the grant) was sent
	used    time.Time        // when a key was last put on it
	next    time.Time        // when the session keeps it alive next
	keys    int              // the Store's keys on it
	// renewing is closed when a grant or keep-alive that is out answers; nil when none is.
	renewing chan struct{}
}

// session keeps a Store's leases.
type session struct {
	s *Store

	mu      sync.Mutex // protects classes and the fields of each class
	classes map[classKey]*class
	wake    chan struct{} // nudges the loop: a class was added
	stop    chan struct{} // closed by close
	done    chan struct{} // closed when the loop returns
	started bool
}

func newSession(s *Store) *session {
	return &session{s: s, classes: make(map[classKey]*class), wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// classOf returns the class of a key of kind with a TTL of ttl.
func classOf(kind leaseKind, ttl time.Duration) classKey {
	return classKey{kind: kind, secs: max(int64((ttl+time.Second-1)/time.Second), 1)}
}

// leaseFor returns a lease that lives at least ttl from now, for a key of kind, and its class.
// It grants the class's lease the first time (one more request) and keeps it alive first when
// the session could not keep it fresh (the server was away).
func (ss *session) leaseFor(ctx context.Context, kind leaseKind, ttl time.Duration) (*class, clientv3.LeaseID, error) {
	ck := classOf(kind, ttl)
	for {
		ss.mu.Lock()
		c := ss.classes[ck]
		if c == nil {
			c = &class{key: ck}
			ss.classes[ck] = c
			ss.startLocked()
		}
		now := time.Now()
		if c.id != 0 && !c.good.Before(now.Add(ttl+leaseSlack)) {
			c.used = now
			id := c.id
			ss.mu.Unlock()
			return c, id, nil
		}
		if wait := c.renewing; wait != nil {
			ss.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
		c.renewing = make(chan struct{})
		ss.mu.Unlock()
		err := ss.renew(ctx, c)
		if err != nil {
			return nil, 0, err
		}
	}
}

// renew grants c's lease, or keeps it alive, and wakes whoever waits for that. c.renewing must
// have been made by the caller.
func (ss *session) renew(ctx context.Context, c *class) error {
	ss.mu.Lock()
	id, ttl := c.id, time.Duration(c.key.secs)*time.Second
	ss.mu.Unlock()
	ctx = bookkeeping(ctx)
	var sent time.Time
	var granted int64
	err := ss.s.call(ctx, true, func(ctx context.Context) error {
		sent = time.Now()
		if id != 0 {
			resp, err := ss.s.client.KeepAliveOnce(ctx, id)
			if err == nil {
				granted = resp.TTL
				return nil
			}
			if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return err
			}
			id = 0 // it ran out: grant another
		}
		margin := max(ttl/10, time.Second)
		resp, err := ss.s.client.Grant(ctx, int64((ttl+margin+time.Second-1)/time.Second))
		if err == nil {
			id, granted = resp.ID, resp.TTL
		}
		return err
	})
	ss.mu.Lock()
	defer ss.mu.Unlock()
	close(c.renewing)
	c.renewing = nil
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.id = 0
		}
		return err
	}
	if granted <= 0 {
		c.id = 0
		return rpctypes.ErrLeaseNotFound
	}
	c.id, c.granted, c.sent = id, time.Duration(granted)*time.Second, sent
	c.good = sent.Add(c.granted)
	// Kept alive again halfway through its margin: a key put on it meanwhile still finds its
	// whole TTL left.
	margin := c.granted - time.Duration(c.key.secs)*time.Second
	c.next = sent.Add(max(margin/2, 100*time.Millisecond))
	return nil
}

// confirmed records that c's lease had at least left when a request sent at sent was answered.
func (ss *session) confirmed(c *class, id clientv3.LeaseID, sent time.Time, left time.Duration) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if c.id == id && sent.Add(left).After(c.good) {
		c.good = sent.Add(left)
	}
}

// lost records that c's lease id is gone from the server.
func (ss *session) lost(c *class, id clientv3.LeaseID) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if c.id == id {
		c.id = 0
	}
}

// verify asks the server about each of the session's leases and forgets those it no longer
// has (a leader that resumed after a pause revokes the leases that ran out meanwhile), so that
// the next key put on a class gets a lease granted anew. It reports whether it forgot any.
func (ss *session) verify(ctx context.Context) bool {
	ss.mu.Lock()
	var classes []*class
	var ids []clientv3.LeaseID
	for _, c := range ss.classes {
		if c.id != 0 {
			classes, ids = append(classes, c), append(ids, c.id)
		}
	}
	ss.mu.Unlock()
	forgot := false
	for i, c := range classes {
		resp, err := ss.s.client.TimeToLive(ctx, ids[i])
		if err == nil && resp.TTL <= 0 || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			ss.lost(c, ids[i])
			forgot = true
		}
	}
	return forgot
}

// leaseIDs returns the ids of the session's leases that are granted.
func (ss *session) leaseIDs() []clientv3.LeaseID {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ids := make([]clientv3.LeaseID, 0, len(ss.classes))
	for _, c := range ss.classes {
		if c.id != 0 {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// adjust counts a key of the Store more (n = 1) or less (n = -1) on c.
func (ss *session) adjust(c *class, n int) {
	if c == nil {
		return
	}
	ss.mu.Lock()
	c.keys += n
	ss.mu.Unlock()
}

// startLocked starts the loop the first time a class is made. ss.mu must be held.
func (ss *session) startLocked() {
	if !ss.started {
		ss.started = true
		go ss.loop()
	}
	select {
	case ss.wake <- struct{}{}:
	default:
	}
}

// loop keeps the session's leases alive until close: each one halfway through its margin, and
// again soon after a keep-alive failed. It forgets a class that has been idle for idleClass,
// and lets its lease run out.
func (ss *session) loop() {
	defer close(ss.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := ss.tick()
		timer.Reset(time.Until(next))
		select {
		case <-ss.stop:
			return
		case <-ss.wake:
		case <-timer.C:
		}
	}
}

// tick renews the leases that are due, and returns when the next one is.
func (ss *session) tick() time.Time {
	now := time.Now()
	next := now.Add(time.Second)
	var due []*class
	ss.mu.Lock()
	for k, c := range ss.classes {
		switch {
		case c.keys <= 0 && now.Sub(c.used) > idleClass && c.renewing == nil:
			delete(ss.classes, k)
		case c.renewing != nil || c.id == 0:
		case !c.next.After(now):
			c.renewing = make(chan struct{})
			due = append(due, c)
		case c.next.Before(next):
			next = c.next
		}
	}
	ss.mu.Unlock()
	if len(due) == 0 {
		return next
	}
	var wg sync.WaitGroup
	for _, c := range due {
		wg.Go(func() {
			if ss.renew(ss.s.life, c) != nil {
				// Again soon. Meanwhile a request of the Store finds the lease still good
				// enough, or keeps it alive itself.
				ss.mu.Lock()
				c.next = time.Now().Add(retryRenew)
				ss.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return time.Now()
}

// close stops the loop and waits for it. The leases are left to run out: the keys on them
// (a MinHold window, a lock the Guard did not release) live on until then.
func (ss *session) close() {
	ss.mu.Lock()
	started := ss.started
	ss.started = true // no loop starts after close
	ss.mu.Unlock()
	close(ss.stop)
	if started {
		<-ss.done
	}
}
