package etcdstore

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/guardlock/guard"
)

// Subscribe opens a subscription that watches the names it is asked to with etcd watches (one
// per name, all on the client's one watch stream) and calls notify when a name's holder
// changes: with Next set when the name passed to its next key — a waiter's, whose Guard then
// holds the lock without another request — or without when the name became free or is kept
// for the rest of a MinHold window. A notice's Token is the token of the key that went,
// whatever deleted it (its holder, the janitor at the end of its lease, an operator): a Guard
// skips only a notice for a release it made itself. When a watch fails (the member it was on
// went away, or lost its leader) the subscription reads the name again and watches on from
// there, and then sends a notice without a token: a change may have gone by. Subscribe
// never fails; it returns an error to satisfy guard.Notifier.
func (s *Store) Subscribe(notify func(guard.Notice)) (guard.Subscription, error) {
	if notify == nil {
		notify = func(guard.Notice) {}
	}
	sub := &subscription{s: s, notify: notify, names: make(map[string]*watch)}
	sub.ctx, sub.cancel = context.WithCancel(s.life)
	return sub, nil
}

// subscription is the guard.Subscription of a Store.
type subscription struct {
	s      *Store
	notify func(guard.Notice)
	ctx    context.Context // ends with Close (or the Store's Close)
	cancel context.CancelFunc

	mu     sync.Mutex // protects names and closed
	names  map[string]*watch
	closed bool
	wg     sync.WaitGroup // the watches' goroutines
}

// watch is the watch of one name.
type watch struct {
	refs   int
	cancel context.CancelFunc
	ready  chan struct{} // closed once etcd confirmed the first watch
}

// Watch starts watching name (or counts one more Watch of it) and returns once etcd has
// confirmed the watch, so that a change after Watch returns is reported. It returns
// ErrSubscriptionClosed after Close, or an error matching ctx.Err() when ctx ends first (the
// subscription keeps trying until Unwatch).
func (sub *subscription) Watch(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sub.mu.Lock()
	if sub.closed {
		sub.mu.Unlock()
		return ErrSubscriptionClosed
	}
	w := sub.names[name]
	if w == nil {
		wctx, cancel := context.WithCancel(sub.ctx)
		w = &watch{cancel: cancel, ready: make(chan struct{})}
		sub.names[name] = w
		sub.wg.Go(func() { sub.run(wctx, name, w) })
	}
	w.refs++
	sub.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		sub.Unwatch(name)
		return ctx.Err()
	case <-sub.ctx.Done():
		sub.Unwatch(name)
		return ErrSubscriptionClosed
	}
}

// Unwatch undoes one Watch of name; the name's watch ends with the last.
func (sub *subscription) Unwatch(name string) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	w := sub.names[name]
	if w == nil {
		return
	}
	if w.refs--; w.refs <= 0 {
		w.cancel()
		delete(sub.names, name)
	}
}

// Close ends the subscription and waits for its goroutines. Pending Watch calls return
// ErrSubscriptionClosed.
func (sub *subscription) Close() error {
	sub.mu.Lock()
	sub.closed = true
	sub.mu.Unlock()
	sub.cancel()
	sub.wg.Wait()
	return nil
}

// Pauses between two tries to watch a name, when one failed.
const (
	rewatchMin = 10 * time.Millisecond
	rewatchMax = time.Second
)

// run watches name until ctx ends, watching again whenever a watch fails.
func (sub *subscription) run(ctx context.Context, name string, w *watch) {
	n := &nameState{sub: sub, name: name}
	pause := rewatchMin
	for ctx.Err() == nil {
		confirmed := sub.follow(ctx, n, w)
		if confirmed {
			pause = rewatchMin
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pause = min(2*pause, rewatchMax)
	}
}

// follow reads name's keys, watches them from the revision after, and reports the changes of
// its holder, until the watch fails or ctx ends. It reports whether etcd confirmed the watch.
func (sub *subscription) follow(ctx context.Context, n *nameState, w *watch) bool {
	s := sub.s
	start, end := s.nameRange(n.name)
	rctx, cancel := s.bound(ctx)
	resp, err := s.client.Get(rctx, start, clientv3.WithRange(end),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	cancel()
	if err != nil {
		return false
	}
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	wch := s.client.Watch(wctx, start, clientv3.WithRange(end), clientv3.WithRev(resp.Header.Revision+1),
		clientv3.WithCreatedNotify())
	created, ok := <-wch
	if !ok || !created.Created || created.Err() != nil {
		return false
	}
	n.reset(resp.Kvs)
	select {
	case <-w.ready:
		// Watching again: a change may have gone by while no watch was on.
		sub.notify(guard.Notice{Name: n.name})
	default:
		close(w.ready)
	}
	for wr := range wch {
		if wr.Err() != nil || wr.Canceled {
			return true
		}
		for _, ev := range wr.Events {
			n.apply(ev)
		}
	}
	return true
}

// nameState is what a subscription knows of one name's keys: the callers, in create-revision
// order, the first being the holder.
type nameState struct {
	sub     *subscription
	name    string
	callers []caller
}

// reset starts over from a read of the name's keys, in create-revision order.
func (n *nameState) reset(kvs []*mvccpb.KeyValue) {
	n.callers = n.callers[:0]
	for _, kv := range kvs {
		if c, err := n.sub.s.callerOf(kv); err == nil {
			n.callers = append(n.callers, c)
		}
	}
}

// apply applies one event to the name's keys, and reports a change of its holders: one notice
// per key that holds the name now and did not before — several shared ones at once, when a
// writer goes — or, when nobody holds it now, that it may be free.
func (n *nameState) apply(ev *clientv3.Event) {
	var before *caller
	if len(n.callers) > 0 {
		c := n.callers[0]
		before = &c
	}
	wasHolding := slices.Clone(n.callers[:holding(n.callers)])
	key := ev.Kv.Key
	i := slices.IndexFunc(n.callers, func(c caller) bool { return c.key == string(key) })
	switch {
	case ev.Type == clientv3.EventTypeDelete:
		if i >= 0 {
			n.callers = slices.Delete(n.callers, i, i+1)
		}
	case i >= 0:
		if c, err := n.sub.s.callerOf(ev.Kv); err == nil {
			n.callers[i] = c
		}
	default:
		c, err := n.sub.s.callerOf(ev.Kv)
		if err != nil {
			return
		}
		// A key is new with the highest create revision so far, but keep the order whatever
		// comes.
		at, _ := slices.BinarySearchFunc(n.callers, c.create, func(x caller, rev int64) int {
			return cmp.Compare(x.create, rev)
		})
		n.callers = slices.Insert(n.callers, at, c)
	}
	if before == nil {
		return // the name was free and someone took it: nobody waited for that
	}
	if len(n.callers) == 0 {
		n.sub.notify(guard.Notice{Name: n.name, Token: released(ev, before)})
		return
	}
	if i < 0 && ev.Type != clientv3.EventTypeDelete {
		// A new key: a caller took the name beside the holders, by its own request, or
		// queued. (A key that holds the moment it queues, as others went since its
		// request read the keys, is found by its next request.)
		return
	}
	handed := false
	for _, after := range n.callers[:holding(n.callers)] {
		if !slices.ContainsFunc(wasHolding, func(c caller) bool { return c.key == after.key }) {
			handed = true
			n.sub.notify(guard.Notice{Name: n.name, Token: released(ev, before), Next: after.token,
				Fence: uint64(after.create), Lease: after.rec.handed(), Attempt: after.rec.attempt})
		}
	}
	switch {
	case handed:
	case ev.Type == clientv3.EventTypeDelete && i >= 0 && slices.ContainsFunc(wasHolding, func(c caller) bool { return c.key == string(key) }):
		// A shared holder went and nobody came in: a waiter with a limit of its own may fit.
		n.sub.notify(guard.Notice{Name: n.name, Token: released(ev, before)})
	case ev.Type != clientv3.EventTypeDelete && i >= 0 && n.callers[i].rec.kind == kindKept && wasHolding != nil &&
		slices.ContainsFunc(wasHolding, func(c caller) bool { return c.key == string(key) && c.rec.kind != kindKept }):
		// Kept for the rest of a MinHold window: waiters ask, to learn when it ends.
		n.sub.notify(guard.Notice{Name: n.name, Token: released(ev, before)})
	}
}

// released returns the token of the holder whose key ev deleted or kept, when ev did, for a
// notice's Token: the Guard that released it woke a waiter of its own already. A key that
// changed otherwise — a waiter that left, a holder that went while another stays — says
// nothing of who released: the first holder's token, as before, when the first key went.
func released(ev *clientv3.Event, before *caller) string {
	if string(ev.Kv.Key) == before.key {
		return before.token
	}
	if _, token, ok := strings.Cut(string(ev.Kv.Key), "\x00"); ok {
		return token
	}
	return ""
}
